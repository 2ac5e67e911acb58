"""Nothing lost, nothing corrupted: refused runs, kills, full disks, read-only studies and bad input,
through the real command in child processes, on real SQLite files and file systems."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import SYNTHETIC, load, matmul_model, save, synthetic_config
from onnx import TensorProto, helper
from optuna.trial import TrialState

CLI = [sys.executable, "-m", "gpt_optuna.cli"]


def gpt_optuna(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)


def one_line_error(result: subprocess.CompletedProcess[str], expected: str) -> None:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert len(lines) == 1 and lines[0].startswith("gpt-optuna: error: ") and expected in lines[0], lines


def digest(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` with its content hash."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }


def integrity(db: Path) -> str:
    with contextlib.closing(sqlite3.connect(db)) as connection:
        return str(connection.execute("PRAGMA integrity_check").fetchone()[0])


@contextlib.contextmanager
def mounted_tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A real small file system, where the machine lets this process mount one."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()[:120]}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


@pytest.mark.slow
def test_a_refused_resume_writes_nothing(cnn_path: Path, tmp_path: Path) -> None:
    """Another model under the same study name is refused before the study folder or database is
    touched: a tuner running on the study keeps judging against its own reference."""
    assert gpt_optuna("tune", str(cnn_path), "--study-name", "S", "--n-trials", "2", "--quiet").returncode == 0
    before, db = digest(Path("studies/S")), Path("studies/S.db").read_bytes()
    other = save(matmul_model(batch=2), tmp_path / "other.onnx")
    one_line_error(gpt_optuna("tune", str(other), "--study-name", "S", "--n-trials", "3"), "the model (content hash)")
    inputs = tmp_path / "x.npz"
    np.savez(inputs, input=np.ones((1, 3, 64, 64), np.float32))
    one_line_error(gpt_optuna("tune", str(cnn_path), "--study-name", "S", "--inputs", str(inputs)), "the input data")
    assert digest(Path("studies/S")) == before and Path("studies/S.db").read_bytes() == db
    calibration = tmp_path / "c.npz"
    np.savez(calibration, input=np.ones((2, 1, 3, 64, 64), np.float32))
    one_line_error(
        gpt_optuna("tune", str(cnn_path), "--study-name", "S", "--calibration", str(calibration)),
        "the calibration data",
    )
    assert digest(Path("studies/S")) == before and Path("studies/S.db").read_bytes() == db
    stamps = {p.name: p.stat().st_mtime_ns for p in Path("studies/S").glob("*.npz")}
    assert "calibration.npz" in stamps
    assert gpt_optuna("tune", str(cnn_path), "--study-name", "S", "--n-trials", "3", "--quiet").returncode == 0
    assert {p.name: p.stat().st_mtime_ns for p in Path("studies/S").glob("*.npz")} == stamps  # not rewritten


def test_a_rejected_run_leaves_no_study_behind(cnn_path: Path, tmp_path: Path) -> None:
    one_line_error(gpt_optuna("tune", "missing.onnx"), "model file not found")
    bad = tmp_path / "bad.npz"
    np.savez(bad, input=np.zeros((1, 3, 8, 8), np.float32))
    one_line_error(gpt_optuna("tune", str(cnn_path), "--inputs", str(bad)), "size 8 on axis 2")
    assert not Path("studies").exists()
    one_line_error(gpt_optuna("status"), "no study found under studies/")


KILLED_AFTER_RESULT = textwrap.dedent(
    """
    import os, signal, sys
    from gpt_optuna.search import objective
    from gpt_optuna.cli import main

    write = objective.set_trial_attrs

    def write_then_die(trial, attrs, limits):
        write(trial, attrs, limits)
        if "outcome" in attrs:  # the result is written; the trial is not complete yet
            os.kill(os.getpid(), signal.SIGKILL)

    objective.set_trial_attrs = write_then_die
    sys.exit(main(sys.argv[1:]))
    """
)


def test_a_kill_after_the_result_attrs_re_evaluates_the_candidate(cnn_path: Path, tmp_path: Path) -> None:
    """The tuner is SIGKILLed between writing the baseline's result attrs and completing it: on
    resume that trial is interrupted and its retry evaluates the candidate again (no copy of a
    failure), so the baseline keeps a value."""
    config = synthetic_config(tmp_path, 'mode = ["ok"]\ndelay_us = [0, 50]\nbuild_ms = [0]')
    argv = ["tune", str(cnn_path), "--backend", SYNTHETIC, "--config", str(config), "--quiet", "--confirm-top", "0"]
    killed = subprocess.run([sys.executable, "-c", KILLED_AFTER_RESULT, *argv, "--n-trials", "4"], capture_output=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    [trial] = load("cnn-syntheticbackend").get_trials()
    assert trial.state is TrialState.RUNNING and trial.user_attrs["outcome"] == "ok"
    assert gpt_optuna(*argv, "--n-trials", "4").returncode == 0
    trials = load("cnn-syntheticbackend").get_trials()
    baseline = [t for t in trials if t.user_attrs.get("baseline")]
    assert [t.state for t in baseline] == [TrialState.FAIL, TrialState.COMPLETE]
    assert "interrupted" in baseline[0].user_attrs and "reused_from" not in baseline[1].user_attrs
    assert not [t for t in trials if t.state is TrialState.RUNNING]
    assert sum(t.state is TrialState.COMPLETE for t in trials) == 4
    status = gpt_optuna("status").stdout
    assert f"baseline (trial {baseline[1].number}): " in status and "no value" not in status
    assert "1 interrupted" in status


@pytest.mark.slow
def test_a_full_disk_stops_with_one_line_and_the_study_resumes(cnn_path: Path, tmp_path: Path) -> None:
    with mounted_tmpfs(tmp_path / "small", "360k") as disk:
        model = Path(disk.parent / "cnn.onnx")
        model.write_bytes(cnn_path.read_bytes())
        config = synthetic_config(tmp_path, 'mode = ["ok"]\ndelay_us = [0]\nbuild_ms = [0]')
        argv = ["tune", str(model), "--backend", SYNTHETIC, "--config", str(config), "--quiet", "--confirm-top", "0"]
        full = gpt_optuna(*argv, "--n-trials", "400", cwd=disk)
        errors = [line for line in full.stderr.splitlines() if line.startswith("gpt-optuna: error: ")]
        assert full.returncode == 2 and "Traceback" not in full.stderr, full.stderr
        assert len(errors) == 1 and "no space left on the device" in errors[0]
        assert not [p for p in disk.rglob("*") if ".tmp" in p.name]
        db = disk / "studies" / "cnn-syntheticbackend.db"
        fate = re.search(r"trial (\d+) (is left running|was marked|was stopped)", errors[0])
        if db.is_file():
            assert integrity(db) == "ok"
            status = gpt_optuna("status", cwd=disk)
            if fate is not None and fate[2] == "is left running":  # even marking it could not be written
                assert f"running with no tuner alive on this host: trial {fate[1]} " in status.stdout, status.stdout
            else:
                assert " 0 running" in status.stdout, (errors[0], status.stdout)
        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
        assert gpt_optuna(*argv, "--n-trials", "30", cwd=disk).returncode == 0
        os.chdir(disk)
        trials = load("cnn-syntheticbackend").get_trials()
        assert not [t for t in trials if t.state is TrialState.RUNNING]
        assert sum(t.state is TrialState.COMPLETE for t in trials) >= 30 - sum(
            t.state is TrialState.FAIL for t in trials
        )
        assert integrity(db) == "ok"


@pytest.mark.slow
def test_a_read_only_study_is_read_and_left_as_it_is(cnn_path: Path, tmp_path: Path) -> None:
    with mounted_tmpfs(tmp_path / "ro", "64m") as disk:
        argv = ["tune", str(cnn_path), "--n-trials", "3", "--quiet", "--confirm-top", "0"]
        assert gpt_optuna(*argv, cwd=disk).returncode == 0
        before = digest(disk)
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        for command in (["status"], ["best", "--json"]):
            result = gpt_optuna(*command, cwd=disk)
            assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
        report = gpt_optuna("report", "-o", str(tmp_path / "r.html"), cwd=disk)
        assert report.returncode == 0 and (tmp_path / "r.html").is_file(), report.stderr
        one_line_error(gpt_optuna(*argv[:2], "--n-trials", "4", cwd=disk), "read-only")
        subprocess.run(["mount", "-o", "remount,rw", str(disk)], check=True)
        assert digest(disk) == before


def test_readers_create_nothing_and_explicit_folders_are_not_made(tmp_path: Path) -> None:
    journal = tmp_path / "missing.journal"
    one_line_error(gpt_optuna("status", "--storage", f"journal:{journal}", "--study-name", "x"), "no study file")
    assert not journal.exists()
    one_line_error(
        gpt_optuna("status", "--storage", f"sqlite:///{tmp_path}/nope/x.db", "--study-name", "x"), "no study database"
    )
    assert not (tmp_path / "nope").exists()


def test_two_tuners_creating_one_new_database_both_run(cnn_path: Path) -> None:
    argv = [*CLI, "tune", str(cnn_path), "--n-trials", "3", "--quiet", "--confirm-top", "0", "--storage"]
    runs = [
        subprocess.Popen(
            [*argv, "sqlite:///studies/shared.db", "--study-name", name], stderr=subprocess.PIPE, text=True
        )
        for name in ("first", "second")
    ]
    for run in runs:
        _, err = run.communicate(timeout=300)
        assert run.returncode == 0 and "Traceback" not in err, err


def _open_new_database(url: str, barrier: object, results: object) -> None:
    import optuna

    from gpt_optuna.study.storage import open_storage

    barrier.wait()  # type: ignore[attr-defined]
    try:
        optuna.create_study(storage=open_storage(url), study_name=f"s{os.getpid()}")
        results.put("ok")  # type: ignore[attr-defined]
    except Exception as exc:  # the test reports what any opener met
        results.put(f"{type(exc).__name__}: {exc}")  # type: ignore[attr-defined]


def test_many_processes_opening_one_new_database_at_once_all_open_it(tmp_path: Path) -> None:
    """SQLite answers the losers of the race to switch a new file to WAL at once, without waiting
    (before the storage tried again, this failed in each of six runs: "database is locked")."""
    import multiprocessing

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    context = multiprocessing.get_context("fork")
    for round_ in range(4):
        url = f"sqlite:///{tmp_path}/new{round_}.db"
        barrier, results = context.Barrier(8), context.Queue()
        openers = [context.Process(target=_open_new_database, args=(url, barrier, results)) for _ in range(8)]
        for opener in openers:
            opener.start()
        outcomes = [results.get(timeout=120) for _ in openers]
        for opener in openers:
            opener.join()
        assert outcomes == ["ok"] * 8, outcomes
        with contextlib.closing(sqlite3.connect(tmp_path / f"new{round_}.db")) as db:
            assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            assert db.execute("SELECT COUNT(*) FROM studies").fetchone()[0] == 8


@pytest.mark.parametrize(
    "toml, expected",
    [
        ("shape = 5", "shape must be a string or a list of strings, got 5"),
        ("model = 5", "model must be a string, got 5"),
        ("measure = 5", "[measure] must be a table"),
        ('n_trials = "abc"', "n_trials must be an integer, got 'abc'"),
        ("timeout = true", "timeout must be a duration"),
        ('[measure]\nbudget_s = "fast"', "[measure] budget_s must be a number"),
        ("space = [1]", "[space] must be a table"),
    ],
)
def test_toml_values_of_the_wrong_type_name_the_key(cnn_path: Path, tmp_path: Path, toml: str, expected: str) -> None:
    config = tmp_path / "tune.toml"
    config.write_text(toml + "\n")
    one_line_error(gpt_optuna("tune", str(cnn_path), "--config", str(config)), expected)


def test_report_and_export_refuse_paths_they_cannot_write(cnn_path: Path, tmp_path: Path) -> None:
    assert gpt_optuna("tune", str(cnn_path), "--n-trials", "2", "--quiet", "--confirm-top", "0").returncode == 0
    one_line_error(gpt_optuna("report", "-o", str(tmp_path / "missing" / "r.html")), "does not exist")
    one_line_error(gpt_optuna("export", "-o", str(tmp_path)), "is a folder")
    one_line_error(gpt_optuna("export", "-o", str(tmp_path / "missing" / "m.onnx")), "does not exist")


def nan_model(tmp_path: Path) -> Path:
    """log(x) of N(0, 1) inputs: NaN for every negative value."""
    graph = helper.make_graph(
        [helper.make_node("Log", ["x"], ["y"])],
        "nan",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return save(model, tmp_path / "nan.onnx")


@pytest.mark.slow
def test_reference_outputs_that_are_nan_are_refused_and_near_constant_ones_warned(tmp_path: Path) -> None:
    one_line_error(gpt_optuna("tune", str(nan_model(tmp_path))), "is NaN or Inf on these inputs")
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "tiny"], ["y"])],
        "flat",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])],
        [onnx.numpy_helper.from_array(np.array(1e-9, np.float32), "tiny")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    result = gpt_optuna("tune", str(save(model, tmp_path / "flat.onnx")), "--n-trials", "2", "--quiet")
    assert result.returncode == 0 and "output 'y' is near-constant on the generated inputs" in result.stderr
    assert "--inputs" in result.stderr


def test_a_search_without_a_feasible_candidate_exits_3(cnn_path: Path, tmp_path: Path) -> None:
    config = synthetic_config(tmp_path, 'mode = ["nan", "noisy"]\ndelay_us = [0]\nbuild_ms = [0]')
    argv = ["tune", str(cnn_path), "--backend", SYNTHETIC, "--config", str(config), "--n-trials", "3", "--quiet"]
    argv += ["--accuracy", "max_abs<=-1"]  # nothing meets it, the baseline included
    result = gpt_optuna(*argv)
    assert result.returncode == 3 and "no candidate met the accuracy criterion" in result.stderr


def test_exit_codes_are_documented_and_a_closed_pipe_ends_quietly(cnn_path: Path) -> None:
    help_text = gpt_optuna("--help").stdout
    assert all(f"  {code} " in help_text for code in ("0", "1", "2", "3", "4", "5", "130"))
    assert "143 by SIGTERM" in help_text and "129 by SIGHUP" in help_text
    assert gpt_optuna("tune", str(cnn_path), "--n-trials", "2", "--quiet", "--confirm-top", "0").returncode == 0
    piped = subprocess.run(f"{sys.executable} -m gpt_optuna.cli status | head -c 5", shell=True, capture_output=True)
    assert piped.returncode == 0 and b"Traceback" not in piped.stderr and b"BrokenPipe" not in piped.stderr


@pytest.mark.slow
def test_ctrl_c_during_the_finalists_prints_the_summary_and_what_next(cnn_path: Path, tmp_path: Path) -> None:
    config = synthetic_config(tmp_path, 'mode = ["ok"]\ndelay_us = [0, 50, 100]\nbuild_ms = [1000]')
    argv = [*CLI, "tune", str(cnn_path), "--backend", SYNTHETIC, "--config", str(config), "--n-trials", "4", "--quiet"]
    run = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert run.stderr is not None
    for line in run.stderr:
        if "re-measuring" in line:
            break
    run.send_signal(signal.SIGINT)
    out, err = run.communicate(timeout=120)
    assert run.returncode == 130 and "Traceback" not in err, err
    assert (
        "re-measurement was stopped by Ctrl-C" in err and "confirm the finalists: gpt-optuna confirm --storage" in out
    )
    assert "study cnn-syntheticbackend: 4 complete" in out and "&& gpt-optuna tune" in out


def timed(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """The command's result and its own account of its time (the summary's ``took`` line: from its
    start, after Python and the libraries loaded, which no --timeout can bound)."""
    result = gpt_optuna(*args)
    took = re.search(r"^took ([\d.]+) s", result.stdout, re.M)
    assert took, result.stdout
    return result, float(took[1])


@pytest.mark.slow
def test_timeout_bounds_the_whole_run_and_keeps_time_to_confirm_the_finalists(cnn_path: Path, tmp_path: Path) -> None:
    """--timeout bounds everything, the space check and the finalists' re-measurement included, and
    the search leaves the time the re-measurement needs, as measured from the search's own builds."""
    config = synthetic_config(tmp_path, 'mode = ["ok"]\ndelay_us = [0, 50, 100]\nbuild_ms = [500]')
    argv = ["tune", str(cnn_path), "--backend", SYNTHETIC, "--config", str(config), "--quiet"]
    result, wall = timed(*argv, "--timeout", "20")
    assert result.returncode == 0, result.stderr
    assert wall <= 20 * 1.05, wall
    assert re.search(r"\((confirmed|indicative)\)", result.stdout) and "re-measuring the" in result.stderr
    assert "checking the space 1/1: graph_fusion none, precision fp32 ..." in result.stderr

    short, wall = timed(*argv, "--timeout", "6", "--study-name", "short")
    assert short.returncode == 0 and wall <= 6 * 1.05, (wall, short.stderr)
    fitted = re.search(r"\((confirmed|indicative)\)", short.stdout) and "what fit in --timeout" in short.stderr
    assert fitted or "no time left before --timeout to re-measure the finalists" in short.stderr, short.stderr
    space = gpt_optuna("space", str(cnn_path))
    assert ": graph_fusion none, precision int8 ..." in space.stderr


@pytest.mark.slow
def test_a_trial_that_would_overrun_the_timeout_is_stopped_and_queued_again(cnn_path: Path, tmp_path: Path) -> None:
    """Every searched candidate builds for 30 s: the first one started runs into the time --timeout
    keeps for the end, is stopped there, and waits in the study for the next run."""
    config = synthetic_config(tmp_path, 'mode = ["ok"]\ndelay_us = [100]\nbuild_ms = [30000]')
    argv = ["tune", str(cnn_path), "--backend", SYNTHETIC, "--config", str(config), "--quiet", "--no-seeds"]
    result, wall = timed(*argv, "--timeout", "12")
    assert result.returncode == 0, result.stderr
    assert wall <= 12 * 1.05, wall
    trials = load("cnn-syntheticbackend").get_trials()
    stopped = [
        t for t in trials if t.user_attrs.get("interrupted") == "stopped: the search's share of --timeout was spent"
    ]
    assert len(stopped) == 1 and stopped[0].state is TrialState.FAIL
    assert [t.params for t in trials if t.state is TrialState.WAITING] == [stopped[0].params]


def test_help_names_every_backend_and_objective_and_generic_model_names_get_their_folder(tmp_path: Path) -> None:
    from gpt_optuna.search.config import default_study_name

    wide = {**os.environ, "COLUMNS": "400"}  # one line per option: no word broken at a hyphen
    help_text = subprocess.run([*CLI, "tune", "--help"], capture_output=True, text=True, env=wide).stdout
    assert all(name in help_text for name in ("tensorrt-rtx", "tensorrt (10.x/11.x)", "module:Class"))
    assert all(name in help_text for name in ("error", "memory", "build_s", "--objectives latency,error"))
    first, second = tmp_path / "minilm" / "model.onnx", tmp_path / "magika" / "model.onnx"
    assert default_study_name(first, "onnxruntime") == "minilm-model-onnxruntime"
    assert default_study_name(second, "onnxruntime") == "magika-model-onnxruntime"
    assert default_study_name(tmp_path / "resnet50.onnx", "tensorrt") == "resnet50-tensorrt"


@pytest.mark.slow
def test_corrupted_cached_data_is_rebuilt_or_repaired_never_failing_trials_one_by_one(
    cnn_path: Path, tmp_path: Path
) -> None:
    """The study folder's reference outputs overwritten behind the tuner's back (their stamp intact):
    a resumed search writes them again from what it computed, and confirm and export, which have
    only the study, copy them again from the artifact store, checked against the recorded hash."""
    config = synthetic_config(tmp_path, 'mode = ["ok"]\ndelay_us = [0, 50]\nbuild_ms = [0]')
    base = ["tune", str(cnn_path), "--backend", SYNTHETIC, "--config", str(config), "--quiet", "--confirm-top", "0"]
    assert gpt_optuna(*base, "--n-trials", "2").returncode == 0
    reference = Path("studies/cnn-syntheticbackend/reference.npz")
    good = reference.read_bytes()
    reference.write_bytes(b"garbage" * 100)
    resumed = gpt_optuna(*base, "--n-trials", "4")
    assert resumed.returncode == 0, resumed.stderr
    assert reference.read_bytes() == good
    trials = load("cnn-syntheticbackend").get_trials()
    assert len(trials) == 4 and all(t.state is TrialState.COMPLETE for t in trials)

    reference.write_bytes(b"garbage" * 100)
    confirmed = gpt_optuna("confirm", "--top", "1", "--processes", "1")
    assert confirmed.returncode == 0, confirmed.stderr
    assert reference.read_bytes() == good
    reference.write_bytes(b"garbage" * 100)
    assert gpt_optuna("export", "-o", "best").returncode == 0
    assert reference.read_bytes() == good and Path("best.onnx.reference.npz").read_bytes() == good


@pytest.mark.slow
def test_without_a_terminal_each_trial_is_one_line_with_its_outcome(cnn_path: Path, tmp_path: Path) -> None:
    """Where stderr is no terminal (a CI log), the search writes one line per trial, its outcome
    and reason on it, and no redrawn bar; then the re-measurement and the time by phase."""
    config = synthetic_config(tmp_path, 'mode = ["ok", "noisy", "build_error"]\ndelay_us = [0, 50]\nbuild_ms = [0]')
    argv = ["tune", str(cnn_path), "--backend", SYNTHETIC, "--config", str(config), "--n-trials", "8"]
    result = gpt_optuna(*argv, "--sampler", "random", "--seed", "1", "--confirm-top", "1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "\r" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if re.match(r"trial \d+ ", line)]
    assert [int(re.match(r"trial (\d+) \((\d+)/8\): ", line)[2]) for line in lines] == list(range(1, 9)), lines
    outcomes = [line.split(": ", 1)[1] for line in lines]
    assert any(o.startswith("infeasible: ") for o in outcomes) and any(o.startswith("failed (") for o in outcomes)
    assert all(re.match(r"([\d.]+ ms|infeasible: .+|failed \(\w+\): .+); best ", o) for o in outcomes), outcomes
    assert "re-measuring the 1 best candidate and" in result.stderr and "took " in result.stdout
