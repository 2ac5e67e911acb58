"""The user's own functions called before the search (a data loader, the metric on the reference
outputs) run under the deadline: one that hangs is stopped at the end of --timeout (or after
--trial-timeout without one; at the end of check's --budget) with one line that names it, leaving
no process and no study behind; one that raises or crashes ends in one line too. Through the real
command, in child processes."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import SYNTHETIC, load

CLI = [sys.executable, "-m", "gpt_optuna.cli"]

USER_CODE = textwrap.dedent(
    """
    import os
    import time
    from pathlib import Path

    import numpy as np


    def _hang():
        Path("hung.pid").write_text(str(os.getpid()))
        while True:  # busy, not sleeping: nothing but a kill stops it
            pass


    def hanging_loader():
        time.sleep(0.1)
        _hang()


    def hanging_metric(outputs, references, inputs):
        _hang()


    def raising_loader():
        raise ValueError("no such shard")


    def raising_metric(outputs, references, inputs):
        raise ValueError("no labels")


    def crashing_loader():
        print("reading the shards ...", flush=True)
        os.abort()


    def loader():
        print("a loader's own output")
        rng = np.random.default_rng(0)
        for _ in range(2):
            yield {"input": rng.standard_normal((1, 3, 64, 64)).astype(np.float32)}
    """
)

TIMEOUT_S = 6
BOUND_S = 3 * TIMEOUT_S
"""The whole command, Python's start included, on a loaded machine: well under the 4x of a bound
that is not kept."""


@pytest.fixture
def user_code(tmp_path: Path) -> Path:
    path = tmp_path / "user_code.py"
    path.write_text(USER_CODE)
    return path


def gpt_optuna(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """The command's result and its wall time; a command that outlives the hard bound is killed."""
    started = time.monotonic()
    result = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=2 * BOUND_S)
    return result, time.monotonic() - started


def tune(cnn_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    return gpt_optuna("tune", str(cnn_path), "--backend", SYNTHETIC, "--n-trials", "1", "--confirm-top", "0", *args)


def error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The command's one error line: exit 2, no traceback, nothing else on stderr but notes before it."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert lines and lines[-1].startswith("gpt-optuna: error: "), lines
    assert sum(line.startswith("gpt-optuna: error: ") for line in lines) == 1, lines
    return lines[-1]


def nothing_left(folder: Path) -> None:
    """The hung function's process is gone, and no study was made."""
    pid = int((folder / "hung.pid").read_text())
    assert not Path(f"/proc/{pid}").exists(), f"the user's function still runs in process {pid}"
    assert not (folder / "studies").exists()


@pytest.mark.slow
def test_a_hanging_data_loader_is_stopped_at_the_end_of_the_timeout(
    cnn_path: Path, tmp_path: Path, user_code: Path
) -> None:
    spec = f"{user_code}:hanging_loader"
    result, wall = tune(cnn_path, "--inputs", spec, "--timeout", str(TIMEOUT_S))
    line = error_line(result)
    assert re.fullmatch(
        rf"gpt-optuna: error: the --inputs data loader {re.escape(spec)} did not return within \d+ s"
        r" \(what was left of --timeout\): it was stopped",
        line,
    ), line
    assert f"waiting for the --inputs data loader {spec} (stopped after" in result.stderr  # said while it ran
    assert wall < BOUND_S, wall
    nothing_left(tmp_path)


@pytest.mark.slow
def test_a_hanging_metric_is_stopped_at_the_end_of_the_timeout(cnn_path: Path, tmp_path: Path, user_code: Path) -> None:
    spec = f"{user_code}:hanging_metric"
    result, wall = tune(cnn_path, "--metric", spec, "--timeout", str(TIMEOUT_S), "-qq")
    assert result.stderr.count("\n") == 1, result.stderr  # -qq: the error alone
    assert error_line(result).startswith(f"gpt-optuna: error: the --metric function {spec} did not return within")
    assert "(what was left of --timeout)" in result.stderr
    assert wall < BOUND_S, wall
    nothing_left(tmp_path)


@pytest.mark.slow
def test_without_a_timeout_user_code_is_stopped_after_the_trial_timeout(
    cnn_path: Path, tmp_path: Path, user_code: Path
) -> None:
    spec = f"{user_code}:hanging_metric"
    result, wall = tune(cnn_path, "--metric", spec, "--trial-timeout", "4", "--quiet")
    line = error_line(result)
    assert line.endswith(f"the --metric function {spec} did not return within 4 s (--trial-timeout): it was stopped")
    assert wall < BOUND_S, wall
    nothing_left(tmp_path)


@pytest.mark.slow
def test_user_code_that_raises_or_crashes_ends_in_one_line(cnn_path: Path, tmp_path: Path, user_code: Path) -> None:
    result, _ = tune(cnn_path, "--inputs", f"{user_code}:raising_loader", "--timeout", "60")
    line = error_line(result)
    assert line == f"gpt-optuna: error: the data loader {user_code}:raising_loader failed: ValueError: no such shard"
    result, _ = tune(cnn_path, "--metric", f"{user_code}:raising_metric", "--timeout", "60")
    line = error_line(result)
    assert line == "gpt-optuna: error: the --metric function failed on the reference outputs: ValueError: no labels"
    result, _ = tune(cnn_path, "--inputs", f"{user_code}:crashing_loader")
    line = error_line(result)
    kept = re.search(r"crashed its process \(worker killed by SIGABRT\); its log: (\S+)$", line)
    assert kept and "reading the shards ..." in Path(kept[1]).read_text(), line  # its own output, and where it died
    Path(kept[1]).unlink()
    Path(kept[1]).parent.rmdir()
    assert not (tmp_path / "studies").exists()


@pytest.mark.slow
def test_a_working_data_loader_still_gives_its_samples(cnn_path: Path, user_code: Path) -> None:
    result, _ = tune(cnn_path, "--inputs", f"{user_code}:loader", "--timeout", "60", "--quiet")
    assert result.returncode == 0, result.stderr
    assert load("cnn-syntheticbackend").get_trials()[0].user_attrs["accuracy"]["samples"] == 2


@pytest.mark.slow
def test_a_hanging_calibration_loader_is_stopped_too(cnn_path: Path, tmp_path: Path, user_code: Path) -> None:
    """Called later, while the space is found (ONNX Runtime offers int8 here): the same deadline."""
    spec = f"{user_code}:hanging_loader"
    result, wall = gpt_optuna("tune", str(cnn_path), "--calibration", spec, "--timeout", str(TIMEOUT_S), "-qq")
    assert error_line(result).startswith(f"gpt-optuna: error: the --calibration data loader {spec} did not return")
    assert wall < BOUND_S, wall
    nothing_left(tmp_path)


@pytest.mark.slow
def test_the_recorded_metric_of_a_check_is_stopped_at_the_end_of_its_budget(cnn_path: Path, tmp_path: Path) -> None:
    metric = tmp_path / "metric.py"
    metric.write_text("def score(outputs, references, inputs):\n    return {'score': 1.0}\n")
    tuned, _ = gpt_optuna(
        "tune", str(cnn_path), "--metric", f"{metric}:score", "--accuracy", "score>=0.5", "--n-trials", "2", "-qq"
    )
    assert tuned.returncode == 0, tuned.stderr
    assert gpt_optuna("export", "-o", "best.onnx", "-qq")[0].returncode == 0
    metric.write_text(USER_CODE.replace("def hanging_metric(", "def score("))  # the metric changed since: it hangs
    result, wall = gpt_optuna("check", str(cnn_path), "--baseline", "best.onnx.json", "--budget", str(TIMEOUT_S), "-qq")
    line = error_line(result)
    assert line.startswith(f"gpt-optuna: error: the recorded --metric function {metric}:score did not return within")
    assert line.endswith("(what was left of --budget): it was stopped") and wall < BOUND_S, (line, wall)
    pid = int((tmp_path / "hung.pid").read_text())
    assert not Path(f"/proc/{pid}").exists()
