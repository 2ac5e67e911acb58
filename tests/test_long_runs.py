"""What keeps a long search fast and honest: the space's size, a covered space ending on the trial
that covers it, a repeat that reuses a result, the trial's attrs written at once, the study's
trials folded in once, readers that take the recorded summary where it speaks for the study, and
an artifact store that keeps the engines worth keeping."""

import datetime
import errno
import json
import random
from pathlib import Path

import optuna
import pytest
from conftest import SYNTHETIC, load, synthetic_config, tune
from optuna.artifacts import FileSystemArtifactStore
from optuna.artifacts.exceptions import ArtifactNotFound
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial

from gpt_optuna.api.study import load as load_tuned
from gpt_optuna.cli import main
from gpt_optuna.core.space import Condition, Knob, Space
from gpt_optuna.results.summary_text import format_summary
from gpt_optuna.search.engines import EngineKeeper, disk_used
from gpt_optuna.search.ledger import StudyLedger, key_of
from gpt_optuna.study.storage import count_by_state, one_transaction, open_storage, set_trial_attrs
from gpt_optuna.study.summary import summarize_study
from gpt_optuna.study.summary_record import recorded_summary


def random_space(rng: random.Random) -> Space:
    knobs: list[Knob] = []
    for i in range(rng.randint(1, 6)):
        choices = tuple(range(rng.randint(1, 3)))
        condition = None
        if knobs and rng.random() < 0.6:
            parent = rng.choice(knobs)
            others = [k for k in knobs if k is not parent]
            if others and rng.random() < 0.5:
                other = rng.choice(others)
                combos = tuple((a, b) for a in parent.choices for b in other.choices if rng.random() < 0.5)
                condition = Condition((parent.name, other.name), combos)
            else:
                condition = Condition(parent.name, tuple(c for c in parent.choices if rng.random() < 0.5))
        searched = tuple(c for c in choices if rng.random() < 0.7) or None if len(choices) > 1 else None
        knobs.append(Knob(f"k{i}", choices, 0, condition=condition, searched=searched))
    return Space(knobs)


def test_the_space_counts_its_candidates_without_listing_them() -> None:
    rng = random.Random(0)
    for _ in range(300):
        space = random_space(rng)
        listed = space.every_candidate()
        assert space.size() == len(listed)
        varied = {name for name in (k.name for k in space.knobs) if len({c.get(name) for c in listed} - {None}) > 1}
        assert set(space.searched_knobs()) == varied


def test_space_prints_the_number_of_candidates(cnn_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = synthetic_config(tmp_path, 'mode = ["ok"]\ndelay_us = [0, 50]\nbuild_ms = [0]\na = [0, 1, 2]')
    assert main(["space", str(cnn_path), "--backend", SYNTHETIC, "--config", str(config)]) == 0
    assert "4 searched, 144 candidates" in capsys.readouterr().out  # 2 delays x 3 a x 8 b x 3 c


@pytest.mark.slow
def test_a_covered_space_ends_on_the_trial_that_covers_it(
    cnn_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    space = 'mode = ["ok"]\ndelay_us = [0, 50]\nbuild_ms = [0]\na = [0, 1]\nb = [0]\nc = ["x"]'
    config = synthetic_config(tmp_path, space)
    args = [str(cnn_path), "--backend", SYNTHETIC, "--config", str(config), "--seed", "0", "--no-seeds"]
    assert tune(*args, "--n-trials", "30") == 0
    trials = load("cnn-syntheticbackend").get_trials()
    assert len(trials) == 5  # the baseline (delay 200, not searched) and the 4 candidates
    assert len({tuple(sorted(t.params.items())) for t in trials}) == 5
    assert not [t for t in trials if "reused_from" in t.user_attrs]
    assert "every one of the space's 4 candidates is evaluated" in capsys.readouterr().err
    assert tune(*args, "--n-trials", "40") == 0  # a resume says so, and runs nothing
    assert len(load("cnn-syntheticbackend").get_trials()) == 5
    assert "nothing is left to search" in capsys.readouterr().err
    assert main(["space", *args[:5]]) == 0
    assert "study cnn-syntheticbackend: 0 of the 4 candidates not evaluated yet" in capsys.readouterr().out
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    storage = f"sqlite:///{Path('studies/cnn-syntheticbackend.db').resolve()}"
    monkeypatch.chdir(elsewhere)  # from another folder, the study named
    assert main(["space", *args[:5], "--storage", storage, "--study-name", "cnn-syntheticbackend", "--json"]) == 0
    counted = json.loads(capsys.readouterr().out)
    assert (counted["candidates"], counted["left"]) == (4, 0)


@pytest.mark.slow
def test_a_queued_repeat_reuses_the_earlier_result(cnn_path: Path, tmp_path: Path) -> None:
    config = synthetic_config(tmp_path, 'mode = ["ok"]\ndelay_us = [0, 50, 100]\nbuild_ms = [0]\na = [0]')
    args = [str(cnn_path), "--backend", SYNTHETIC, "--config", str(config), "--seed", "0", "--no-seeds"]
    assert tune(*args, "--n-trials", "3") == 0
    study = load("cnn-syntheticbackend")
    first = study.get_trials()[1]
    study.enqueue_trial(first.params)
    assert tune(*args, "--n-trials", "4") == 0
    again = load("cnn-syntheticbackend").get_trials()[3]
    assert again.params == first.params and again.user_attrs["reused_from"] == 1 and again.value == first.value


def test_a_trials_attrs_are_stored_at_once_as_optuna_stores_them(tmp_path: Path) -> None:
    attrs = {"outcome": "ok", "latency": {"median_ms": 1.5, "stable": True}, "owner": "host:1"}
    studies = [
        optuna.create_study(storage=storage)
        for storage in (open_storage(f"sqlite:///{tmp_path / 'a.db'}"), optuna.storages.InMemoryStorage())
    ]
    for study in studies:
        trial = study.ask()
        set_trial_attrs(trial, attrs, {"accuracy": -0.5})
        study.tell(trial, 1.0)
        study.ask()
    on_disk, in_memory = (study.get_trials()[0] for study in studies)
    assert on_disk.user_attrs == in_memory.user_attrs == attrs
    assert on_disk.constraints == in_memory.constraints == {"accuracy": -0.5}
    assert count_by_state(studies[0]) == {TrialState.COMPLETE: 1, TrialState.RUNNING: 1}
    assert count_by_state(studies[1]) is None  # in memory: no database to count in


def test_a_trials_params_and_attrs_are_stored_in_one_transaction_as_optuna_stores_them(tmp_path: Path) -> None:
    space = Space([Knob("a", (0, 1, 2), 0), Knob("b", ("x", "y"), "x"), Knob("c", (True,), True)])
    urls = [f"sqlite:///{tmp_path / 'one.db'}", f"journal:{tmp_path / 'journal.log'}"]
    studies = [optuna.create_study(storage=open_storage(url), sampler=optuna.samplers.RandomSampler(0)) for url in urls]
    studies.append(optuna.create_study(sampler=optuna.samplers.RandomSampler(0)))  # Optuna's own writes
    for study in studies:
        for _ in range(3):  # the first trial of a process checks through Optuna, later ones at once
            trial = study.ask()
            with one_transaction(trial) as attrs:
                candidate = space.suggest(trial)
                attrs["owner"] = "host:1"
            assert trial.params == candidate
            study.tell(trial, 1.0)
    read = [[(t.params, t.distributions, t.user_attrs) for t in study.get_trials()] for study in studies]
    assert read[0] == read[1] == read[2]
    assert read[0][0][2] == {"owner": "host:1"}
    trial = studies[0].ask()
    with one_transaction(trial):
        space.suggest(trial)
        meanwhile = open_storage(urls[0], read_only=True).get_all_trials(studies[0]._study_id)[-1].params
    assert meanwhile == {} and studies[0].get_trials()[-1].params == trial.params  # written as the block ends
    studies[0].tell(trial, 1.0)
    # a param of another distribution than the study's earlier trials gave it is refused, as Optuna refuses it,
    # in this process and in a fresh one (the first check in a process is Optuna's own)
    for study in (studies[0], optuna.load_study(study_name=studies[0].study_name, storage=open_storage(urls[0]))):
        trial = study.ask()
        with pytest.raises(ValueError), one_transaction(trial):
            Space([Knob("b", ("x", "z"), "x")]).suggest(trial)
        study.tell(trial, state=TrialState.FAIL)
    trial = studies[0].ask()
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError), one_transaction(trial) as attrs:
        attrs["late"] = 1
        studies[0].tell(trial, state=TrialState.FAIL)  # a trial that ended is not written to
    assert "late" not in studies[0].get_trials()[-1].user_attrs


def frozen(number: int, state: TrialState, params: dict, **attrs: object) -> optuna.trial.FrozenTrial:
    trial = create_trial(
        state=state,
        params=params,
        distributions={k: CategoricalDistribution((0, 1, 2)) for k in params},
        value=1.0 if state is TrialState.COMPLETE else None,
        user_attrs=dict(attrs),
    )
    trial.number = number
    now = datetime.datetime.now()
    trial.datetime_start, trial.datetime_complete = now, now + datetime.timedelta(seconds=number)
    return trial


def test_the_ledger_folds_each_trial_once_and_forgets_one_a_retry_takes_back() -> None:
    ledger = StudyLedger()
    done = frozen(0, TrialState.COMPLETE, {"x": 0}, outcome="ok")
    killed = frozen(1, TrialState.FAIL, {"x": 1}, outcome="crash", failure="boom")
    running = frozen(2, TrialState.RUNNING, {"x": 2})
    ledger.update([done, killed, running])
    assert ledger.counts() == (2, 1, 0)
    assert ledger.evaluated(key_of({"x": 1})) is killed
    assert ledger.longest_recent_s() == 1.0
    retry = frozen(3, TrialState.WAITING, {})
    retry.system_attrs = {"retry_history": [1], "fixed_params": {"x": 1}}
    ledger.update([done, killed, running, retry])
    assert ledger.evaluated(key_of({"x": 1})) is None  # the kill landed after its result: it is retried
    assert ledger.counts() == (1, 1, 1)
    assert key_of({"x": 1}) in ledger.taken() and key_of({"x": 2}) in ledger.taken()


def test_readers_take_the_recorded_summary_while_it_speaks_for_the_study(cnn_path: Path, tmp_path: Path) -> None:
    config = synthetic_config(tmp_path, 'mode = ["ok", "build_error"]\ndelay_us = [0, 50, 100]\nbuild_ms = [0]')
    args = [str(cnn_path), "--backend", SYNTHETIC, "--config", str(config), "--seed", "0", "--n-trials", "8"]
    assert tune(*args) == 0
    study = load("cnn-syntheticbackend")
    recorded = recorded_summary(study)
    assert recorded is not None and recorded.trials == ()
    assert format_summary(recorded) == format_summary(summarize_study(study))
    assert str(load_tuned("studies/cnn-syntheticbackend.db")) == format_summary(summarize_study(study))
    study.enqueue_trial({"mode": "ok", "delay_us": 0})  # a trial the record does not know of
    assert recorded_summary(study) is None
    assert "1 waiting" in str(load_tuned("studies/cnn-syntheticbackend.db"))


class FullDisk(FileSystemArtifactStore):
    """A store on a disk with no room left."""

    def write(self, artifact_id: str, content_body: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")


def test_the_store_keeps_the_baseline_and_the_fastest_engines_and_a_full_disk_costs_no_result(
    tmp_path: Path,
) -> None:
    store = FileSystemArtifactStore(str(tmp_path / "store"))
    (tmp_path / "store").mkdir()
    notes: list[str] = []
    keeper = EngineKeeper(store, 3, notes.append)
    study = optuna.create_study()
    latencies = [9.0, 5.0, 7.0, 3.0, 8.0, 1.0, 6.0]
    for number, latency in enumerate(latencies):
        trial = study.ask()
        if number == 0:
            trial.set_user_attr("baseline", True)
        engine = tmp_path / f"engine{number}.plan"
        engine.write_bytes(bytes([number]) * 100)
        keeper.keep(trial, engine, latency)
        study.tell(trial, latency)
    trials = study.get_trials()
    kept = {t.number for t in trials if "engine_artifact" in t.user_attrs and store_holds(store, t)}
    assert kept == {0, 3, 5, 1}  # the baseline and the three fastest: 1.0, 3.0, 5.0 ms
    assert "engine_dropped" in trials[4].user_attrs  # 8 ms ran when three faster ones were kept
    assert disk_used(tmp_path / "store") == (400, 4)
    full = EngineKeeper(FullDisk(str(tmp_path / "store")), 3, notes.append)
    trial = study.ask()
    (tmp_path / "last.plan").write_bytes(b"x")
    full.keep(trial, tmp_path / "last.plan", 0.5)
    assert trial.user_attrs["engine_dropped"] == "the disk was full" and "the disk is full" in notes[-1]
    study.tell(trial, 0.5)  # the trial's result is kept


def store_holds(store: FileSystemArtifactStore, trial: optuna.trial.FrozenTrial) -> bool:
    try:
        store.open_reader(trial.user_attrs["engine_artifact"]).close()
    except ArtifactNotFound:
        return False
    return True
