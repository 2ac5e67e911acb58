"""Exports that run as tuned: an ONNX Runtime trial opened with ``open_session``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from conftest import load, tune

import gpt_optuna
from gpt_optuna.backends.onnxruntime.backend import OnnxRuntimeBackend
from gpt_optuna.backends.side_file import FORMAT as SIDE_FILE_FORMAT
from gpt_optuna.backends.side_file import SideFile
from gpt_optuna.cli import main
from gpt_optuna.core.engine_paths import EnginePaths
from gpt_optuna.core.errors import UserError
from gpt_optuna.graph import feeds as mf
from gpt_optuna.graph import model as m

TUNED = """[measure]
budget_s = 0.05
[space]
provider = "CPUExecutionProvider"
precision = ["fp16"]
graph_optimization_level = ["ORT_ENABLE_BASIC"]
intra_op_num_threads = [1]
intra_op_spinning = [false]
"""


def test_an_onnxruntime_export_opens_as_the_trial_ran_and_reproduces_its_outputs(
    cnn_path: Path, tmp_path: Path
) -> None:
    (tmp_path / "tune.toml").write_text(TUNED)
    assert tune(str(cnn_path), "--config", str(tmp_path / "tune.toml"), "--n-trials", "2", "--confirm-top", "0") == 0
    study = load("cnn-onnxruntime")
    trial = study.trials[1]
    assert trial.params["precision"] == "fp16" and trial.params["intra_op_num_threads"] == 1
    assert main(["export", "--trial", "1", "-o", "tuned.onnx"]) == 0
    ran = Path("studies/cnn-onnxruntime/models") / trial.user_attrs["transformed_model"]
    assert Path("tuned.onnx").read_bytes() == ran.read_bytes()  # the fp16 graph it ran, not the input

    session = gpt_optuna.open_session("tuned.onnx")
    options = session.get_session_options()
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert options.intra_op_num_threads == 1 and options.enable_mem_pattern == trial.params["mem_pattern"]
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert session.get_providers()[0] == "CPUExecutionProvider"

    info = m.load_model_info(ran)
    stored = mf.unstack(dict(np.load("studies/cnn-onnxruntime/inputs.npz")))[0]
    feeds = {spec.name: stored[spec.name].astype(spec.dtype) for spec in info.inputs}  # fp16 where keep_io is off
    backend = OnnxRuntimeBackend()
    candidate = {knob["name"]: knob["default"] for knob in study.user_attrs["gpt_optuna"]["space"]} | trial.params
    built = backend.build(info, candidate, EnginePaths.under(tmp_path), {})
    with backend.open(built, feeds, {}) as runner:
        expected = runner.infer()
    (name,) = expected
    np.testing.assert_array_equal(session.run([name], feeds)[0], expected[name])


def test_open_session_refuses_what_it_cannot_open_as_tuned(cnn_path: Path, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="tuned.onnx.json is missing"):
        gpt_optuna.open_session(tmp_path / "tuned.onnx")
    assert tune(str(cnn_path), "--n-trials", "1", "--confirm-top", "0") == 0
    assert main(["export", "-o", "best.onnx"]) == 0
    side = json.loads(Path("best.onnx.json").read_text())
    assert side["format"] == SIDE_FILE_FORMAT
    Path("best.onnx.json").write_text(json.dumps(side | {"format": SIDE_FILE_FORMAT + 1}))
    later = f"format {SIDE_FILE_FORMAT + 1}, which a later gpt-optuna writes"
    with pytest.raises(UserError, match=later):
        gpt_optuna.open_session("best.onnx")
    with pytest.raises(UserError, match=later):
        gpt_optuna.check("best.onnx", "best.onnx.json")
    Path("best.onnx.json").write_text(json.dumps(side))
    Path("best.onnx").write_bytes(Path("best.onnx").read_bytes() + b"\0")
    with pytest.raises(UserError, match="its content changed"):
        gpt_optuna.open_session("best.onnx")


def test_the_side_file_reads_back_as_it_was_written(cnn_path: Path) -> None:
    """What the export wrote reads back field by field, the engine's section apart, and writes out
    again byte for byte; a file of an earlier, unversioned export reads with its absent fields None."""
    assert tune(str(cnn_path), "--n-trials", "1", "--confirm-top", "0") == 0
    assert main(["export", "-o", "best.onnx"]) == 0
    text = Path("best.onnx.json").read_text()
    written = json.loads(text)
    record = SideFile.read("best.onnx")
    assert record.to_json() == text
    assert record.backend == "onnxruntime" and record.trial == written["trial"] == 0
    assert record.params == written["params"] and record.samples == written["samples"]
    assert set(record.sections) == {"onnxruntime"} and record.present == set(written)
    unversioned = {k: v for k, v in written.items() if k not in ("format", "measurement", "model_sha256")}
    Path("old.onnx.json").write_text(json.dumps(unversioned))
    old = SideFile.read("old.onnx")
    assert old.measurement is None and old.model_sha256 is None and "measurement" not in old.present
    assert old.params == written["params"] and old.sections == record.sections


def test_a_triton_repository_parses_with_tritons_model_config_and_matches_the_model(
    cnn_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "tune.toml").write_text(TUNED + 'execution_mode = ["ORT_PARALLEL"]\n')
    assert tune(str(cnn_path), "--config", str(tmp_path / "tune.toml"), "--n-trials", "2", "--confirm-top", "0") == 0
    trial = load("cnn-onnxruntime").trials[1]
    assert main(["export", "--format", "triton", "-o", "no/repo", "--trial", "1"]) == 2  # no such folder
    assert "the folder no does not exist" in capsys.readouterr().err and not Path("no").exists()
    capsys.readouterr()
    assert main(["export", "--format", "triton", "-o", "repo", "--trial", "1", "--model-name", "classifier"]) == 0
    said = capsys.readouterr().out
    assert said.startswith("made the model repository repo\n")
    assert "no field for session config session.intra_op.allow_spinning=0" in said
    config = text_parsed(Path("repo/classifier/config.pbtxt").read_text())
    model = Path("repo/classifier/1/model.onnx")
    info = m.load_model_info(model)
    assert config.name == "classifier" and config.backend == "onnxruntime" and config.max_batch_size == 0
    for declared, spec in [
        *zip(config.input, info.inputs, strict=True),
        *zip(config.output, info.outputs, strict=True),
    ]:
        assert declared.name == spec.name and list(declared.dims) == list(spec.shape)
        expected = {"float32": "TYPE_FP32", "float16": "TYPE_FP16"}[spec.dtype.name]  # keep_io_fp32 decides
        assert declared.data_type == parsed_config_type(expected)
    assert [g.kind for g in config.instance_group] == [parsed_config_type("KIND_CPU", "ModelInstanceGroup")]
    assert config.optimization.graph.level == -1  # ORT_ENABLE_BASIC in the backend's numbering
    parameters = {key: value.string_value for key, value in config.parameters.items()}
    assert parameters["intra_op_thread_count"] == "1" and parameters["execution_mode"] == "1"
    assert parameters["enable_mem_pattern"] == str(trial.params["mem_pattern"]).lower()
    assert gpt_optuna.open_session(model).get_session_options().intra_op_num_threads == 1


def parsed_config_type(name: str, message: str = "DataType") -> int:
    model_config = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    if message == "DataType":
        return model_config.DataType.Value(name)
    return getattr(model_config, message).Kind.Value(name)


def test_triton_accelerators_carry_the_cuda_and_tensorrt_provider_options(tmp_path: Path) -> None:
    from gpt_optuna.backends import DEPLOYMENTS
    from gpt_optuna.results.triton import config_text

    info = m.ModelInfo(tmp_path / "x.onnx", "", 17, (m.TensorSpec("x", np.dtype("float16"), ("batch", 3)),), ())
    cuda = {"device_id": "0", "prefer_nhwc": "1", "enable_cuda_graph": "1", "cudnn_conv_algo_search": "HEURISTIC"}
    record = {
        "study": "s",
        "trial": 3,
        "params": {},
        "onnxruntime": {
            "session_options": {"graph_optimization_level": "ORT_ENABLE_LAYOUT", "enable_mem_pattern": True},
            "session_config_entries": {},
            "providers": [["CUDAExecutionProvider", cuda]],
        },
    }
    text, left_out = config_text("m", info, SideFile.of(record), DEPLOYMENTS["onnxruntime"])
    config = text_parsed(text)
    assert left_out == ["graph_optimization_level=ORT_ENABLE_LAYOUT"] and not config.optimization.HasField("graph")
    (accelerator,) = config.optimization.execution_accelerators.gpu_execution_accelerator
    assert accelerator.name == "cuda" and dict(accelerator.parameters) == {
        k: v for k, v in cuda.items() if k != "device_id"
    }
    assert list(config.input[0].dims) == [-1, 3] and config.input[0].data_type == parsed_config_type("TYPE_FP16")
    trt = {
        "device_id": "0",
        "trt_fp16_enable": "1",
        "trt_builder_optimization_level": "5",
        "trt_cuda_graph_enable": "1",
    }
    record["onnxruntime"]["providers"] = [["TensorrtExecutionProvider", trt]]
    (accelerator,) = text_parsed(
        config_text("m", info, SideFile.of(record), DEPLOYMENTS["onnxruntime"])[0]
    ).optimization.execution_accelerators.gpu_execution_accelerator
    assert accelerator.name == "tensorrt" and dict(accelerator.parameters) == {
        "precision_mode": "FP16",
        "trt_builder_optimization_level": "5",
        "trt_cuda_graph_enable": "1",
    }
    plan = text_parsed(
        config_text(
            "m",
            info,
            SideFile.of({"study": "s", "trial": 1, "params": {"runtime.cuda_graph": True}}),
            DEPLOYMENTS["tensorrt"],
        )[0]
    )
    assert plan.platform == "tensorrt_plan" and plan.optimization.cuda.graphs


def test_triton_says_which_provider_option_it_cannot_take(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A searched provider option the accelerator has no field for is named, not dropped."""
    from gpt_optuna.backends import DEPLOYMENTS
    from gpt_optuna.backends.onnxruntime import triton
    from gpt_optuna.backends.onnxruntime.settings import PROVIDER_OPTIONS
    from gpt_optuna.results.triton import config_text

    assert {row.option for row in PROVIDER_OPTIONS if row.provider == "TensorrtExecutionProvider"} == set(
        triton.TRITON_NAMES
    )
    monkeypatch.setitem(triton.TRITON_NAMES, "trt_auxiliary_streams", None)
    info = m.ModelInfo(tmp_path / "x.onnx", "", 17, (m.TensorSpec("x", np.dtype("float32"), (1, 3)),), ())
    trt = {"device_id": "0", "trt_fp16_enable": "0", "trt_auxiliary_streams": "2", "trt_timing_cache_enable": "1"}
    settings = {"session_options": {"graph_optimization_level": "ORT_ENABLE_ALL"}, "session_config_entries": {}}
    record = {"study": "s", "trial": 1, "onnxruntime": settings | {"providers": [["TensorrtExecutionProvider", trt]]}}
    text, left_out = config_text("m", info, SideFile.of(record), DEPLOYMENTS["onnxruntime"])
    assert left_out == ["trt_auxiliary_streams=2"]
    (accelerator,) = text_parsed(text).optimization.execution_accelerators.gpu_execution_accelerator
    assert dict(accelerator.parameters) == {"trt_timing_cache_enable": "1"}  # fp16 off: no precision_mode


def text_parsed(text: str) -> object:
    """A ``config.pbtxt`` parsed with Triton's own ModelConfig protobuf."""
    model_config = pytest.importorskip("tritonclient.grpc.model_config_pb2", reason="needs tritonclient[grpc]")
    from google.protobuf import text_format

    return text_format.Parse(text, model_config.ModelConfig())


@pytest.mark.gpu
def test_a_cuda_export_opens_with_the_trials_provider_options(cnn_path: Path, tmp_path: Path) -> None:
    space = 'precision = "default"\n"cuda.prefer_nhwc" = [true]\n"cuda.enable_cuda_graph" = "default"\n'
    (tmp_path / "tune.toml").write_text(f"[measure]\nbudget_s = 0.1\n[space]\n{space}")
    assert tune(str(cnn_path), "--config", str(tmp_path / "tune.toml"), "--n-trials", "2", "--confirm-top", "0") == 0
    trial = load("cnn-onnxruntime").trials[1]
    assert main(["export", "--trial", "1", "-o", "cuda.onnx"]) == 0
    session = gpt_optuna.open_session("cuda.onnx")
    options = session.get_provider_options()["CUDAExecutionProvider"]
    assert session.get_providers()[0] == "CUDAExecutionProvider" and options["prefer_nhwc"] == "1"
    assert options["cudnn_conv_algo_search"] == trial.params["cuda.cudnn_conv_algo_search"]
    feeds = mf.unstack(dict(np.load("studies/cnn-onnxruntime/inputs.npz")))[0]
    reference = mf.unstack(dict(np.load("studies/cnn-onnxruntime/reference.npz")))[0]
    (name,) = reference
    np.testing.assert_allclose(session.run([name], feeds)[0], reference[name], rtol=1e-2, atol=1e-2)


def test_a_verdict_that_keeps_the_default_exports_the_default_and_says_so(
    cnn_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The search's best re-measured in three processes at 1.0x the baseline (a confirmation of known
    rounds, in place of the measured one): no significant improvement, so export writes the baseline."""
    from gpt_optuna.study.confirmation import summarize_rounds
    from gpt_optuna.study.taxonomy import search_ranking

    assert tune(str(cnn_path), "--n-trials", "3", "--confirm-top", "0") == 0
    study = load("cnn-onnxruntime")
    best = next(t for t in search_ranking(study.trials) if not t.user_attrs.get("baseline"))
    rounds = np.ones((30, 2)) + 0.001 * np.random.default_rng(0).random((30, 2))
    study.set_user_attr("confirmed", summarize_rounds([0, best.number], rounds, np.repeat(np.arange(3), 10)))
    capsys.readouterr()
    assert main(["export", "-o", "best.onnx"]) == 0
    out = capsys.readouterr().out
    assert "verdict: no significant improvement" in out
    assert "note: the verdict keeps the default configuration, so this is the baseline, trial 0" in out
    side = json.loads(Path("best.onnx.json").read_text())
    assert side["trial"] == 0 and side["decided"] and side["verdict"] == "not_significant" and not side["winner"]
    assert main(["export", "--trial", str(best.number), "-o", "finalist.onnx"]) == 0
    assert json.loads(Path("finalist.onnx.json").read_text())["winner"]


BASELINE_ONLY = """[measure]
budget_s = 0.05
[space]
provider = "CPUExecutionProvider"
graph_optimization_level = ["ORT_ENABLE_BASIC", "ORT_ENABLE_ALL"]
"""


def test_a_model_with_external_data_exports_as_a_file_that_loads_on_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import onnx
    from conftest import matmul_model

    source = tmp_path / "model" / "mlp.onnx"
    source.parent.mkdir()
    onnx.save_model(
        matmul_model(features=64), source, save_as_external_data=True, location="weights.bin", size_threshold=0
    )
    assert source.stat().st_size < (source.parent / "weights.bin").stat().st_size  # the weights are outside
    (tmp_path / "tune.toml").write_text(BASELINE_ONLY)
    assert tune(str(source), "--config", "tune.toml", "--shape", "x:2x64", "--n-trials", "2", "--confirm-top", "0") == 0
    out = tmp_path / "shipped"
    out.mkdir()
    monkeypatch.chdir(out)
    database = tmp_path / "studies" / "mlp-onnxruntime.db"
    assert main(["export", "--storage", str(database), "--trial", "0", "-o", "mlp.onnx"]) == 0
    (source.parent / "weights.bin").unlink()  # the export must not need the original's weights
    record = json.loads(Path("mlp.onnx.json").read_text())
    inputs = mf.unstack(dict(np.load(record["samples"]["inputs"])))[0]
    reference = mf.unstack(dict(np.load(record["samples"]["reference"])))[0]
    session = gpt_optuna.open_session("mlp.onnx")
    (name,) = reference
    np.testing.assert_allclose(session.run([name], inputs)[0], reference[name], rtol=1e-5, atol=1e-6)
    assert sorted(p.name for p in out.iterdir()) == [
        "mlp.onnx",
        "mlp.onnx.inputs.npz",
        "mlp.onnx.json",
        "mlp.onnx.reference.npz",
    ]


def test_an_interrupted_export_leaves_none_of_its_files_and_runs_again(
    cnn_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    import gpt_optuna.results.export as export

    (tmp_path / "tune.toml").write_text(BASELINE_ONLY)
    assert tune(str(cnn_path), "--config", "tune.toml", "--n-trials", "2", "--confirm-top", "0") == 0
    copies, copy = [], shutil.copyfile

    def interrupted_copy(source: str | Path, dest: str | Path) -> None:
        copies.append(dest)
        copy(source, dest)
        if len(copies) == 2:  # Ctrl-C after the model and the first samples file
            raise KeyboardInterrupt

    monkeypatch.setattr(export.shutil, "copyfile", interrupted_copy)
    assert main(["export", "-o", "best.onnx"]) != 0
    assert len(copies) == 2 and not [p.name for p in tmp_path.iterdir() if p.name.startswith("best")]
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    assert main(["export", "-o", "best.onnx"]) == 0  # the same command again: no --force needed
    assert Path("best.onnx.json").is_file()
    Path("repo").mkdir()  # a Triton model folder alike
    copies.clear()
    monkeypatch.setattr(export.shutil, "copyfile", interrupted_copy)
    assert main(["export", "--format", "triton", "-o", "repo"]) != 0
    assert len(copies) == 2 and not list(Path("repo").iterdir())
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    assert main(["export", "--format", "triton", "-o", "repo"]) == 0
