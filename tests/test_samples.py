"""Accuracy on many samples and the user's own metric, through the real command."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import SYNTHETIC, load, synthetic_config, tune
from optuna.trial import TrialState

from gpt_optuna.cli import main

METRICS = '''
import numpy as np

def top1(outputs, references, inputs):
    """Top-1 agreement of the candidate with the fp32 reference over every sample."""
    agree = [np.argmax(o["logits"], -1) == np.argmax(r["logits"], -1) for o, r in zip(outputs, references)]
    return {"top1_agree": float(np.mean(np.concatenate(agree))), "samples_seen": len(inputs)}

def broken(outputs, references, inputs):
    if outputs is not references:  # fine on the reference itself, broken on a candidate
        raise ValueError("no labels for these outputs")
    return {"score": 1.0}

def loader():
    rng = np.random.default_rng(5)
    for _ in range(3):
        yield {"input": rng.standard_normal((1, 3, 64, 64)).astype(np.float32)}
'''


@pytest.fixture
def metrics_module(tmp_path: Path) -> Path:
    path = tmp_path / "my_metrics.py"
    path.write_text(METRICS)
    return path


def stacked_inputs(tmp_path: Path, count: int) -> Path:
    rng = np.random.default_rng(1)
    path = tmp_path / "samples.npz"
    np.savez(path, input=rng.standard_normal((count, 1, 3, 64, 64)).astype(np.float32))
    return path


def test_every_candidate_runs_every_sample_and_the_worst_counts(
    cnn_path: Path, tmp_path: Path, metrics_module: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = synthetic_config(tmp_path, 'mode = ["ok", "noisy"]\ndelay_us = [0]\nbuild_ms = [0]')
    samples = stacked_inputs(tmp_path, 4)
    argv = [str(cnn_path), "--backend", SYNTHETIC, "--config", str(config), "--inputs", str(samples)]
    argv += ["--metric", f"{metrics_module}:top1", "--accuracy", "top1_agree>=0.99 and mean(cosine)>=0.999"]
    assert tune(*argv, "--n-trials", "6", "--seed", "0", "--confirm-top", "0") == 0
    assert "no --inputs" not in capsys.readouterr().err
    trials = load("cnn-syntheticbackend").get_trials()
    for trial in trials:
        accuracy = trial.user_attrs["accuracy"]
        assert accuracy["samples"] == 4 and accuracy["samples_seen"] == 4
        assert {"top1_agree", "mean(cosine)", "cosine", "max_abs"} <= set(accuracy)
        assert accuracy["cosine"] <= accuracy["mean(cosine)"]  # the worst sample against the average
        noisy = trial.params["mode"] == "noisy"
        assert trial.state is (TrialState.PRUNED if noisy else TrialState.COMPLETE)
    stored = np.load("studies/cnn-syntheticbackend/reference.npz")["logits"]
    assert stored.shape[0] == 4  # one reference per sample, cached with the study


def test_int8_is_calibrated_on_the_samples_when_no_calibration_is_given(
    cnn_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    samples = stacked_inputs(tmp_path, 3)
    argv = [str(cnn_path), "--inputs", str(samples), "--n-trials", "2", "--confirm-top", "0"]
    assert tune(*argv) == 0
    assert "no --calibration data" not in capsys.readouterr().err
    calibration = np.load("studies/cnn-onnxruntime/calibration.npz")["input"]
    np.testing.assert_array_equal(calibration, np.load(samples)["input"])


def test_samples_from_a_folder_a_loader_and_a_cap(cnn_path: Path, tmp_path: Path, metrics_module: Path) -> None:
    config = synthetic_config(tmp_path, 'mode = ["ok"]\ndelay_us = [0]\nbuild_ms = [0]')
    folder = tmp_path / "folder"
    folder.mkdir()
    rng = np.random.default_rng(2)
    for index in range(3):
        np.savez(folder / f"{index}.npz", input=rng.standard_normal((2, 1, 3, 64, 64)).astype(np.float32))
    base = [str(cnn_path), "--backend", SYNTHETIC, "--config", str(config), "--n-trials", "2", "--confirm-top", "0"]
    assert tune(*base, "--inputs", str(folder), "--study-name", "folder") == 0
    assert load("folder").get_trials()[0].user_attrs["accuracy"]["samples"] == 6
    assert tune(*base, "--inputs", str(folder), "--samples", "4", "--study-name", "capped") == 0
    assert load("capped").get_trials()[0].user_attrs["accuracy"]["samples"] == 4
    assert tune(*base, "--inputs", f"{metrics_module}:loader", "--study-name", "loaded") == 0
    assert load("loaded").get_trials()[0].user_attrs["accuracy"]["samples"] == 3


def test_a_failing_user_metric_is_a_pruned_failure_with_its_traceback(
    cnn_path: Path, tmp_path: Path, metrics_module: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = synthetic_config(tmp_path, 'mode = ["ok"]\ndelay_us = [0, 50]\nbuild_ms = [0]')
    argv = [str(cnn_path), "--backend", SYNTHETIC, "--config", str(config), "--confirm-top", "0"]
    argv += ["--inputs", str(stacked_inputs(tmp_path, 2)), "--metric", f"{metrics_module}:broken"]
    capsys.readouterr()
    assert tune(*argv, "--accuracy", "score>=0.5", "--n-trials", "2") == 3
    out = capsys.readouterr().out
    assert out.startswith("verdict: no feasible candidate yet") and "export" not in out  # nothing to export
    for trial in load("cnn-syntheticbackend").get_trials():
        assert trial.state is TrialState.PRUNED and trial.user_attrs["outcome"] == "metric_error"
        assert "no labels for these outputs" in trial.user_attrs["failure"]
        assert "Traceback" in trial.user_attrs["log"] and trial.constraints["failure"] > 0
    capsys.readouterr()
    assert main(["tune", *argv, "--accuracy", "nope>=1", "--study-name", "other"]) == 2
    assert "--accuracy names 'nope', which is neither a built-in metric nor one the --metric" in capsys.readouterr().err


@pytest.mark.slow
def test_generated_inputs_warn_once_and_bad_samples_are_named(cnn_path: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    cli = [sys.executable, "-m", "gpt_optuna.cli", "tune", str(cnn_path), "--n-trials", "2", "--quiet"]
    result = subprocess.run(cli, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stderr.count("no --inputs: accuracy is judged on one batch") == 1
    ragged = tmp_path / "ragged.npz"
    np.savez(ragged, input=np.zeros((2, 1, 3, 64, 64), np.float32), extra=np.zeros(3, np.float32))
    bad = subprocess.run([*cli, "--inputs", str(ragged)], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "different numbers of samples" in bad.stderr


def declared_model(path: Path) -> Path:
    """Inputs of four kinds: a float tensor, a scalar int64 (a sample rate), uint8 and a scalar bool."""
    import onnx
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Cast", [n], [f"{n}f"], to=TensorProto.FLOAT) for n in ("rate", "pixels", "flag")]
    nodes += [helper.make_node("Mul", ["x", "ratef"], ["a"]), helper.make_node("Mul", ["pixelsf", "flagf"], ["b"])]
    nodes += [helper.make_node("Add", ["a", "b"], ["y"])]
    inputs = [("x", TensorProto.FLOAT, [1, 4]), ("rate", TensorProto.INT64, []), ("pixels", TensorProto.UINT8, [1, 4])]
    inputs += [("flag", TensorProto.BOOL, [])]
    graph = helper.make_graph(
        nodes,
        "declared",
        [helper.make_tensor_value_info(*spec) for spec in inputs],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_inputs_as_the_model_declares_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Scalar (0-d) inputs, int64, uint8 and bool beside floats, from one .npz, a stacked .npz and a
    loader yielding plain Python values; a string input is refused in one line."""
    model = declared_model(tmp_path / "declared.onnx")
    one = {"x": np.ones((1, 4), np.float32), "rate": np.array(16000), "pixels": np.arange(4, dtype=np.uint8)[None]}
    np.savez(tmp_path / "one.npz", **one, flag=np.array(True))
    stacked = {k: np.stack([v, v]) for k, v in one.items()} | {"flag": np.array([True, False])}
    np.savez(tmp_path / "two.npz", **stacked)
    (tmp_path / "feeds.py").write_text(
        "import numpy as np\n"
        "def load():\n"
        "    for rate in (8000, 16000, 44100):\n"
        "        yield {'x': np.ones((1, 4), np.float32), 'rate': rate, 'pixels': np.zeros((1, 4), np.uint8),"
        " 'flag': True}\n"
    )
    config = tmp_path / "tune.toml"
    config.write_text('[measure]\nbudget_s = 0.05\n[space]\nprecision = "default"\n')
    base = [str(model), "--config", str(config), "--n-trials", "1", "--confirm-top", "0"]
    for name, given, samples in (("one", "one.npz", 1), ("two", "two.npz", 2), ("loaded", "feeds.py:load", 3)):
        assert tune(*base, "--inputs", str(tmp_path / given), "--study-name", name) == 0, capsys.readouterr().err
        baseline = load(name).get_trials()[0]
        assert baseline.state is TrialState.COMPLETE and baseline.user_attrs["accuracy"]["samples"] == samples

    import onnx
    from onnx import TensorProto, helper

    text = helper.make_graph(
        [helper.make_node("Identity", ["s"], ["o"])],
        "text",
        [helper.make_tensor_value_info("s", TensorProto.STRING, [1])],
        [helper.make_tensor_value_info("o", TensorProto.STRING, [1])],
    )
    onnx.save(helper.make_model(text, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), tmp_path / "t.onnx")
    capsys.readouterr()
    assert main(["tune", str(tmp_path / "t.onnx"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "input 's' is a string tensor" in err and err.count("\n") == 1
