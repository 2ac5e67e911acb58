"""compare and profile on a real ONNX Runtime study: two sides timed interleaved in fresh processes
with one verdict, and where a trial's time goes per operator beside the baseline's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import load, synthetic_config, tune

from gpt_optuna.cli import main

STORAGE = ["--storage", "sqlite:///studies/cnn-onnxruntime.db"]


@pytest.fixture
def searched(cnn_path: Path, tmp_path: Path) -> Path:
    config = synthetic_config(tmp_path, 'precision = "fp32"')
    assert tune(str(cnn_path), "--config", str(config), "--n-trials", "3", "--confirm-top", "0") == 0
    return cnn_path


@pytest.mark.slow
def test_compare_times_two_sides_interleaved_and_checks_their_outputs(
    searched: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert main(["compare", "baseline", "2", *STORAGE, "--processes", "2", "--rounds", "3", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["a"] == "trial 0" and found["b"] == "trial 2" and found["processes"] == 2
    assert found["verdict"] in ("faster", "baseline", "inconclusive", "not_significant")
    low, high = found["speedup_ci95"]
    assert low <= found["speedup"] <= high
    assert found["speedup"] == pytest.approx(found["a_latency_ms"] / found["b_latency_ms"])
    assert [a["feasible"] for a in found["accuracy"]] == [True, True]

    assert main(["compare", "1", str(searched), *STORAGE, "--processes", "1", "--rounds", "3"]) == 0
    out = capsys.readouterr().out
    assert "B: cnn.onnx (the engine's defaults)" in out and "verdict: indicative (one process)" in out
    assert "B outputs: meet the study's criterion" in out

    assert main(["compare", "0", "12", *STORAGE]) == 2
    assert "has no trial 12 (it has 3)" in capsys.readouterr().err
    assert main(["compare", "0", "nowhere.onnx", *STORAGE]) == 2
    assert "give a trial number, baseline, yours, or a model file (.onnx, .pt2)" in capsys.readouterr().err


def test_profile_lists_operator_times_beside_the_baseline(searched: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["profile", "1", *STORAGE, "--runs", "5", "--rounds", "2", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["trial"] == "trial 1" and found["baseline"] == "trial 0" and found["runs"] == 5
    assert len(found["rounds"]) == 2 and all(r["baseline_ms"] > 0 and r["trial_ms"] > 0 for r in found["rounds"])
    ops = {row["op_type"] for row in found["by_op_type"]}
    assert "Conv" in ops or "FusedConv" in ops
    provider = load("cnn-onnxruntime").trials[1].params["provider"]  # the CPU's, or a GPU's where one works
    assert all(n["median_ms"] >= 0 for n in found["trial_nodes"])
    assert provider in {n["provider"] for n in found["trial_nodes"]}
    assert sum(r["trial_ms"] for r in found["by_op_type"]) == pytest.approx(
        sum(n["median_ms"] for n in found["trial_nodes"])
    )
    assert Path("studies/cnn-onnxruntime/profile-1.json").is_file()
    assert main(["report", *STORAGE, "-o", "report.html"]) == 0
    assert "Where the time goes: trial 1 against the baseline (median of 5 runs)" in Path("report.html").read_text()
    assert main(["profile", "best.onnx", *STORAGE]) == 2
    assert "profile takes a trial number, baseline or yours" in capsys.readouterr().err


def test_a_trace_gives_each_nodes_median_and_leaves_control_flow_to_its_subgraphs_nodes() -> None:
    from gpt_optuna.backends.onnxruntime.profiling import node_times

    def kernel(name: str, op: str, us: int) -> dict[str, object]:
        return {"cat": "Node", "name": f"{name}_kernel_time", "dur": us, "args": {"op_name": op, "provider": "CPU"}}

    trace = [
        kernel("If_0", "If", 500),  # its time is its branch's nodes' time, reported below
        *(kernel("If_0_then/Conv", "Conv", us) for us in (300, 100, 200)),
        *(kernel("relu", "Relu", us) for us in (40, 50, 900)),  # an outlier run does not count
        {"cat": "Node", "name": "relu_fence_before", "dur": 7, "args": {"op_name": "Relu"}},
        {"cat": "Session", "name": "model_run", "dur": 900},
    ]
    assert [(n.name, n.op_type, n.median_ms) for n in node_times(trace)] == [
        ("If_0_then/Conv", "Conv", 0.2),
        ("relu", "Relu", 0.05),
    ]


def test_export_says_when_the_verdict_keeps_your_configuration(tmp_path: Path) -> None:
    from gpt_optuna.api.exporting import export_lines

    side = tmp_path / "shipped.onnx.json"
    record = {"trial": 1, "headline": "verdict: ...", "decided": True, "winner": False, "interface": {"changed": False}}
    side.write_text(json.dumps(record | {"your_configuration": {"file": "mine.toml", "is_this_trial": True}}))
    assert "note: the verdict keeps your configuration (mine.toml), trial 1;" in export_lines(side)[-1]
    side.write_text(json.dumps(record | {"trial": 0, "your_configuration": None}))
    assert (
        "note: the verdict keeps the default configuration, so this is the baseline, trial 0;" in export_lines(side)[-1]
    )


def test_a_gpu_providers_host_timed_nodes_are_said_to_be_launch_times() -> None:
    from gpt_optuna.backends.base import NodeTime
    from gpt_optuna.usecases.profile import Profile

    cpu = [NodeTime("conv", "Conv", "CPUExecutionProvider", 0.5)]
    gpu = [
        NodeTime("conv", "Conv", "CUDAExecutionProvider", 0.02),
        NodeTime("gemm", "Gemm", "CUDAExecutionProvider", 0.01),
    ]
    shown = Profile("trial 3", "trial 0", gpu, cpu, 10).lines()
    assert shown[0].startswith("trial 3 against trial 0: operator kernels 0.03 ms against 0.5 ms per run")
    assert any(line.startswith("note: ONNX Runtime times a GPU provider's nodes on the host") for line in shown)
    assert [line.split()[0] for line in shown[2:4]] == ["Conv", "Gemm"]
    assert not any("note:" in line for line in Profile("trial 3", "trial 0", cpu, cpu, 10).lines())


def test_profile_rounds_show_their_spread_and_a_contradiction_of_the_recorded_verdict_is_named() -> None:
    from test_verdict_words import study_confirmed

    from gpt_optuna.backends.base import NodeTime
    from gpt_optuna.study.summary import summarize_study
    from gpt_optuna.usecases.profile import Profile, contradiction

    nodes = [NodeTime("conv", "Conv", "CPUExecutionProvider", 0.5)]
    flips = Profile("trial 1", "trial 0", nodes, nodes, 10, ((67.7, 107.0), (128.6, 100.5), (150.2, 110.0)))
    shown = flips.lines()
    assert "speedup (baseline/trial)" in shown[1] and "over 3 rounds" in shown[0]
    assert any(
        line.startswith("kernels' speedup (baseline/trial) over 3 rounds") and "0.63x to 1.37x" in line
        for line in shown
    )
    assert any(line.startswith("note: the rounds disagree on which is faster") for line in shown)
    assert flips.to_dict()["rounds"][0] == {"baseline_ms": 67.7, "trial_ms": 107.0}

    summary = summarize_study(study_confirmed([2.0, 2.01, 1.99]))  # trial 1 confirmed 2.0x [1.97-2.03]
    said = contradiction(summary, 1, [0.6, 0.8])
    assert said.startswith("the study recorded trial 1 at 2.000x the baseline [95% CI 1.9") and "0.60x to 0.80x" in said
    assert contradiction(summary, 1, [0.9, 1.3]) == "" and contradiction(summary, 1, [1.5, 2.1]) == ""
    assert contradiction(summary, 0, [0.5, 0.6]) == ""  # the baseline against itself
    assert f"note: {said}" in Profile("trial 1", "trial 0", nodes, nodes, 10, flips.rounds, said).lines()


def test_an_inconclusive_comparison_names_what_widened_its_interval() -> None:
    from gpt_optuna.protocol.outcome import Outcome, TrialResult
    from gpt_optuna.study.evidence import judge, speedups
    from gpt_optuna.usecases.compare import Comparison, Side

    labels = np.repeat(np.arange(3), 12)
    scattered = np.exp(np.random.default_rng(5).normal(0.2, 0.4, 12))  # the same rounds in each process
    noisy_rounds = np.array([[1.0, 1 / r] for p in range(3) for r in np.roll(scattered, p)])
    disagreeing = np.array([[1.0, 1 / r * (1 + 0.001 * k)] for r in (0.9, 1.3, 2.0) for k in range(12)])
    sides = Side("trial 0", None), Side("trial 1", None)  # type: ignore[arg-type]
    measured = (TrialResult(Outcome.CRASH, "not run"),) * 2
    said = {}
    for name, rounds in (("rounds", noisy_rounds), ("processes", disagreeing)):
        found = speedups(rounds, labels)[1]
        assert judge(found.low, found.high, 3) == "inconclusive"
        said[name] = Comparison(*sides, measured, found, "inconclusive").lines()[0]
    assert "its rounds scattered within each process" in said["rounds"] and "more --rounds" in said["rounds"]
    assert "the processes disagreed" in said["processes"] and "more --processes" in said["processes"]
