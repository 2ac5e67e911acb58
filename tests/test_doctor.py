"""``gpt-optuna doctor`` as a user runs it: the engines here, what they offer, and each one's
self-test with its real library (ONNX Runtime on the CPU; TensorRT-RTX builds where installed)."""

import importlib.util
import json
import subprocess
import sys

import onnxruntime


def doctor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpt_optuna.cli", "doctor", *args], capture_output=True, text=True, timeout=600
    )


def test_doctor_names_the_engines_their_providers_and_knobs_and_runs_a_tiny_model_on_each() -> None:
    found = doctor("--json")
    assert found.returncode == 0, found.stderr
    engines = {e["name"]: e for e in json.loads(found.stdout)["engines"]}
    assert set(engines) == {"onnxruntime", "tensorrt", "tensorrt-rtx", "inductor"}
    if importlib.util.find_spec("torch") is not None:  # tried on a tiny PyTorch program
        assert engines["inductor"]["missing"] is None and engines["inductor"]["latency_ms"] > 0
    ort = engines["onnxruntime"]
    assert ort["missing"] is None and ort["versions"]["onnxruntime"] == onnxruntime.__version__
    assert "CPUExecutionProvider" in ort["providers"] and ort["latency_ms"] > 0
    assert {"provider", "graph_optimization_level", "mem_pattern"} <= set(ort["knobs"])
    for name, module in (("tensorrt", "tensorrt"), ("tensorrt-rtx", "tensorrt_rtx")):
        engine = engines[name]
        if importlib.util.find_spec(module) is None:
            assert "is not installed; install it with: pip install" in engine["missing"]
        else:  # built here; run where a GPU is
            assert engine["missing"] is None and engine["build_s"] > 0 and engine["knobs"]
            assert (engine["latency_ms"] or 0) > 0 or engine["not_run"]
    text = doctor()
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].startswith("gpt-optuna ") and lines[1].startswith("GPUs: ")
    ort_line = next(line for line in lines if line.startswith("onnxruntime ("))
    assert "the tiny model built in" in ort_line and ort_line.endswith("ms per run")
    assert "  execution providers that start: " in text.stdout and "    graph_optimization_level: " in text.stdout
