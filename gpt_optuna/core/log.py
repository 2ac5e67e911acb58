"""The package's logging: one logger (``gpt_optuna``), one handler for the terminal that writes
beside a progress bar, the verbosity the command line sets (``-v``, ``-q``, ``--log-file``), and the
level the engines' own logs follow (in the tuner and in the workers it starts, which are told it).

Like Optuna's, the logger has a handler of its own and does not propagate: from Python, the API
says what the command line says. To take its records into your own logging instead, add your
handler to ``logging.getLogger("gpt_optuna")`` before the first call (the terminal handler is then
left out) or set its ``propagate``."""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from tqdm import tqdm

from gpt_optuna.core.errors import UserError

LOGGER = logging.getLogger("gpt_optuna")
TO_STDOUT = {"stdout": True}
"""``extra`` of a record written to stdout beside a command's results: the progress of
``confirm``, ``compare``, ``profile`` and ``check``."""
RESULT = {"stdout": True, "result": True}
"""``extra`` of a record that is a command's result (a study's summary, a verdict): on stdout, and
shown at every verbosity."""
VERBOSITY_ENV = "GPT_OPTUNA_VERBOSITY"
"""The verbosity in a worker process's environment (:class:`~gpt_optuna.protocol.process.Worker` sets it)."""
_FILE_FORMAT = "%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"


class Terminal(logging.Handler):
    """Each record's message as it is, on stderr (stdout where the record asks: :data:`TO_STDOUT`),
    through tqdm, which clears a progress bar on that stream and draws it again below the line.
    ``quiet``: only warnings, errors and results (:data:`RESULT`)."""

    def __init__(self, level: int, quiet: bool = False) -> None:
        super().__init__(level)
        self.quiet = quiet

    def filter(self, record: logging.LogRecord) -> bool:
        loud = record.levelno >= logging.WARNING or getattr(record, "result", False)
        return (loud or not self.quiet) and super().filter(record)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = sys.stdout if getattr(record, "stdout", False) else sys.stderr
            tqdm.write(self.format(record), file=stream)
            stream.flush()
        except Exception:
            self.handleError(record)


class LogFile(logging.FileHandler):
    """``--log-file``: every record appended to the file, which starts with the command line (a file
    that cannot take it, missing or on a full device, is refused in one line); a write that fails
    later (the disk filled up) stops the logging to it, said in one warning line."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, encoding="utf-8", delay=True)
        self.setFormatter(logging.Formatter(_FILE_FORMAT))
        try:
            self.stream = self._open()
            line = shlex.join(["gpt-optuna", *sys.argv[1:]])
            command = LOGGER.makeRecord(LOGGER.name, logging.INFO, __file__, 0, "%s", (line,), None)
            self.stream.write(self.format(command) + self.terminator)
            self.stream.flush()
        except OSError as exc:
            with contextlib.suppress(OSError):
                self.close()
            raise UserError(f"--log-file {path}: {exc.strerror or exc}") from None

    def handleError(self, record: logging.LogRecord) -> None:
        exc = sys.exc_info()[1]
        if not isinstance(exc, OSError):  # a record that cannot be formatted: a bug, told as logging tells it
            super().handleError(record)
            return
        LOGGER.removeHandler(self)
        with contextlib.suppress(OSError):
            self.close()
        LOGGER.warning(f"warning: --log-file {self.baseFilename}: {exc.strerror or exc}; nothing more is written to it")


def level_of(verbosity: int) -> int:
    """The level of what is said: debug detail from ``-v``, else progress and notes."""
    return logging.DEBUG if verbosity > 0 else logging.INFO


QUIETEST = -2
"""``-qq``: only warnings, errors and results (``-q`` alone only hides the progress bar)."""


_verbosity: int | None = None


def verbosity() -> int:
    """The verbosity :func:`configure` set in this process, else the one the process was started
    with (a worker's), else 0."""
    if _verbosity is not None:
        return _verbosity
    try:
        return int(os.environ.get(VERBOSITY_ENV, "0"))
    except ValueError:
        return 0


def configure(verbose: int = 0, log_file: Path | None = None) -> None:
    """The terminal at ``verbose``'s level (:func:`level_of`, :data:`QUIETEST`), and every record,
    debug detail included, appended to ``log_file``; the workers started afterwards follow the same
    verbosity."""
    global _verbosity
    _verbosity = verbose
    for handler in list(LOGGER.handlers):
        LOGGER.removeHandler(handler)
        handler.close()
    terminal = Terminal(level_of(verbose), quiet=verbose <= QUIETEST)
    LOGGER.addHandler(terminal)
    level = terminal.level
    if log_file is not None:
        LOGGER.addHandler(LogFile(log_file))
        level = logging.DEBUG
    LOGGER.setLevel(level)
    LOGGER.propagate = False


def logger(name: str) -> logging.Logger:
    """The logger of module ``name`` (under ``gpt_optuna``), with the terminal handler where nothing
    configured one: the Python API, in a script or a notebook, says what the command line says."""
    if not LOGGER.handlers:
        configure(verbosity())
    elif LOGGER.level == logging.NOTSET:  # the user's handler, at our level
        LOGGER.setLevel(level_of(verbosity()))
    return logging.getLogger(name)


def to_worker_stderr() -> None:
    """A worker process's logging: every record at its verbosity on its stderr (the worker's log file)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(_FILE_FORMAT))
    LOGGER.addHandler(handler)
    LOGGER.setLevel(level_of(verbosity()))
    LOGGER.propagate = False


def onnxruntime_severity() -> int:
    """ONNX Runtime's log severity for our verbosity: errors only by default (its warnings would
    break through the progress bar), warnings from ``-v``, everything from ``-vv``."""
    return 0 if verbosity() > 1 else 2 if verbosity() > 0 else 3


def onnxruntime_options(ort: ModuleType) -> Any:
    """A fresh ``onnxruntime.SessionOptions`` whose session logs at :func:`onnxruntime_severity`
    (ONNX Runtime's default logger, which the user's own sessions share, is left as it is)."""
    options = ort.SessionOptions()
    options.log_severity_level = onnxruntime_severity()
    return options


def tell(text: str, extra: dict[str, bool] = TO_STDOUT) -> None:
    """Say ``text`` on stdout beside a command's results: a reading command's progress, or (with
    :data:`RESULT`) a result itself."""
    logger(LOGGER.name).info(text, extra=extra)
