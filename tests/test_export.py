"""Exports that run as tuned: an ONNX Runtime trial opened with ``open_session``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from conftest import load, tune

import gpt_optuna
from gpt_optuna import model as m
from gpt_optuna.backends.onnxruntime import OnnxRuntimeBackend
from gpt_optuna.cli import main
from gpt_optuna.errors import UserError

TUNED = """[measure]
budget_s = 0.05
[space]
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

    feeds = m.unstack(dict(np.load("studies/cnn-onnxruntime/inputs.npz")))[0]
    backend = OnnxRuntimeBackend()
    info = m.load_model_info(ran)
    candidate = {knob["name"]: knob["default"] for knob in study.user_attrs["gpt_optuna"]["space"]} | trial.params
    built = backend.build(info, candidate, tmp_path, {})
    with backend.open(built, feeds, {}) as runner:
        expected = runner.infer()
    (name,) = expected
    np.testing.assert_array_equal(session.run([name], feeds)[0], expected[name])


def test_open_session_refuses_what_it_cannot_open_as_tuned(cnn_path: Path, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="tuned.onnx.json is missing"):
        gpt_optuna.open_session(tmp_path / "tuned.onnx")
    assert tune(str(cnn_path), "--n-trials", "1", "--confirm-top", "0") == 0
    assert main(["export", "-o", "best.onnx"]) == 0
    Path("best.onnx").write_bytes(Path("best.onnx").read_bytes() + b"\0")
    with pytest.raises(UserError, match="its content changed"):
        gpt_optuna.open_session("best.onnx")
