"""Several engines in one study: the composed space, the specs ``--backend`` takes, and a real
search of two engines (ONNX Runtime and ONNX Runtime under another name, both run for real)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import load, tune
from twin_backend import TwinBackend

from gpt_optuna.backends import BACKENDS, load_backend
from gpt_optuna.backends.engine_choice import EngineChoice, choose_engines, engine_defaults, resolved_spec
from gpt_optuna.backends.onnxruntime.backend import OnnxRuntimeBackend
from gpt_optuna.cli import main
from gpt_optuna.core.engine_spec import ENGINE_KNOB
from gpt_optuna.core.errors import UserError
from gpt_optuna.core.space import Condition, Knob, Space
from gpt_optuna.graph.model import load_model_info
from gpt_optuna.search.config import TuneConfig
from gpt_optuna.worker.self_test import tiny_program

TWIN = "twin_backend:TwinBackend"


def _space(cnn_path: Path, backend: EngineChoice) -> list[Knob]:
    return list(backend.space(load_model_info(cnn_path), {}).knobs)


def test_the_engine_knob_comes_first_and_gates_each_engines_knobs(cnn_path: Path) -> None:
    backend = load_backend(f"onnxruntime,{TWIN}")
    assert isinstance(backend, EngineChoice) and list(backend.engines) == ["onnxruntime", "twin"]
    knobs = _space(cnn_path, backend)
    precision = Knob("precision", ("fp32", "fp16"), "fp32")
    space = backend.with_graph_knobs([precision], knobs)
    engine, graph = space.knobs[0], space.knobs[1]
    assert (engine.name, engine.choices, engine.default, engine.selects_engine) == (
        ENGINE_KNOB,
        ("onnxruntime", "twin"),
        "onnxruntime",
        True,
    )
    assert Condition(ENGINE_KNOB, ("onnxruntime",)) in graph.requires  # the twin runs no fp16 graphs
    baseline = space.default()
    assert baseline[ENGINE_KNOB] == "onnxruntime" and "provider" in baseline
    assert not any(name.startswith("twin.") for name in baseline)
    [(other, defaults)] = engine_defaults(space)
    assert other == "twin" and defaults[ENGINE_KNOB] == "twin"
    assert "provider" not in defaults and "precision" not in defaults and "twin.provider" in defaults
    assert space.size() > 1 and backend.precisions() == OnnxRuntimeBackend().precisions()


def test_a_candidate_without_the_engine_knob_runs_on_the_first_engine() -> None:
    backend = EngineChoice.of(f"{TWIN},onnxruntime")
    assert isinstance(backend.engine({"provider": "CPUExecutionProvider"}), TwinBackend)
    assert backend.engine({ENGINE_KNOB: "onnxruntime"}).name == "onnxruntime"


def test_engines_that_share_a_knob_name_are_refused(cnn_path: Path) -> None:
    backend = EngineChoice({"onnxruntime": OnnxRuntimeBackend(), "copy": OnnxRuntimeBackend()})
    with pytest.raises(UserError, match="engines onnxruntime and copy both have a knob 'provider'"):
        _space(cnn_path, backend)


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        ("onnxruntime,onnxruntime", "names onnxruntime twice"),
        ("onnxruntime,nope", "unknown backend 'nope'"),
        ("onnxruntime,", "an empty engine name"),
    ],
)
def test_duplicate_unknown_and_empty_engines_are_refused_in_one_line(spec: str, error: str) -> None:
    with pytest.raises(UserError, match=error) as refused:
        TuneConfig(Path("m.onnx"), backend=spec)
    assert "\n" not in str(refused.value)


def test_auto_names_every_registered_engine_chosen_or_left_out_with_why() -> None:
    chosen, line = choose_engines(Path("m.onnx"))
    assert "onnxruntime" in chosen  # installed wherever the tuner is
    assert "inductor" not in chosen  # it compiles PyTorch programs, and an ONNX model is none
    assert "inductor: it compiles PyTorch programs, and m.onnx is none (give the model as a .pt2)" in line
    left_out = [name for name in BACKENDS if name not in chosen]
    assert line.startswith(f"--backend auto: {', '.join(chosen)}")
    assert all(f"{name}: " in line for name in left_out)
    config = TuneConfig(Path("m.onnx"), backend="auto")
    assert config.backend == resolved_spec("auto", Path("m.onnx"))[0] == ",".join(chosen)
    assert config.engines_chosen == line
    program, _ = choose_engines(Path("m.pt2"))
    assert ("inductor" in program) == (load_backend("inductor").missing_library() is None)


@pytest.mark.slow
def test_one_study_searches_two_engines_and_states_the_winner_against_each(cnn_path: Path, tmp_path: Path) -> None:
    config = tmp_path / "tune.toml"
    config.write_text(f'backend = "onnxruntime,{TWIN}"\n[measure]\nbudget_s = 0.05\nmin_samples = 5\n')
    assert tune(str(cnn_path), "--config", str(config), "--n-trials", "4", "--confirm-top", "1") == 0
    study = load("cnn-onnxruntime_twinbackend")
    baseline, twin = study.trials[0], study.trials[1]
    assert baseline.params[ENGINE_KNOB] == "onnxruntime" and baseline.user_attrs["baseline"]
    assert twin.params[ENGINE_KNOB] == "twin" and twin.user_attrs["engine_defaults"] == "twin"
    assert all(t.state.name == "COMPLETE" for t in study.trials)
    confirmed = study.user_attrs["confirmed"]
    assert confirmed["engines"]["twin"]["number"] == 1  # re-measured beside the finalist, in fresh processes
    assert main(["best", "--json"]) == 0
    for number in (0, 1):
        assert main(["export", "--trial", str(number), "-o", f"trial{number}.onnx"]) == 0
    side = {n: json.loads(Path(f"trial{n}.onnx.json").read_text()) for n in (0, 1)}
    assert side[0]["engine"] == "onnxruntime" and "onnxruntime" in side[0]  # ONNX Runtime's deployment
    assert side[1]["engine"] == "twin" and "onnxruntime" not in side[1]  # the twin registers none
    assert side[0]["engine_defaults"]["twin"]["trial"] == 1
    assert side[0]["engine_defaults"]["twin"]["speedup"] is not None


@pytest.mark.slow
def test_onnxruntime_and_inductor_are_searched_in_one_study_of_a_pt2_model(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    tiny_program(tmp_path / "tiny.pt2")
    config = tmp_path / "tune.toml"
    config.write_text("[measure]\nbudget_s = 0.05\nmin_samples = 5\n")
    args = ["--backend", "onnxruntime,inductor", "--config", str(config), "--n-trials", "2", "--confirm-top", "1"]
    assert tune(str(tmp_path / "tiny.pt2"), *args, "--confirm-processes", "2") == 0
    study = load("tiny-onnxruntime_inductor")
    assert study.trials[1].params[ENGINE_KNOB] == "inductor" and study.trials[1].state.name == "COMPLETE"
    assert study.user_attrs["confirmed"]["engines"]["inductor"]["number"] == 1


def test_each_engine_gets_a_seed_with_its_own_speed_features_on() -> None:
    from gpt_optuna.search.seeds import speed_seeds

    engine = Knob(ENGINE_KNOB, ("onnxruntime", "inductor"), "onnxruntime", selects_engine=True)
    graph = Knob("mem_pattern", (True, False), True, requires=(Condition(ENGINE_KNOB, ("onnxruntime",)),))
    cudagraphs = Knob("cudagraphs", (False, True), False, requires=(Condition(ENGINE_KNOB, ("inductor",)),))
    space = Space([engine, graph, cudagraphs])

    class Engines(OnnxRuntimeBackend):  # the composed engines' speed values: only the mapping is tested
        speed_values = {"mem_pattern": (False,), "cudagraphs": (True,)}

        def runs_on_cpu(self, space: Space) -> bool:
            return False

    seeds = dict((why, seed) for seed, why in speed_seeds(space, Engines()))
    assert seeds == {
        "every speed feature of onnxruntime on": {ENGINE_KNOB: "onnxruntime", "mem_pattern": False},
        "every speed feature of inductor on": {ENGINE_KNOB: "inductor", "cudagraphs": True},
    }
