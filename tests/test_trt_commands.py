"""The trtexec and polygraphy command lines of TensorRT trials use only documented flags, and
every builder setting a trial changed is either a flag or named as having none."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from fake_tensorrt import FakeTensorRT
from test_tensorrt_api import one_change_candidates, space_of

from gpt_optuna.backends.tensorrt.commands import polygraphy, trtexec, trtexec_major

FLAGS = json.loads((Path(__file__).parent / "data" / "trt_tool_flags.json").read_text())
SHAPES = {"x": [[1, 3, 64, 64], [8, 3, 64, 64], [16, 3, 64, 64]]}


def flags_of(text: str) -> list[str]:
    return [token.split("=", 1)[0] for token in shlex.split(text) if token.startswith("-")]


@pytest.mark.parametrize("version", ["10.x", "11.x"])
def test_every_knob_value_becomes_a_documented_flag_or_is_named(version: str, cnn_path: Path) -> None:
    _, space = space_of(FakeTensorRT(version), cnn_path)
    defaults = space.default()
    documented = set(FLAGS["trtexec"][version[:2]])
    tools = (("trtexec", trtexec, documented), ("polygraphy", polygraphy, set(FLAGS["polygraphy"])))
    base = {tool: make("m.onnx", "m.plan", defaults, defaults, SHAPES).arguments for tool, make, _ in tools}
    for candidate in one_change_candidates(space)[1:]:
        changed = [n for n, v in candidate.items() if v != defaults.get(n)]
        for tool, make, known in tools:
            line = make("m.onnx", "m.plan", candidate, defaults, SHAPES)
            assert set(flags_of(line.text())) <= known, (tool, candidate, line.text())
            assert line.arguments != base[tool] or line.no_flag, (tool, changed)  # nothing silently lost


def test_the_trtexec_line_says_the_trials_cuda_graph_as_its_trtexec_reads_it() -> None:
    defaults = {"builder_optimization_level": 3, "runtime.cuda_graph": False}
    captured = {**defaults, "runtime.cuda_graph": True}
    strong = ["--stronglyTyped"]  # trtexec 10 builds weakly typed networks unless told
    for major, plain, graph in ((10, strong, ["--useCudaGraph", *strong]), (11, ["--noCudaGraph"], [])):
        for params, expected in ((defaults, plain), (captured, graph)):
            arguments = trtexec("m.onnx", "m.plan", params, defaults, {}, major).arguments
            assert arguments[2:] == expected, (major, params)
            assert set(flags_of(" ".join(arguments))) <= set(FLAGS["trtexec"][str(major)])
    weak = {**defaults, "flag.FP16": True}
    assert "--stronglyTyped" not in trtexec("m.onnx", "m.plan", weak, defaults, {}, 10).arguments
    assert trtexec_major({"tensorrt": "11.4.0.106"}) == 11 and trtexec_major({"tensorrt_rtx": "1.7"}) is None


def test_the_lines_read_as_a_user_would_type_them() -> None:
    defaults = {
        "builder_optimization_level": 3,
        "flag.TF32": True,
        "tactic.CUDNN": False,
        "tactic.CUBLAS": True,
        "tiling_optimization_level": "NONE",
        "workspace_mib": "default",
        "runtime.aux_streams": False,
        "runtime.cuda_graph_strategy": "DISABLED",
        "route.kgen:tiling": "0",
    }
    params = {
        **defaults,
        "builder_optimization_level": 5,
        "flag.TF32": False,
        "tactic.CUDNN": True,
        "tiling_optimization_level": "FULL",
        "workspace_mib": 1024,
        "runtime.aux_streams": True,
        "runtime.cuda_graph_strategy": "WHOLE_GRAPH_CAPTURE",
        "route.kgen:tiling": "2",
    }
    line = trtexec("m.onnx", "m.plan", params, defaults, SHAPES)
    assert line.text() == (
        "trtexec --onnx=m.onnx --saveEngine=m.plan --minShapes=x:1x3x64x64 --optShapes=x:8x3x64x64 "
        "--maxShapes=x:16x3x64x64 --tacticSources=+CUDNN --setBuildRoute=-kgen:tiling=2 "
        "--builderOptimizationLevel=5 --noTF32 --tilingOptimizationLevel=3 --memPoolSize=workspace:1024M --useCudaGraph"
    )
    assert line.no_flag == ["runtime.aux_streams=True"]
    line = polygraphy("m.onnx", "m.plan", params, defaults, SHAPES)
    assert line.text() == (
        "polygraphy convert m.onnx --convert-to trt -o m.plan --trt-min-shapes 'x:[1,3,64,64]' "
        "--trt-opt-shapes 'x:[8,3,64,64]' --trt-max-shapes 'x:[16,3,64,64]' --tactic-sources cudnn cublas "
        "--builder-optimization-level 5 --tiling-optimization-level full --pool-limit workspace:1073741824"
    )
    assert line.no_flag == [
        "runtime.aux_streams=True",
        "runtime.cuda_graph_strategy=WHOLE_GRAPH_CAPTURE",
        "route.kgen:tiling=2",
    ]


def test_a_real_study_trial_gets_its_lines_and_the_onnx_that_was_parsed(cnn_path: Path) -> None:
    pytest.importorskip("tensorrt_rtx", reason="the rtx extra builds real engines on the CPU")
    import onnx
    import optuna

    from gpt_optuna.backends.base import ExportedTrial
    from gpt_optuna.backends.tensorrt.commands import build_commands
    from gpt_optuna.cli import main
    from gpt_optuna.results.export import trial_model
    from gpt_optuna.study.folder import StudyFolder

    flags = ["--backend", "tensorrt-rtx", "--dry-run", "--quiet", "--n-trials", "4", "--seed", "1"]
    assert main(["tune", str(cnn_path), *flags]) == 0
    study = optuna.load_study(study_name="cnn-tensorrt-rtx", storage="sqlite:///studies/cnn-tensorrt-rtx.db")
    defaults = {k["name"]: k["default"] for k in study.user_attrs["gpt_optuna"]["space"]}
    for trial in study.get_trials():
        engine, folder = Path(f"t{trial.number}.plan"), StudyFolder.of(study)
        shapes = study.user_attrs["gpt_optuna"].get("shapes", {})
        commands = build_commands(
            ExportedTrial(
                trial_model(study, trial),
                engine,
                trial.params,
                defaults,
                shapes,
                folder.engine_paths,
                folder.root / "inputs.npz",
            )
        )
        onnx.checker.check_model(f"t{trial.number}.plan.onnx")
        assert commands["trtexec"].startswith(
            f"trtexec --onnx=t{trial.number}.plan.onnx --saveEngine=t{trial.number}.plan"
        )
        level = trial.params["builder_optimization_level"]
        assert (f"--builderOptimizationLevel={level}" in commands["trtexec"]) == (level != 3)
        assert isinstance(commands["polygraphy_no_flag"], list)
