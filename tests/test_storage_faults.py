"""Storages that are not what they are said to be, broken or locked: each refused in one line that
names the file and its fault, before anything is written to it, on real files, real SQLite and a real
other process holding the lock."""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import SYNTHETIC, save, synthetic_config

import gpt_optuna
from gpt_optuna.cli import main
from gpt_optuna.core.errors import UserError
from gpt_optuna.study import sqlite_reader, storage
from gpt_optuna.testing.small_cnn import small_cnn

NAME = "cnn-syntheticbackend"
NOTES = b"things to try on the model next week\n"
"""A user's file of notes: one line, as Optuna's journal would read past it without an error."""
READERS = (["status"], ["best"], ["report", "-o", "report.html"], ["export", "-o", "exported.onnx"])


@pytest.fixture(scope="module")
def made_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real study's database, made once by a tuner, its write-ahead log checkpointed: all in the file."""
    folder = tmp_path_factory.mktemp("made")
    here = Path.cwd()
    os.chdir(folder)
    try:
        assert main(tune_args(folder, "--confirm-top", "0")) == 0
    finally:
        os.chdir(here)
    db = folder / "studies" / f"{NAME}.db"
    with contextlib.closing(sqlite3.connect(db)) as connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return db


def tune_args(tmp_path: Path, *args: str) -> list[str]:
    model = save(small_cnn(), tmp_path / "cnn.onnx")
    config = synthetic_config(tmp_path, 'mode = "ok"\ndelay_us = [50, 0]')
    return ["tune", str(model), "--backend", SYNTHETIC, "--config", str(config), "--n-trials", "2", "--quiet", *args]


def one_line_error(code: int, capsys: pytest.CaptureFixture[str], *expected: str) -> list[str]:
    """The lines on stderr before the error, after checking the error is one line naming ``expected``."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and "Traceback" not in err, err
    assert lines and lines[-1].startswith("gpt-optuna: error: "), err
    assert all(text in lines[-1] for text in expected), lines[-1]
    return lines[:-1]


@contextlib.contextmanager
def locked(db: Path) -> Iterator[None]:
    """Another process holding ``db``'s exclusive lock (``BEGIN EXCLUSIVE``) until the block ends."""
    hold = "import sqlite3, sys; c = sqlite3.connect(sys.argv[1], isolation_level=None); c.execute('BEGIN EXCLUSIVE')"
    holder = subprocess.Popen(
        [sys.executable, "-c", f"{hold}; print('held', flush=True); sys.stdin.read()", str(db)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        yield
    finally:
        holder.communicate(timeout=30)


def rollback_journal(db: Path) -> Path:
    """``db`` without its write-ahead log (as a plain Optuna storage keeps it): a writer's lock keeps
    readers out."""
    with contextlib.closing(sqlite3.connect(db)) as connection:
        assert connection.execute("PRAGMA journal_mode=DELETE").fetchone()[0] == "delete"
    return db


def test_a_journal_storage_on_a_file_of_notes_is_refused_and_the_file_left_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_bytes(NOTES)
    code = main(tune_args(tmp_path, "--storage", f"journal:{notes}"))
    assert one_line_error(code, capsys, str(notes), "is a text file, not an Optuna journal") == []
    assert notes.read_bytes() == NOTES
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cnn.onnx", "notes.txt", "tune.toml"]


@pytest.mark.parametrize(
    "content, fault",
    [
        (NOTES, "is a text file, not an SQLite database"),
        (os.urandom(8192), "is not an SQLite database"),
        (b'{"op_code":0,"worker_id":"w","study_name":"s","directions":[1]}\n', "is an Optuna journal"),
    ],
    ids=["notes", "random bytes", "journal"],
)
def test_an_sqlite_storage_on_a_file_that_is_not_sqlite_is_refused_and_the_file_left_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, fault: str
) -> None:
    target = tmp_path / "study.db"
    target.write_bytes(content)
    code = main(tune_args(tmp_path, "--storage", f"sqlite:///{target}"))
    assert one_line_error(code, capsys, str(target), fault) == []
    assert target.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cnn.onnx", "study.db", "tune.toml"]


def broken(made_db: Path, folder: Path, fault: str) -> Path:
    """A copy of the study's database that is random bytes (after a short line of text, as random bytes
    may start), cut to half its length, or empty."""
    db = folder / f"{fault}.db"
    whole = made_db.read_bytes()
    corrupt = b"x\n" + os.urandom(len(whole))
    db.write_bytes({"corrupt": corrupt, "truncated": whole[: len(whole) // 2], "empty": b""}[fault])
    return db


CAUSES = {
    "corrupt": "is not an SQLite database",
    "truncated": "is malformed (corrupt or truncated)",
    "empty": "is an empty file, not an SQLite database",
}


@pytest.mark.parametrize("fault", sorted(CAUSES))
def test_every_reader_of_a_broken_database_names_its_cause(
    made_db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], fault: str
) -> None:
    db = broken(made_db, tmp_path, fault)
    before = db.read_bytes()
    for reader in READERS:
        assert one_line_error(main([*reader, "--storage", f"sqlite:///{db}"]), capsys, str(db), CAUSES[fault]) == []
    with pytest.raises(UserError, match=CAUSES[fault].replace("(", r"\(").replace(")", r"\)")):
        gpt_optuna.load(db)
    assert db.read_bytes() == before


@pytest.mark.parametrize("fault", ["corrupt", "truncated"])
def test_tune_on_a_broken_database_names_its_cause(
    made_db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], fault: str
) -> None:
    db = broken(made_db, tmp_path, fault)
    before = db.read_bytes()
    code = main(tune_args(tmp_path, "--storage", f"sqlite:///{db}", "--study-name", NAME))
    assert one_line_error(code, capsys, str(db), CAUSES[fault]) == []
    assert db.read_bytes() == before


def test_a_reader_of_a_locked_database_says_it_waits_then_names_the_lock(
    made_db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_reader, "LOCK_NOTICE_S", 0.2)
    monkeypatch.setattr(sqlite_reader, "READ_WAIT_S", 1.0)
    db = rollback_journal(Path(shutil.copy(made_db, tmp_path / "study.db")))
    with locked(db):
        start = time.monotonic()
        said = one_line_error(main(["status", "--storage", f"sqlite:///{db}"]), capsys, str(db), "stays locked")
        assert time.monotonic() - start < 5
        with pytest.raises(UserError, match="stays locked by another process"):
            gpt_optuna.load(db)
    assert said == [f"waiting for the lock on {db} held by another process (up to 1 s)"]
    assert "waiting for the lock" in capsys.readouterr().err
    assert main(["status", "--storage", f"sqlite:///{db}"]) == 0  # the lock released: read as ever


@pytest.mark.parametrize("journal", ["wal", "delete"])
def test_tune_on_a_locked_database_says_it_waits_then_names_the_lock(
    made_db: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    journal: str,
) -> None:
    monkeypatch.setattr(sqlite_reader, "LOCK_NOTICE_S", 0.2)
    monkeypatch.setattr(storage, "SQLITE_WAIT_S", 1.0)
    db = Path(shutil.copy(made_db, tmp_path / "study.db"))
    if journal == "delete":
        rollback_journal(db)
    with locked(db):
        code = main(tune_args(tmp_path, "--storage", f"sqlite:///{db}", "--study-name", NAME))
        said = one_line_error(code, capsys, str(db), "stays locked by another process")
    assert said[-1] == f"waiting for the lock on {db} held by another process (up to 1 s)"


def test_a_folder_as_an_sqlite_storage_is_refused_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "folder.db"
    folder.mkdir()
    start = time.monotonic()
    code = main(tune_args(tmp_path, "--storage", f"sqlite:///{folder}"))
    assert one_line_error(code, capsys, str(folder), "is a folder, not an SQLite database") == []
    assert time.monotonic() - start < 10
    assert list(folder.iterdir()) == []
    code = main(["status", "--storage", f"sqlite:///{folder}", "--study-name", NAME])
    assert one_line_error(code, capsys, str(folder), "is a folder, not a study database") == []


def test_a_file_named_studies_where_the_default_storage_goes_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    Path("studies").write_text("not a folder\n")
    assert one_line_error(main(tune_args(tmp_path)), capsys, "studies is a file, not a folder") == []
    assert Path("studies").read_text() == "not a folder\n"
