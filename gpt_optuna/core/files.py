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
import re
import secrets
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock, Timeout

from gpt_optuna.core.errors import UserError


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


def _flush(path: Path, flags: int = os.O_RDWR) -> None:
    fd = os.open(path, flags)  # Windows flushes only a handle open for writing
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _flush_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable where the system allows it (not on Windows)."""
    with contextlib.suppress(OSError):
        _flush(folder, os.O_RDONLY)


STAGING_SUFFIX = ".partial"
"""What ends the name of a staging folder (:func:`staging_folder`) beside what it writes."""
_HOST = socket.gethostname()
_IN_USE: set[Path] = set()
"""This process's staging folders still being written."""


def staging_folder(target: Path, old: bool = False) -> Path:
    """A new staging folder for what goes to ``target``, beside it: ``.TARGET.HOST.PID-TOKEN.partial``
    (``old``: ``...old.partial``, for what ``target`` held before), owned by this process."""
    old_mark = ".old" if old else ""
    return target.with_name(f".{target.name}.{_HOST}.{os.getpid()}-{secrets.token_hex(4)}{old_mark}{STAGING_SUFFIX}")


def dead_stagings(target: Path) -> list[Path]:
    """The staging folders beside ``target`` for it whose process, on this host, ended before it
    removed them (killed, or this process's own, no longer written)."""
    name = re.compile(
        rf"\.{re.escape(target.name)}\.{re.escape(_HOST)}\.(\d+)-[0-9a-f]{{8}}(\.old)?{re.escape(STAGING_SUFFIX)}"
    )
    dead = []
    for folder in target.parent.glob(f".{glob.escape(target.name)}.*{STAGING_SUFFIX}"):
        found = name.fullmatch(folder.name)
        pid = int(found[1]) if found else 0
        if found and folder.is_dir() and folder not in _IN_USE and (pid == os.getpid() or not process_runs(pid)):
            dead.append(folder)
    return sorted(dead)


class Staging:
    """Files written as one: each first under its own name in a staging folder beside ``record``
    (:func:`staging_folder`), then moved in place by :meth:`commit`: what the targets held before
    moved aside into the folder first (``record``, the file that says the others are whole, the
    first of them), the new files moved in after (``record`` the last).

    A set interrupted before its record is in, by an exception here or by a kill (the next
    :func:`roll_back_dead` of the same record), is rolled back: what the targets held is put back
    and what the set made where there was nothing is removed. So the targets hold the old files or
    the whole new set, and the same command works again.
    """

    def __init__(self, files: list[Path], record: Path) -> None:
        self.record = record
        self.files = [f for f in files if f != record] + [record]
        self.folder = staging_folder(record)
        self.folder.mkdir()
        _IN_USE.add(self.folder)
        made = [str(f.absolute()) for f in self.files if not f.exists() and not f.is_symlink()]
        manifest = {"files": [str(f.absolute()) for f in self.files], "made": made}
        atomic_write(self.folder / _MANIFEST, json.dumps(manifest))

    def path(self, target: Path) -> Path:
        """Where to write what goes to ``target`` (its own name, so files that name each other,
        a model and its external data, stay right)."""
        return self.folder / target.name

    def commit(self) -> None:
        """Move what the targets hold aside and every file written into place, the record last;
        a file of the set not written this time (an old export's external data) is left aside.
        Interrupted, the set is rolled back."""
        try:
            if not self.path(self.record).is_file():
                raise FileNotFoundError(f"{self.path(self.record)} is gone: another process removed the staging folder")
            aside = self.folder / _ASIDE
            aside.mkdir()
            for target in [self.record, *self.files[:-1]]:
                if target.exists() or target.is_symlink():
                    os.replace(target, aside / target.name)
            for target in self.files:
                staged = self.path(target)
                if staged.is_file():
                    _flush(staged)
                    os.replace(staged, target)
                    _flush_folder(target.parent)
        except BaseException:
            _roll_back(self.folder)
            raise
        self.discard()

    def discard(self) -> None:
        """Remove the staging folder and what it holds."""
        shutil.rmtree(self.folder, ignore_errors=True)
        _IN_USE.discard(self.folder)

    def __enter__(self) -> Staging:
        return self

    def __exit__(self, *exc: object) -> None:
        self.discard()


_MANIFEST = "manifest.json"
_ASIDE = "replaced"


def roll_back_dead(record: Path) -> None:
    """Roll back what a :class:`Staging` of ``record`` whose process ended left half done, and remove
    its folder; a set whose record is in place is whole, and stays."""
    for folder in dead_stagings(record):
        _roll_back(folder)
        shutil.rmtree(folder, ignore_errors=True)


def _roll_back(folder: Path) -> None:
    """Put back what the targets of the staging ``folder`` held and remove what its set made, unless
    its record (the last target) is in place as the set's own: moved in whole."""
    try:
        manifest = json.loads((folder / _MANIFEST).read_text())
        files, made = [Path(f) for f in manifest["files"]], set(manifest["made"])
    except (OSError, ValueError, KeyError, TypeError):
        return  # killed before its manifest was written: nothing was moved
    aside = folder / _ASIDE
    record = files[-1]
    if record.exists() and ((aside / record.name).exists() or str(record) in made):
        return
    for target in files:
        kept = aside / target.name
        if kept.exists() or kept.is_symlink():
            os.replace(kept, target)
        elif str(target) in made:
            target.unlink(missing_ok=True)


def process_runs(pid: int) -> bool:
    """Whether a process of this host with that id runs (this one included; unknown: taken as running)."""
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def writable_file(path: Path) -> Path:
    """``path`` if a file can be written there: its folder exists and it is not a folder itself."""
    if path.is_dir():
        raise UserError(f"{path} is a folder: give a file name to write")
    if not path.parent.is_dir():
        raise UserError(f"the folder {path.parent} does not exist")
    return path
