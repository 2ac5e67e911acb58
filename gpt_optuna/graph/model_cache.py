"""Transformed models, made once per content key: the file, or the failure that making it raised.

A transform that fails on a graph fails the same way every time, so its failure is kept beside
where the model would be (``NAME.failed.json``, with the traceback) and raised again at once,
instead of redoing minutes of work on every trial that asks for it.
"""

from __future__ import annotations

import fcntl
import json
import os
import traceback
from collections.abc import Callable
from pathlib import Path

from gpt_optuna.core.errors import GptOptunaError, UserError


class TransformFailed(GptOptunaError):
    """Making a transformed model failed, now or before; ``log`` holds the traceback."""

    def __init__(self, message: str, log: str) -> None:
        super().__init__(message)
        self.log = log


def _failure_path(out: Path) -> Path:
    return out.with_name(out.stem + ".failed.json")


def produce(out: Path, make: Callable[[Path], None]) -> Path:
    """``out``, made by ``make(tmp)`` unless it exists; a failure is kept and raised as TransformFailed.

    ``make`` writes the model to the temporary path it is given, which is removed whatever
    happens. Worker processes that ask for the same model at once make it once: the others wait.
    Missing libraries (a UserError) and the machine's own trouble (disk full, out of
    memory) are raised as they are and not kept: they are not the graph's fault.
    """
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.with_name(out.name + ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another worker making the same model: wait for it, not redo it
        return _produce(out, make)


def _produce(out: Path, make: Callable[[Path], None]) -> Path:
    if out.is_file():
        return out
    failed = _failure_path(out)
    if failed.is_file():
        record = json.loads(failed.read_text())
        raise TransformFailed(record["error"], record["traceback"])
    tmp = out.with_name(f"{out.stem}.{os.getpid()}.tmp.onnx")
    try:
        make(tmp)
        tmp.replace(out)
    except (UserError, OSError, MemoryError):
        raise
    except Exception as exc:
        record = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        partial = failed.with_name(failed.name + ".tmp")
        partial.write_text(json.dumps(record))
        partial.replace(failed)
        raise TransformFailed(record["error"], record["traceback"]) from exc
    finally:
        tmp.unlink(missing_ok=True)
    return out
