"""End to end through the command line, in process: real ONNX Runtime, SQLite and workers."""

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import SYNTHETIC, load, matmul_model, save, synthetic_config, tune
from optuna.trial import TrialState

from gpt_optuna.cli import main


def test_search_starts_with_the_baseline_and_reports_the_best(
    cnn_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert tune(str(cnn_path), "--n-trials", "6", "--seed", "0", "--confirm-top", "0") == 0
    out = capsys.readouterr().out
    assert out.startswith("verdict: ") and "baseline (trial 0)" in out and "--n-trials 16" in out
    assert f"extend with: cd {Path.cwd()} && gpt-optuna tune" in out
    storage = f"sqlite:///{Path.cwd()}/studies/cnn-onnxruntime.db"
    assert f"report: gpt-optuna report --storage {storage} --study-name cnn-onnxruntime -o" in out
    study = load("cnn-onnxruntime")
    trials = study.get_trials()
    assert len(trials) == 6
    baseline = trials[0]
    assert baseline.user_attrs["baseline"] is True
    assert baseline.params["provider"] == "CPUExecutionProvider"
    assert baseline.params["graph_optimization_level"] == "ORT_ENABLE_ALL"
    for t in trials:
        if t.state is TrialState.COMPLETE:
            assert t.value == t.user_attrs["latency"]["median_ms"] > 0
            assert t.user_attrs["accuracy"]["cosine"] > 0.9999
            assert t.user_attrs["latency"]["samples"] >= 10
    assert main(["best", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert {"number", "params", "latency_ms", "baseline_latency_ms", "speedup", "accuracy"} <= set(record)
    assert record["dry_run"] is False
    best = min((t for t in trials if t.state is TrialState.COMPLETE), key=lambda t: t.value)
    assert record["latency_ms"] == best.value and record["params"] == best.params
    assert record["baseline_latency_ms"] == baseline.value
    assert record["speedup"] == pytest.approx(baseline.value / best.value)
    assert main(["status", "--study-name", "cnn-onnxruntime"]) == 0
    # Which candidates meet the criterion is the sampler's draw; that status counts what the study holds is not.
    complete = sum(t.state is TrialState.COMPLETE for t in trials)
    pruned = sum(t.state is TrialState.PRUNED for t in trials)
    assert complete >= 1 and complete + pruned == 6
    assert f"{complete} complete, {pruned} infeasible, 0 failed" in capsys.readouterr().out


@pytest.mark.slow
def test_resume_accumulates_trials_and_redoes_nothing(cnn_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert tune(str(cnn_path), "--n-trials", "4", "--seed", "1") == 0
    first = [(t.number, t.datetime_start, t.value) for t in load("cnn-onnxruntime").get_trials()]
    assert tune(str(cnn_path), "--n-trials", "7", "--seed", "1") == 0
    trials = load("cnn-onnxruntime").get_trials()
    assert len(trials) == 7
    assert [(t.number, t.datetime_start, t.value) for t in trials[:4]] == first
    assert sum(1 for t in trials if t.user_attrs.get("baseline")) == 1
    assert tune(str(cnn_path), "--n-trials", "7") == 0  # nothing left to do
    assert len(load("cnn-onnxruntime").get_trials()) == 7
    assert "already has its trials" in capsys.readouterr().err


@pytest.mark.slow
def test_resume_with_other_model_or_criterion_is_refused(
    cnn_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert tune(str(cnn_path), "--n-trials", "2") == 0
    capsys.readouterr()
    other = tmp_path / "other" / "cnn.onnx"
    other.parent.mkdir()
    save(matmul_model(batch=1), other)
    assert tune(str(other), "--n-trials", "3") == 2
    err = capsys.readouterr().err
    assert "different configuration" in err and "the model (content hash)" in err
    assert tune(str(cnn_path), "--n-trials", "3", "--accuracy", "max_abs<=1e-3") == 2
    assert "the accuracy criterion: 'cosine>=0.9999' in the study, 'max_abs<=0.001' now" in capsys.readouterr().err
    assert len(load("cnn-onnxruntime").get_trials()) == 2


@pytest.mark.slow
def test_dynamic_shapes_and_given_inputs(mlp_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert tune(str(mlp_path), "--n-trials", "2") == 2
    assert "give the sizes you will run it with, --shape x:<batch>x16" in capsys.readouterr().err
    feeds = tmp_path / "feeds.npz"
    np.savez(feeds, x=np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32))
    assert (
        tune(str(mlp_path), "--n-trials", "2", "--inputs", str(feeds), "--accuracy", "topk(1)>=1 and max_abs<=1e-4")
        == 0
    )
    reference = np.load("studies/mlp-onnxruntime/reference.npz")["probs"]
    assert reference.shape == (1, 3, 8)  # one sample, on the study's sample axis
    assert tune(str(mlp_path), "--n-trials", "2", "--shape", "x:5x16", "--study-name", "mlp5") == 0
    assert np.load("studies/mlp5/inputs.npz")["x"].shape == (1, 5, 16)


@pytest.mark.slow
def test_crash_hang_raise_fail_their_trials_build_errors_are_pruned_and_the_study_goes_on(
    tmp_path: Path, cnn_path: Path
) -> None:
    config = synthetic_config(
        tmp_path, 'mode = ["ok", "crash", "abort", "hang", "raise", "build_error"]\ndelay_us = [0]\nbuild_ms = [0]'
    )
    argv = [str(cnn_path), "--backend", SYNTHETIC, "--config", str(config), "--n-trials", "22"]
    assert tune(*argv, "--trial-timeout", "2", "--sampler", "random", "--seed", "3") == 0
    trials = load("cnn-syntheticbackend").get_trials()
    assert len(trials) == 22
    by_mode: dict[str, list] = {}
    for t in trials:
        by_mode.setdefault(t.params["mode"], []).append(t)
    assert set(by_mode) == {"ok", "crash", "abort", "hang", "raise", "build_error"}
    expected = {
        "crash": ("crash", "SIGSEGV"),
        "abort": ("crash", "SIGABRT"),
        "hang": ("timeout", "no answer within 2 s"),
        "raise": ("exception", "RuntimeError: synthetic failure in build"),
        "build_error": ("build_error", "synthetic build error"),
    }
    for mode, (outcome, detail) in expected.items():
        for t in by_mode[mode]:  # a build error would fail again: pruned, with a constraint to learn from
            assert t.state is (TrialState.PRUNED if mode == "build_error" else TrialState.FAIL)
            assert t.user_attrs["outcome"] == outcome
            assert detail in t.user_attrs["failure"]
            assert (t.constraints.get("failure", 0) > 0) is (mode == "build_error")
    assert all(t.state is TrialState.COMPLETE for t in by_mode["ok"])
    evaluated_crash = [t for t in by_mode["crash"] if "reused_from" not in t.user_attrs]
    assert "Segmentation fault" in evaluated_crash[0].user_attrs["log"]


def test_infeasible_candidates_are_pruned_with_their_errors_and_a_constraint(tmp_path: Path, cnn_path: Path) -> None:
    config = synthetic_config(tmp_path, 'mode = ["ok", "nan", "noisy"]\ndelay_us = [0]\nbuild_ms = [0]')
    assert (
        tune(
            str(cnn_path),
            "--backend",
            SYNTHETIC,
            "--config",
            str(config),
            "--n-trials",
            "12",
            "--sampler",
            "random",
            "--seed",
            "0",
        )
        == 0
    )
    trials = load("cnn-syntheticbackend").get_trials()
    pruned = [t for t in trials if t.state is TrialState.PRUNED]
    assert {t.params["mode"] for t in pruned} == {"nan", "noisy"}
    for t in pruned:
        assert t.user_attrs["outcome"] == "infeasible"
        assert t.constraints["accuracy"] > 0
        if t.params["mode"] == "nan":
            assert "contains NaN" in t.user_attrs["infeasible"]
        else:
            assert "fails cosine>=0.9999" in t.user_attrs["infeasible"]
            assert t.user_attrs["accuracy"]["cosine"] < 0.9999
    for t in trials:
        if t.state is TrialState.COMPLETE:
            assert t.constraints["accuracy"] <= 0


def test_a_one_point_space_ends_after_its_one_candidate(
    tmp_path: Path, cnn_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = synthetic_config(tmp_path, 'mode = ["ok"]\ndelay_us = [100]\nbuild_ms = [0]\na = [0]\nb = [0]\nc = ["x"]')
    assert tune(str(cnn_path), "--backend", SYNTHETIC, "--config", str(config), "--n-trials", "50") == 0
    trials = load("cnn-syntheticbackend").get_trials()
    assert trials[0].user_attrs["baseline"] and trials[0].params["delay_us"] == 200  # the engine's default
    assert trials[1].params["delay_us"] == 100  # the one searched
    assert len(trials) == 2 and "reused_from" not in trials[1].user_attrs  # covered: no repeat costs a trial
    out, err = capsys.readouterr()
    assert "the space is covered" in err
    assert "extend with" not in out and "report: gpt-optuna report" in out  # more trials would find nothing


@pytest.mark.gpu
def test_gpu_search_tunes_the_cuda_provider_and_cpu_on_request(cnn_path: Path, tmp_path: Path) -> None:
    assert tune(str(cnn_path), "--n-trials", "8", "--seed", "0", "--accuracy", "cosine>=0.999") == 0
    trials = load("cnn-onnxruntime").get_trials()
    assert trials[0].params["provider"] == "CUDAExecutionProvider"
    complete = [t for t in trials if t.state is TrialState.COMPLETE]
    assert len(complete) >= 6
    assert {t.params.get("cuda.enable_cuda_graph", False) for t in trials} == {False, True}
    for t in complete:
        assert t.value == t.user_attrs["latency"]["median_ms"] > 0
    cpu = tmp_path / "cpu.toml"
    cpu.write_text('[space]\nprovider = "CPUExecutionProvider"\n')
    assert tune(str(cnn_path), "--n-trials", "3", "--config", str(cpu), "--study-name", "cnn-cpu") == 0
    assert {t.params["provider"] for t in load("cnn-cpu").get_trials()} == {"CPUExecutionProvider"}


def test_the_gp_sampler_runs_past_its_startup_trials(cnn_path: Path, tmp_path: Path) -> None:
    """GPSampler samples at random for its first 10 trials and then fits a Gaussian process (torch
    and scipy, the ``gp`` extra): 12 trials cross that point."""
    pytest.importorskip("torch", reason="the gp extra installs torch")
    pytest.importorskip("scipy", reason="the gp extra installs scipy")
    config = synthetic_config(tmp_path, 'mode = ["ok"]\ndelay_us = [0, 20, 40, 60, 80, 100]\nbuild_ms = [0, 1, 2]')
    argv = [str(cnn_path), "--backend", SYNTHETIC, "--config", str(config), "--sampler", "gp", "--seed", "0"]
    assert tune(*argv, "--n-trials", "12", "--confirm-top", "0") == 0
    trials = load("cnn-syntheticbackend").get_trials()
    assert len(trials) == 12 and all(t.state is TrialState.COMPLETE for t in trials)


def test_the_space_check_is_remembered_for_a_resume_and_the_space_command(
    cnn_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Checked once per model, backend, versions, GPU and space: a resume and ``gpt-optuna space``
    beside the study reuse it (and its notes); another space is checked anew."""
    config = tmp_path / "tune.toml"
    config.write_text('[measure]\nbudget_s = 0.05\n[space]\nprecision = ["fp32", "fp16"]\n')
    base = [str(cnn_path), "--config", str(config), "--confirm-top", "0"]
    assert tune(*base, "--n-trials", "1") == 0
    first = capsys.readouterr().err
    assert "checking the space 2/2: graph_fusion none, precision fp16 ..." in first
    assert "checked the space: 2 graph variants in " in first
    assert tune(*base, "--n-trials", "2") == 0
    resumed = capsys.readouterr().err
    assert "checking the space: as checked before" in resumed and "precision fp16 ..." not in resumed
    assert main(["space", *base[:3]]) == 0
    assert "checking the space: as checked before" in capsys.readouterr().err
    config.write_text('[measure]\nbudget_s = 0.05\n[space]\nprecision = ["fp32", "int8"]\n')
    assert tune(*base, "--n-trials", "3") == 2  # checked anew, then refused: the study has another space
    other = capsys.readouterr().err
    assert "checking the space 2/2: graph_fusion none, precision int8 ..." in other and "the search space" in other


def test_a_model_file_named_with_spaces_and_accents_is_searched_and_read(
    cnn_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    model = cnn_path.with_name("modèle vidéo (v2).onnx")
    cnn_path.rename(model)
    config = synthetic_config(tmp_path, 'mode = "ok"\ndelay_us = [0, 50]')
    argv = [str(model), "--backend", SYNTHETIC, "--config", str(config), "--n-trials", "3", "--confirm-top", "0"]
    assert tune(*argv) == 0
    database = tmp_path / "studies" / "modele_video_v2-syntheticbackend.db"
    assert database.is_file()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    assert main(["status", "--storage", str(database)]) == 0
    assert "study modele_video_v2-syntheticbackend: 3 complete" in capsys.readouterr().out


def test_storage_may_be_an_sqlite_files_path(
    cnn_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = synthetic_config(tmp_path, 'mode = "ok"\ndelay_us = [0, 50]')
    (tmp_path / "my studies").mkdir()
    where = ["--storage", "my studies/cnn.db", "--study-name", "cnn"]
    argv = [str(cnn_path), "--backend", SYNTHETIC, "--config", str(config), "--n-trials", "2", *where]
    assert tune(*argv, "--confirm-top", "0") == 0
    assert f"--storage 'sqlite:///{tmp_path}/my studies/cnn.db'" in capsys.readouterr().out
    assert main(["status", *where]) == 0
    assert "study cnn: 2 complete" in capsys.readouterr().out
