"""What a command says and where: notes on stderr, results on stdout, -v, -qq and --log-file, and a
note written above a progress bar, never into it."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from conftest import SYNTHETIC
from tqdm import tqdm

from gpt_optuna.cli import main
from gpt_optuna.core import log
from gpt_optuna.core.errors import UserError


def test_notes_go_to_stderr_and_results_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    log.configure(0)
    say = log.logger("gpt_optuna.usecases.progress")
    say.info("a note")
    say.info("the summary", extra=log.RESULT)
    say.debug("a detail")
    log.tell("a reading command's progress")
    found = capsys.readouterr()
    assert found.err == "a note\n"
    assert found.out == "the summary\na reading command's progress\n"


def test_qq_keeps_only_warnings_errors_and_results_and_v_adds_debug_detail(capsys: pytest.CaptureFixture[str]) -> None:
    log.configure(-2)
    say = log.logger("gpt_optuna.x")
    say.info("a note")
    log.tell("progress")
    say.warning("warning: a warning")
    say.info("the summary", extra=log.RESULT)
    found = capsys.readouterr()
    assert (found.out, found.err) == ("the summary\n", "warning: a warning\n")
    log.configure(1)
    say.debug("a detail")
    assert capsys.readouterr().err == "a detail\n"
    assert log.onnxruntime_severity() == 2  # -v: ONNX Runtime's warnings too; by default errors only
    log.configure(0)
    assert log.onnxruntime_severity() == 3


def test_a_log_file_keeps_every_record_with_its_time_and_a_bad_one_is_one_line(tmp_path: Path) -> None:
    log.configure(0, tmp_path / "run.log")
    log.logger("gpt_optuna.x").debug("a detail")
    log.logger("gpt_optuna.x").info("a note")
    log.configure(0)  # closes the file
    lines = (tmp_path / "run.log").read_text().splitlines()
    messages = [line.split(": ", 1)[1] for line in lines]
    assert messages[0].startswith("gpt-optuna") and messages[1:] == ["a detail", "a note"]  # the command line first
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ \d+ DEBUG gpt_optuna\.x$", lines[1].split(": ")[0])
    with pytest.raises(UserError, match="--log-file"):
        log.configure(0, tmp_path / "no such folder" / "run.log")


def test_a_note_is_written_above_the_progress_bar(capsys: pytest.CaptureFixture[str]) -> None:
    log.configure(0)
    bar = tqdm(total=3, file=sys.stderr, bar_format="{n}/{total} BAR")
    bar.update(1)
    log.logger("gpt_optuna.x").info("a note")
    bar.update(1)
    bar.close()
    err = capsys.readouterr().err
    before, after = err.split("a note\n")
    assert "0/3 BAR" in before and before.endswith(("\r", "\n"))  # the bar cleared: the note on a line of its own
    assert "1/3 BAR" in after  # then the bar drawn again below it


def test_tune_says_its_notes_at_every_verbosity_but_qq(cnn_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    argv = ["tune", str(cnn_path), "--backend", SYNTHETIC, "--n-trials", "2", "--confirm-top", "0"]
    argv += ["--trial-timeout", "60"]  # a trial that hangs (seen after tests/test_layers.py) costs a minute, not ten
    assert main([*argv, "--study-name", "a", "-q", "--log-file", "a.log"]) == 0
    said = capfd.readouterr()
    assert "new study a" in said.err and "verdict: " in said.out
    kept = Path("a.log").read_text()
    assert "INFO gpt_optuna.usecases.progress: new study a" in kept
    assert main([*argv, "--study-name", "b", "-qq"]) == 0
    said = capfd.readouterr()
    assert "new study" not in said.err and "verdict: " in said.out
    assert "warning: no --inputs" in said.err  # a warning is said at every verbosity


def test_the_users_own_handler_takes_the_records_and_a_worker_is_told_the_verbosity(tmp_path: Path) -> None:
    import logging

    from gpt_optuna.protocol.process import Worker

    kept: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: kept.append(record.getMessage())  # type: ignore[method-assign]
    log.LOGGER.handlers.clear()
    log.LOGGER.setLevel(logging.NOTSET)
    log.LOGGER.addHandler(handler)
    log.logger("gpt_optuna.x").info("a note")
    assert kept == ["a note"]  # no terminal handler added, and the level lets progress through
    log.configure(1)
    with Worker(tmp_path / "w.log") as worker:
        assert worker.run(log.verbosity, timeout=60) == 1
    assert os.environ[log.VERBOSITY_ENV] == "0"  # this process's environment is left as it was
    log.configure(0)
