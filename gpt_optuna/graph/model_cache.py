"""Transformed models, made once per content key: the file, or the failure that making it raised.

A transform that fails on a graph fails the same way every time, so its failure is kept beside
where the model would be (``NAME.failed.json``, with the traceback) and raised again at once,
instead of redoing minutes of work on every trial that asks for it. A model made is kept with the
hash of its content (``NAME.sha256``, written before the model is): one that no longer matches it
(damaged, truncated, edited) is made again rather than used.
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable
from pathlib import Path

from gpt_optuna.core.errors import GptOptunaError, UserError
from gpt_optuna.core.files import atomic_path, atomic_write, locked
from gpt_optuna.graph.model import ModelInfo, distinct_dims, file_sha256, load_model_info


class TransformFailed(GptOptunaError):
    """Making a transformed model failed, now or before; ``log`` holds the traceback."""

    def __init__(self, message: str, log: str) -> None:
        super().__init__(message)
        self.log = log


_INTACT: dict[Path, tuple[int, int]] = {}
"""Models this process found intact, with the size and time of change they had then."""


def intact(out: Path) -> bool:
    """Whether the model at ``out`` is the file that was made: its content has the hash recorded
    when it was made (checked once per process while its size and time of change stay). A model
    made before hashes were recorded is taken as it is, and its hash recorded now."""
    stat = out.stat()
    if _INTACT.get(out) == (stat.st_size, stat.st_mtime_ns):
        return True
    actual = file_sha256(out)
    recorded = _hash_path(out)
    if not recorded.is_file():
        _write_hash(out, actual)
    elif recorded.read_text().strip() != actual:
        return False
    _INTACT[out] = (stat.st_size, stat.st_mtime_ns)
    return True


def _hash_path(out: Path) -> Path:
    return out.with_name(out.name + ".sha256")


def _write_hash(out: Path, digest: str) -> None:
    atomic_write(_hash_path(out), digest + "\n")


def failure_path(out: Path) -> Path:
    return out.with_name(out.stem + ".failed.json")


def produce(out: Path, make: Callable[[Path], None]) -> Path:
    """``out``, made by ``make(tmp)`` unless it exists; a failure is kept and raised as TransformFailed.

    ``make`` writes the model to the temporary path it is given, which is removed whatever
    happens. Worker processes that ask for the same model at once make it once: the others wait.
    Missing libraries (a UserError) and the machine's own trouble (disk full, out of
    memory) are raised as they are and not kept: they are not the graph's fault.
    """
    if out.is_file() and intact(out):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with locked(out):  # another worker making the same model: wait for it, not redo it
        return _produce(out, make)


def _produce(out: Path, make: Callable[[Path], None]) -> Path:
    if out.is_file():
        if intact(out):
            return out
        out.unlink()  # damaged: made again
    failed = failure_path(out)
    if failed.is_file():
        record = json.loads(failed.read_text())
        raise TransformFailed(record["error"], record["traceback"])
    try:
        with atomic_path(out, keep_suffix=True) as tmp:
            make(tmp)
            _write_hash(out, file_sha256(tmp))
    except (UserError, OSError, MemoryError):
        raise
    except Exception as exc:
        record = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        atomic_write(failed, json.dumps(record))
        raise TransformFailed(record["error"], record["traceback"]) from exc
    return out


def with_distinct_dims(info: ModelInfo, cache_dir: Path) -> ModelInfo:
    """The model, or where :func:`distinct_dims` renames something, a copy in ``cache_dir`` (by
    content, kept with its hash: a damaged copy is made again, never used)."""
    import onnx

    model = onnx.load(str(info.path))
    if not distinct_dims(model):
        return info
    return load_model_info(produce(cache_dir / f"dims-{info.sha256[:24]}.onnx", lambda tmp: onnx.save(model, str(tmp))))
