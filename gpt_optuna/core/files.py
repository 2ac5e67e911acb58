"""Files other processes read: written whole or not at all, and made by one process at a time.

A file is written under a temporary name of its own beside it (the process and a random token,
``.tmp`` in it), flushed to the disk, and renamed over the target in one step, so that a reader
sees the old file or the new one, never a part; a write that fails leaves no temporary behind.
A lock is a ``NAME.lock`` file beside what it guards (``filelock``: portable, released when its
process dies).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock, Timeout


@contextlib.contextmanager
def atomic_path(path: Path, keep_suffix: bool = False) -> Iterator[Path]:
    """A temporary path beside ``path`` for a writer that needs a file name; on a clean exit the
    file written there is flushed and replaces ``path``, and in any case the temporary is removed.
    ``keep_suffix`` keeps ``path``'s suffix last (``NAME.TOKEN.tmp.onnx``), for writers that go by it."""
    token = f"{os.getpid()}-{secrets.token_hex(4)}"
    name = f"{path.stem}.{token}.tmp{path.suffix}" if keep_suffix else f"{path.name}.{token}.tmp"
    tmp = path.with_name(name)
    try:
        yield tmp
        _flush(tmp)
        os.replace(tmp, path)
        _flush_folder(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write(path: Path, data: bytes | str) -> None:
    """Write ``data`` (text as UTF-8) to ``path`` whole or not at all, making its folder if needed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)


def locked(path: Path) -> FileLock:
    """The lock that guards ``path`` (``NAME.lock`` beside it): ``with locked(path):`` waits for
    any other process holding it."""
    return FileLock(path.with_name(path.name + ".lock"))


def is_held(path: Path) -> bool:
    """Whether a lock guards ``path`` now, this process's own included (tried and let go at once;
    no lock file, none). Where it cannot be tried (a read-only folder, another user's file), it
    is taken as held."""
    lock = locked(path)
    if not Path(lock.lock_file).is_file():
        return False
    try:
        lock.acquire(timeout=0)
    except (Timeout, OSError):
        return True
    lock.release()
    return False


def _flush(path: Path) -> None:
    fd = os.open(path, os.O_RDWR)  # Windows flushes only a handle open for writing
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _flush_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable where the system allows it (not on Windows)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
