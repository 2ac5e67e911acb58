"""The finalists' re-measurement as a user meets it: stopped, bounded, retried, out of date. Real
worker processes, real signals, real SQLite; the synthetic backend for candidates of known speed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import SYNTHETIC, load, synthetic_config, tune
from optuna.trial import TrialState, create_trial

from gpt_optuna.cli import main
from gpt_optuna.core.errors import EXIT_USER_ERROR
from gpt_optuna.study.summary import summarize_study

STUDY = "cnn-syntheticbackend"
CLI = [sys.executable, "-m", "gpt_optuna.cli"]


@pytest.mark.slow
def test_a_confirmation_stopped_by_ctrl_c_keeps_what_it_measured_and_says_so(cnn_path: Path, tmp_path: Path) -> None:
    """Each finalist builds for a second, so the second of five processes is easy to catch: the
    rounds of the first are kept and shown for what they are (one process: indicative)."""
    config = synthetic_config(tmp_path, 'mode = "ok"\ndelay_us = [100, 50]\nbuild_ms = [1000]')
    argv = [*CLI, "tune", str(cnn_path), "--backend", SYNTHETIC, "--config", str(config), "--n-trials", "3"]
    log = tmp_path / "stderr.txt"
    with log.open("w") as err:
        proc = subprocess.Popen(
            [*argv, "--confirm-top", "2"], stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True
        )
        deadline = time.monotonic() + 120
        while "process 2 of 5" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, log.read_text()
    confirmed = load(STUDY).user_attrs["confirmed"]
    assert confirmed["processes"] == 1 and confirmed["stopped"] == "stopped by Ctrl-C"
    assert confirmed["rounds"] >= 3 and confirmed["planned_processes"] == 5
    assert out.startswith("verdict: indicative: ")
    assert "the re-measurement ended early (stopped by Ctrl-C): these figures are what it measured" in out
    assert "confirm the finalists: gpt-optuna confirm" in out


@pytest.mark.slow
def test_confirm_takes_rounds_and_timeout_and_a_timeout_is_one_line(
    cnn_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = synthetic_config(tmp_path, 'mode = "ok"\ndelay_us = [100, 50]\nbuild_ms = [2000]')
    flags = ["--backend", SYNTHETIC, "--config", str(config), "--n-trials", "3", "--confirm-top", "0"]
    assert tune(str(cnn_path), *flags) == 0
    capsys.readouterr()
    assert main(["confirm", "--top", "1", "--processes", "2", "--rounds", "4"]) == 0
    out = capsys.readouterr().out
    assert load(STUDY).user_attrs["confirmed"]["rounds"] == 8 and "2 fresh processes" in out
    assert "building 2 candidates, 4 rounds" in out

    # every process builds for two seconds: a one-second bound ends the first one; nothing measured is one line
    done = subprocess.run([*CLI, "confirm", "--top", "1", "--timeout", "1s"], capture_output=True, text=True)
    assert done.returncode == EXIT_USER_ERROR and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "gpt-optuna: error: the finalists could not be re-measured: process 1 ran into --timeout"
    ]
    assert load(STUDY).user_attrs["confirmed"]["rounds"] == 8  # the earlier confirmation stands
    assert main(["confirm", "--rounds", "2"]) == EXIT_USER_ERROR


@pytest.mark.slow
def test_a_confirmation_that_no_longer_covers_the_searchs_best_is_not_shown_as_current(
    cnn_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A search resumed after its finalists were confirmed finds a faster candidate (here added as
    if measured): every reader shows the search's figures and says the confirmation is out of date."""
    config = synthetic_config(tmp_path, 'mode = "ok"\ndelay_us = [100, 50]')
    argv = [str(cnn_path), "--backend", SYNTHETIC, "--config", str(config), "--n-trials", "4", "--confirm-top", "2"]
    assert tune(*argv) == 0
    study = load(STUDY)
    before = summarize_study(study)
    assert before.measurement == "confirmed" and before.confirmed is not None
    fastest = min(t.values[0] for t in study.trials if t.state is TrialState.COMPLETE)
    params = {**before.best.params, "a": 7}  # a candidate the search had not tried
    study.add_trial(
        create_trial(
            params=params,
            distributions=before.best.distributions,
            value=fastest / 2,
            user_attrs={"latency": {"median_ms": fastest / 2, "stable": True}, "outcome": "ok", "gpu": "cpu"},
            state=TrialState.COMPLETE,
        )
    )
    after = summarize_study(load(STUDY))
    assert after.verdict == "unconfirmed" and after.measurement == "search" and after.confirmed is None
    assert after.best.number == len(study.trials) - 1 and after.stale_confirmation is not None
    capsys.readouterr()
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("verdict: not confirmed: ") and "no longer covers the search's best" in out
    assert "confirmed in" not in out
    assert main(["best", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["measurement"] == "search"
