"""Candidates tried first: every speed feature on, and a warm start from earlier studies (real
SQLite, real tuner runs with the synthetic backend)."""

from pathlib import Path
from typing import Any

import optuna
import pytest
from conftest import SYNTHETIC, matmul_model, save, synthetic_config, tune
from optuna.trial import TrialState

from gpt_optuna.backends.onnxruntime.backend import OnnxRuntimeBackend
from gpt_optuna.backends.onnxruntime.knobs import discover_knobs
from gpt_optuna.backends.onnxruntime.settings import CPU, CUDA
from gpt_optuna.core.space import Space
from gpt_optuna.graph.model_profile import ModelProfile, profile_of
from gpt_optuna.graph.precision import precision_knobs
from gpt_optuna.search.config import TuneConfig
from gpt_optuna.search.seeds import WARM_PER_STUDY, WarmStart, speed_seed
from gpt_optuna.study.record import FINGERPRINT_ATTR, StudyRecord
from gpt_optuna.usecases.tune import first_candidates

LEVELS = ["ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_ALL"]
ORT = OnnxRuntimeBackend()
PROFILE = ModelProfile({"Conv": 1}, 1000)
UNLIKE = ModelProfile({"Conv": 1, "MatMul": 9}, 1000)
"""Model similarity 1/sqrt(10) = 0.32 to :data:`PROFILE`: one candidate of three at first."""


def gpu_space() -> Space:
    import onnx
    from conftest import small_cnn

    precision = precision_knobs(onnx.load_from_string(small_cnn().SerializeToString()), ("fp32", "fp16"))
    return Space(precision + discover_knobs([CUDA, CPU], LEVELS, 4))


def test_the_speed_seed_turns_on_every_speed_feature_the_space_searches() -> None:
    seed = speed_seed(gpu_space(), ORT)
    assert seed is not None
    assert seed["precision"] == "fp16" and seed["provider"] == CUDA
    assert seed["cuda.use_tf32"] and seed["cuda.prefer_nhwc"] and seed["cuda.enable_cuda_graph"]
    assert seed["graph_optimization_level"] == "ORT_ENABLE_ALL"
    restricted = gpu_space().with_overrides({"cuda.enable_cuda_graph": "default", "precision": "fp32"})
    assert not restricted.fitted(speed_seed(restricted, ORT) or {}).get("cuda.enable_cuda_graph")
    cpu = Space(discover_knobs([CPU], LEVELS, 4))
    assert speed_seed(cpu, ORT) is None  # on the CPU, every speed feature is the default already


def test_no_seeds_leaves_only_the_given_candidates(tmp_path: Path) -> None:
    model = tmp_path / "m.onnx"
    model.write_bytes(b"")
    storage = optuna.storages.InMemoryStorage()
    config = TuneConfig(model=model, no_seeds=True, seeds=[({"precision": "fp16"}, "the record")])
    seeds, warm = first_candidates(config, gpu_space(), PROFILE, ORT, storage, "cpu", [])
    assert [attrs for _, attrs in seeds] == [{"seeded": "the record"}] and warm.candidates == []
    config = TuneConfig(model=model)
    seeds, _ = first_candidates(config, gpu_space(), PROFILE, ORT, storage, "cpu", [])
    assert [attrs for _, attrs in seeds] == [{"seeded": "every speed feature on"}]


@pytest.mark.slow
def test_a_warm_start_queues_the_best_distinct_configurations_of_earlier_studies(
    cnn_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = synthetic_config(tmp_path, 'mode = ["ok"]')
    url = "sqlite:///studies/shared.db"
    base = [str(cnn_path), "--backend", SYNTHETIC, "--config", str(config), "--storage", url, "--confirm-top", "0"]
    assert tune(*base, "--study-name", "first", "--n-trials", "8", "--seed", "1") == 0
    first = optuna.load_study(study_name="first", storage=url)
    best = sorted((t for t in first.get_trials() if t.values), key=lambda t: t.values[0])
    capsys.readouterr()
    assert tune(*base, "--study-name", "second", "--n-trials", "6", "--warm-start", "first") == 0
    out, err = capsys.readouterr()
    second = optuna.load_study(study_name="second", storage=url).get_trials()
    warm = [t for t in second if "warm_start_from" in t.user_attrs]
    # the three best are offered, queued one at a time right after the baseline; one that does not beat the
    # baseline here by what its gain there asks for (timing on this host) stops the rest, and the run says so
    assert 1 <= len(warm) <= WARM_PER_STUDY
    assert [t.number for t in warm] == list(range(1, len(warm) + 1))
    assert len(warm) == WARM_PER_STUDY or "not tried" in err
    distinct = []
    for trial in best:
        if trial.params not in distinct and trial.params != second[0].params:
            distinct.append(trial.params)
    assert [t.params for t in warm] == distinct[: len(warm)]
    assert [t.user_attrs["warm_start_from"].partition(":")[0] for t in warm] == ["first"] * len(warm)
    assert "warm start: first (model similarity 1.00): 3 candidates" in err  # the same model
    assert f"warm start: {len(warm)} candidate{'s' if len(warm) > 1 else ''} from first" in out
    assert StudyRecord.of(optuna.load_study(study_name="first", storage=url)).model_profile == profile_of(cnn_path)
    # auto: every study of this backend measured on this device, here both earlier ones
    assert tune(*base, "--study-name", "third", "--n-trials", "4", "--warm-start", "auto") == 0
    third = [
        t for t in optuna.load_study(study_name="third", storage=url).get_trials() if "warm_start_from" in t.user_attrs
    ]
    assert {t.user_attrs["warm_start_from"].partition(":")[0] for t in third} <= {"first", "second"}
    # two studies offer six at most, queued one at a time right after the baseline: with 4 trials, three of
    # them and none left waiting; none after one of its study's lost to the baseline (the queue's own tests)
    assert [t.number for t in third] == list(range(1, len(third) + 1)) and 1 <= len(third) <= 3
    assert all(t.state is not TrialState.WAITING for t in optuna.load_study(study_name="third", storage=url).trials)
    capsys.readouterr()
    assert tune(*base, "--study-name", "fourth", "--n-trials", "2", "--warm-start", "nothing") == 2
    assert "--warm-start: no study 'nothing' in this storage; studies there: first, second, third" in (
        capsys.readouterr().err
    )


def earlier_studies(studies: dict[str, tuple[ModelProfile | None, float, list[tuple[int, float]]]]) -> Any:
    """A storage holding ``studies``: per study its model's profile (None: not recorded), its
    baseline latency, then (a, latency) of its trials."""
    from optuna.distributions import CategoricalDistribution

    distributions = {"a": CategoricalDistribution(tuple(range(8))), "b": CategoricalDistribution(("x", "y"))}
    storage = optuna.storages.InMemoryStorage()
    for name, (profile, base, trials) in studies.items():
        study = optuna.create_study(study_name=name, storage=storage)
        if profile is not None:
            study.set_user_attr(FINGERPRINT_ATTR, {"model_profile": profile.to_record()})
        for a, ms in [(0, base), *trials]:
            params = {"a": a, "b": "x"}
            user_attrs = {"baseline": ms == base and a == 0, "latency": {"median_ms": ms}}
            study.add_trial(
                optuna.trial.create_trial(params=params, distributions=distributions, value=ms, user_attrs=user_attrs)
            )
    return storage


def run_warm_start(
    storage: optuna.storages.BaseStorage, warm: WarmStart, latencies: list[float]
) -> tuple[list[str], list[str]]:
    """A new study of ``storage`` with a 10 ms baseline, its warm start's candidates run through
    the queue as they come, measuring ``latencies`` in turn: the sources tried, and the notes."""
    from gpt_optuna.search.transfer import TransferQueue
    from gpt_optuna.study.trial_record import WARM_START_ATTR

    study = optuna.create_study(storage=storage, study_name="new")
    distributions = {k.name: optuna.distributions.CategoricalDistribution(k.choices) for k in small_space().knobs}
    study.add_trial(
        optuna.trial.create_trial(
            params={"a": 0, "b": "x"},
            distributions=distributions,
            value=10.0,
            user_attrs={"baseline": True, "latency": {"median_ms": 10.0}},
        )
    )
    notes: list[str] = []
    queue = TransferQueue.of(warm, note=notes.append)
    tried = []
    for ms in latencies:
        queue.update(study)
        if not study.get_trials(states=(TrialState.WAITING,)):
            break
        trial = study.ask(distributions)
        trial.set_user_attr("latency", {"median_ms": ms})
        study.tell(trial, ms)
        tried.append(study.trials[-1].user_attrs[WARM_START_ATTR])
    return tried, notes


def small_space() -> Space:
    from gpt_optuna.core.space import Knob

    return Space([Knob("a", tuple(range(8)), 0), Knob("b", ("x", "y"), "x")])


def test_a_warm_start_from_many_studies_takes_what_most_agree_on_then_the_largest_speedups() -> None:
    from gpt_optuna.search.seeds import WARM_LIMIT, warm_start

    alike = [ModelProfile({"Conv": n}, 1000) for n in (1, 2, 3, 4)]  # four models, each as alike as can be
    storage = earlier_studies(
        {
            "s0": (alike[0], 10.0, [(1, 5.0), (2, 6.0), (3, 7.0)]),
            "s1": (alike[1], 10.0, [(1, 4.0), (4, 4.5), (5, 9.0), (6, 9.9)]),  # its fourth best is not offered
            "s2": (alike[2], 16.0, [(1, 8.0), (4, 8.5), (6, 7.6)]),
            "s3": (alike[3], 10.0, [(7, 1.0), (0, 0.5)]),  # its very best is the new space's baseline
        }
    )
    warm = warm_start(storage, "s0,s1,s2,s3", "new", "synthetic", "cpu", small_space(), PROFILE)
    assert len(warm.candidates) == WARM_LIMIT == 6 and warm.reserve == {}
    # a=1 is offered by three studies, a=4 by two; then one-study offers by speedup: 10, 2.1, 1.67, 1.43 (not 1.11)
    assert [c["a"] for c, _ in warm.candidates] == [1, 4, 7, 6, 2, 3]
    assert warm.candidates[0][1] == "s1:1" and warm.candidates[2][1] == "s3:1"  # each from where it gained most


def test_a_study_of_a_less_alike_model_offers_fewer_candidates_first_and_holds_the_rest_back() -> None:
    from gpt_optuna.search.seeds import warm_start

    storage = earlier_studies(
        {
            "unlike": (UNLIKE, 10.0, [(1, 1.0), (2, 2.0), (3, 3.0)]),  # the largest speedups
            "alike": (PROFILE, 10.0, [(4, 8.0), (5, 8.5), (6, 9.0)]),
            "unknown": (None, 10.0, [(7, 5.0), (2, 6.0)]),  # made before profiles, its model not recorded
        }
    )
    warm = warm_start(storage, "unlike,alike,unknown", "new", "synthetic", "cpu", small_space(), PROFILE)
    # all three of the alike model's first (weight 1 each), then the unknown one's best (weight 1/3), then
    # the unlike one's (0.32), though its speedup is the largest
    assert [source for _, source in warm.candidates] == ["alike:1", "alike:2", "alike:3", "unknown:1", "unlike:1"]
    assert warm.reserve == {
        "unlike": [({"a": 2, "b": "x"}, "unlike:2"), ({"a": 3, "b": "x"}, "unlike:3")],
        "unknown": [({"a": 2, "b": "x"}, "unknown:2")],
    }
    assert warm.similarity["alike"] == pytest.approx(1.0) and warm.similarity["unknown"] is None
    # to let its study give more, a candidate must gain here 1 + 0.75 x similarity x (its gain there - 1)
    assert warm.expected["alike:1"] == pytest.approx(1 + 0.75 * (10 / 8 - 1))
    assert warm.expected["unknown:1"] == pytest.approx(1 + 0.75 / 3 * (10 / 5 - 1))
    assert warm.expected["unlike:3"] == pytest.approx(1 + 0.75 * 10**-0.5 * (10 / 3 - 1))
    assert warm.describe() == (
        "unlike (model similarity 0.32): 1 candidate (2 more once one beats the baseline), "
        "alike (model similarity 1.00): 3 candidates, "
        "unknown (similarity unknown): 1 candidate (1 more once one beats the baseline)"
    )


def test_a_study_made_before_profiles_were_recorded_is_judged_by_its_model_file_while_it_is_unchanged(
    cnn_path: Path,
) -> None:
    from gpt_optuna.graph.model import file_sha256
    from gpt_optuna.search.seeds import study_similarity

    study, profile = optuna.create_study(), profile_of(cnn_path)
    study.set_user_attr(FINGERPRINT_ATTR, {"model": str(cnn_path), "model_sha256": file_sha256(cnn_path)})
    assert study_similarity(study, profile) == pytest.approx(1.0)
    assert study_similarity(study, ModelProfile({"MatMul": 1}, 1000)) == 0.0  # no operator in common
    save(matmul_model(), cnn_path)  # another model in its place: its own profile is unknown
    assert study_similarity(study, profile) is None


def test_a_configuration_two_studies_offer_counts_for_both_and_an_unlike_model_still_gives_its_best() -> None:
    from gpt_optuna.search.seeds import warm_start

    nothing_alike = ModelProfile({"MatMul": 1}, 1000)  # no operator in common with PROFILE
    storage = earlier_studies(
        {
            "A": (UNLIKE, 10.0, [(1, 2.0), (2, 3.0), (3, 4.0)]),
            "B": (nothing_alike, 10.0, [(1, 4.0), (4, 5.0)]),  # the same best as A's, a smaller speedup
        }
    )
    warm = warm_start(storage, "A,B", "new", "synthetic", "cpu", small_space(), PROFILE)
    assert warm.similarity["B"] == 0.0
    assert warm.candidates == [({"a": 1, "b": "x"}, "A:1")]
    assert warm.offered_by == {  # the held back ones by the study that holds them
        (("a", 1), ("b", "x")): ("A", "B"),
        (("a", 2), ("b", "x")): ("A",),
        (("a", 3), ("b", "x")): ("A",),
        (("a", 4), ("b", "x")): ("B",),
    }
    assert warm.describe() == (
        "A (model similarity 0.32): 1 candidate (2 more once one beats the baseline), "
        "B (model similarity 0.00): 1 candidate (1 more once one beats the baseline)"
    )
    # a=1 beats the baseline: what both held back comes next
    tried, notes = run_warm_start(storage, warm, [5.0] * 5)
    assert tried == ["A:1", "A:2", "A:3", "B:2"]
    assert notes == [
        "warm start: A:1 beat the baseline here; 2 more of A follow",
        "warm start: A:1 beat the baseline here; 1 more of B follows",
    ]


def test_resuming_a_study_made_before_models_were_profiled_records_its_profile(cnn_path: Path, tmp_path: Path) -> None:
    config = synthetic_config(tmp_path, 'mode = ["ok"]')
    base = [str(cnn_path), "--backend", SYNTHETIC, "--config", str(config), "--confirm-top", "0", "--no-seeds"]
    assert tune(*base, "--study-name", "old", "--n-trials", "2") == 0
    study = optuna.load_study(study_name="old", storage="sqlite:///studies/old.db")
    recorded = dict(study.user_attrs[FINGERPRINT_ATTR])
    del recorded["model_profile"]
    study.set_user_attr(FINGERPRINT_ATTR, recorded)
    assert StudyRecord.of(study).model_profile is None
    assert tune(*base, "--study-name", "old", "--n-trials", "3") == 0  # resumed, not refused
    study = optuna.load_study(study_name="old", storage="sqlite:///studies/old.db")
    assert StudyRecord.of(study).model_profile == profile_of(cnn_path)


def test_studies_of_one_model_give_candidates_as_one_study_and_a_loss_stops_them_all() -> None:
    from gpt_optuna.search.seeds import warm_start

    storage = earlier_studies(  # one unlike model searched three times (say, at three batch sizes)
        {
            "b1": (UNLIKE, 10.0, [(1, 2.0), (2, 4.0), (3, 5.0)]),
            "b8": (UNLIKE, 10.0, [(4, 1.0), (2, 3.0), (5, 6.0)]),
            "b64": (UNLIKE, 10.0, [(6, 2.5), (2, 5.0), (4, 6.0)]),
        }
    )
    warm = warm_start(storage, "b1,b8,b64", "new", "synthetic", "cpu", small_space(), PROFILE)
    # one source of three candidates, one at first (similarity 0.32): what all three found, then b8's a=4
    # (found by two, its best speedup 10x), then the largest speedup of the rest (b1's a=1, 5x)
    assert warm.candidates == [({"a": 2, "b": "x"}, "b8:2")]
    assert warm.reserve == {"b1": [({"a": 4, "b": "x"}, "b8:1"), ({"a": 1, "b": "x"}, "b1:1")]}
    assert warm.similarity == {"b1": pytest.approx(10**-0.5)} and warm.same_model == {"b1": ("b8", "b64")}
    assert warm.describe() == (
        "b1 (with b8, b64, the same model; model similarity 0.32): 1 candidate (2 more once one beats the baseline)"
    )
    tried, notes = run_warm_start(storage, warm, [5.0, 12.0, 5.0])  # a=2 wins, b8's a=4 loses: a=1 is not tried
    assert tried == ["b8:2", "b8:1"]
    assert notes[-1] == "warm start: b8:1 lost to the baseline here; the other 1 of b1 is not tried"
