"""The model's interface is a contract: no candidate changes the names, dtypes or ranks of what the
model takes and returns, unless the study opts in to I/O dtype changes (``--allow-io-change``);
then every reader and every export says so, and ``open_session`` converts."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from conftest import load, tune
from onnx import TensorProto, helper

import gpt_optuna
from gpt_optuna.cli import main
from gpt_optuna.core.errors import UserError
from gpt_optuna.graph import model as m
from gpt_optuna.graph.interface import InterfaceChanged, check_interface, dtype_changes, interface_problems
from gpt_optuna.results.summary_text import format_verdict
from gpt_optuna.study.summary import summarize_study

FP16 = """[measure]
budget_s = 0.05
[space]
precision = ["fp16"]
graph_optimization_level = "default"
intra_op_num_threads = [1]
"""


def reference(cnn_path: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return ort.InferenceSession(str(cnn_path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def feeds() -> dict[str, np.ndarray]:
    return {"input": np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(np.float32)}


def test_a_reduced_precision_winner_keeps_the_models_io_dtypes_by_default(
    cnn_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "tune.toml").write_text(FP16)
    assert main(["space", str(cnn_path), "--config", str(tmp_path / "tune.toml")]) == 0
    assert "keep_io_fp32" not in capsys.readouterr().out  # nothing to search: the interface stays
    assert tune(str(cnn_path), "--config", str(tmp_path / "tune.toml"), "--n-trials", "2", "--confirm-top", "0") == 0
    fp16 = load("cnn-onnxruntime").trials[1]
    assert fp16.params["precision"] == "fp16" and "io_dtypes" not in fp16.user_attrs
    capsys.readouterr()
    assert main(["export", "--trial", "1", "-o", "fp16.onnx"]) == 0
    assert "interface" not in capsys.readouterr().out
    exported = m.load_model_info("fp16.onnx")
    original = m.load_model_info(cnn_path)
    assert [(s.name, s.dtype, len(s.shape)) for s in exported.inputs + exported.outputs] == [
        (s.name, s.dtype, len(s.shape)) for s in original.inputs + original.outputs
    ]
    assert json.loads(Path("fp16.onnx.json").read_text())["interface"]["changed"] is False
    out = gpt_optuna.open_session("fp16.onnx").run(None, feeds())[0]  # fed as the original model is
    assert out.dtype == np.float32 and np.allclose(out, reference(cnn_path, feeds()), atol=0.05)
    Path("repo").mkdir()
    assert main(["export", "--format", "triton", "-o", "repo", "--trial", "1", "--model-name", "cnn"]) == 0
    config = Path("repo/cnn/config.pbtxt").read_text()
    assert "TYPE_FP16" not in config and "TYPE_FP32" in config and "interface" not in config


def test_an_opted_in_io_change_is_said_everywhere_and_open_session_converts(
    cnn_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "tune.toml").write_text(FP16 + "keep_io_fp32 = [false]\n")
    argv = ["--config", str(tmp_path / "tune.toml"), "--n-trials", "2", "--confirm-top", "0"]
    assert main(["tune", str(cnn_path), *argv, "--quiet"]) == 2  # keep_io_fp32 is no knob without the opt-in
    assert "unknown knob 'keep_io_fp32'" in capsys.readouterr().err
    assert tune(str(cnn_path), *argv, "--allow-io-change") == 0
    tuned = capsys.readouterr().out
    study = load("cnn-onnxruntime")
    assert study.user_attrs["gpt_optuna"]["allow_io_change"] is True
    changed = study.trials[1].user_attrs["io_dtypes"]
    assert changed == {"inputs": {"input": ["float32", "float16"]}, "outputs": {"logits": ["float32", "float16"]}}
    said = "interface: changed by --allow-io-change: takes input as float16 (the model: float32)"
    summary = summarize_study(study)
    if summary.best.number == 1:  # the fp16 candidate won on this machine: the summary says what it changed
        assert said in tuned
    as_winner = replace(summary, best=study.trials[1])  # whichever won here, how an fp16 winner is shown
    assert said in "\n".join(format_verdict(as_winner))
    assert "interface: the model's own input and output dtypes" in "\n".join(
        format_verdict(replace(summary, best=study.trials[0], baseline=None))
    )

    assert main(["export", "--trial", "1", "-o", "half.onnx"]) == 0
    printed = capsys.readouterr().out
    assert "note: half.onnx takes input as float16 (the model: float32), returns logits as float16" in printed
    side = json.loads(Path("half.onnx.json").read_text())["interface"]
    assert side["changed"] and side["allow_io_change"] and side["inputs"][0]["model_dtype"] == "float32"
    assert m.load_model_info("half.onnx").inputs[0].dtype == np.float16

    session = gpt_optuna.open_session("half.onnx")  # used as the original model: float32 in and out
    out = session.run(None, feeds())[0]
    assert out.dtype == np.float32 and np.allclose(out, reference(cnn_path, feeds()), atol=0.05)
    with pytest.raises(UserError, match="input input is int32: half.onnx takes float32"):
        session.run(None, {"input": feeds()["input"].astype(np.int32)})
    raw = gpt_optuna.open_session("half.onnx", io="exported")
    assert raw.get_inputs()[0].type == "tensor(float16)"
    assert raw.run(None, {"input": feeds()["input"].astype(np.float16)})[0].dtype == np.float16

    Path("repo").mkdir()
    assert main(["export", "--format", "triton", "-o", "repo", "--trial", "1", "--model-name", "cnn"]) == 0
    config = Path("repo/cnn/config.pbtxt").read_text()
    assert "TYPE_FP16" in config and "# the interface differs from the original model's (--allow-io-change)" in config
    assert main(["export", "--format", "triton", "-o", "repo", "--trial", "1", "--model-name", "cnn"]) == 2
    assert "already exists" in capsys.readouterr().err

    assert main(["tune", str(cnn_path), *argv, "--n-trials", "3", "--quiet"]) == 2  # resumed without the opt-in
    assert "I/O precision changes (--allow-io-change): True in the study, False now" in capsys.readouterr().err


def model(inputs: list[tuple[str, int, int]], outputs: list[tuple[str, int, int]]) -> m.ModelInfo:
    """A model's interface only: (name, ONNX type, rank) of each input and output."""

    def spec(name: str, kind: int, rank: int) -> m.TensorSpec:
        return m.TensorSpec(name, np.dtype(helper.tensor_dtype_to_np_dtype(kind)), (1,) * rank)

    return m.ModelInfo(Path("x.onnx"), "", 17, tuple(spec(*i) for i in inputs), tuple(spec(*o) for o in outputs))


def test_every_kind_of_interface_change_is_named() -> None:
    original = model([("x", TensorProto.FLOAT, 4), ("ids", TensorProto.INT64, 2)], [("y", TensorProto.FLOAT, 2)])
    half = model([("x", TensorProto.FLOAT16, 4), ("ids", TensorProto.INT64, 2)], [("y", TensorProto.FLOAT16, 2)])
    assert interface_problems(original, original) == []
    assert interface_problems(original, half) == [
        "input x is float16, the model's float32",
        "output y is float16, the model's float32",
    ]
    assert interface_problems(original, half, dtypes_may_change=True) == []
    assert dtype_changes(original, half) == {
        "inputs": {"x": ["float32", "float16"]},
        "outputs": {"y": ["float32", "float16"]},
    }
    broken = model([("x", TensorProto.FLOAT, 3), ("mask", TensorProto.INT64, 2)], [("y", TensorProto.FLOAT, 2)])
    assert sorted(interface_problems(original, broken, dtypes_may_change=True)) == [
        "input ids is gone",
        "input mask is new",
        "input x has rank 3, the model's 4",
    ]
    with pytest.raises(InterfaceChanged, match="the graph changes the model's interface: input x has rank 3"):
        check_interface(original, broken, dtypes_may_change=True)
