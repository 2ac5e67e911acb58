"""Files other processes read: written whole or not at all, and made by one process at a time.

A file is written under a temporary name of its own beside it (the process and a random token,
``.tmp`` in it), flushed to the disk, and renamed over the target in one step, so that a reader
sees the old file or the new one, never a part; a write that fails leaves no temporary behind.
Several files that make one whole (an export) are staged together (:class:`Staging`). A lock
is a ``NAME.lock`` file beside what it guards (``filelock``: portable, released when its process
dies).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import secrets
import shutil
from collections.abc import Iterator
from collections.abc import Set as AbstractSet
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


STAGING_SUFFIX = ".partial"
"""What names a staging folder (:class:`Staging`) beside the files it writes."""


class Staging:
    """Files written as one: each first under its own name in a staging folder beside ``record``
    (``.RECORD.PID-TOKEN.partial``), then moved in place by :meth:`commit`, ``record`` (the file
    that says the others are whole: an export's side file) removed first and moved in last.

    So a kill leaves the old files, or the whole new set, or a set without its record: an
    unfinished one, whose staging folder still lists the files it made where none was before
    (:func:`unfinished`), so that the same command can replace them again.
    """

    def __init__(self, files: list[Path], record: Path, left: AbstractSet[Path] = frozenset()) -> None:
        """``left``: what an unfinished writer of the same set made (:func:`unfinished`), still
        this writer's to replace should it be killed too."""
        self.record = record
        self.files = [f for f in files if f != record] + [record]
        self.folder = record.with_name(f".{record.name}.{os.getpid()}-{secrets.token_hex(4)}{STAGING_SUFFIX}")
        self.folder.mkdir()
        new = [str(f) for f in self.files if f in left or not f.exists() and not f.is_symlink()]
        atomic_write(self.folder / _MANIFEST, json.dumps({"new": new}))

    def path(self, target: Path) -> Path:
        """Where to write what goes to ``target`` (its own name, so files that name each other,
        a model and its external data, stay right)."""
        return self.folder / target.name

    def commit(self) -> None:
        """Move every file written into place, the record last; a file of the set not written
        this time (an old export's external data) is removed."""
        self.record.unlink(missing_ok=True)
        for target in self.files:
            staged = self.path(target)
            if staged.is_file():
                _flush(staged)
                os.replace(staged, target)
                _flush_folder(target.parent)
            elif target != self.record:
                target.unlink(missing_ok=True)
        self.discard()

    def discard(self) -> None:
        """Remove the staging folder and what it holds."""
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> Staging:
        return self

    def __exit__(self, *exc: object) -> None:
        self.discard()


_MANIFEST = "manifest.json"


def unfinished(record: Path) -> set[Path]:
    """The files that a writer of ``record`` killed before its end (:class:`Staging`) made where
    none was before; its staging folder is removed. A set whose record exists is whole: none."""
    made: set[Path] = set()
    for folder in record.parent.glob(f".{glob.escape(record.name)}.*{STAGING_SUFFIX}"):
        if not folder.is_dir() or is_alive(folder.name.removesuffix(STAGING_SUFFIX).rpartition(".")[2]):
            continue
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            made |= {Path(p) for p in json.loads((folder / _MANIFEST).read_text())["new"]}
        shutil.rmtree(folder, ignore_errors=True)
    return set() if record.exists() else made


def is_alive(owner: str) -> bool:
    """Whether the process named in a staging folder's ``PID-TOKEN`` still runs (unreadable: taken as running)."""
    pid = owner.partition("-")[0]
    if not pid.isdigit():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return int(pid) != 0
