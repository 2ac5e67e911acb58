"""A study's SQLite file read directly, for the readers (``status``, ``best``, ``report``, ``export``,
:func:`gpt_optuna.load`).

Opening the file through Optuna's RDBStorage imports SQLAlchemy and Alembic (about 0.8 s, most of
what ``status`` took) and builds each trial through the ORM; the reader reads Optuna's tables with
:mod:`sqlite3` in one read transaction per call (a snapshot, while a tuner writes beside it),
writes nothing and leaves no file beside it. It knows the schema Optuna has kept since 3.0
(:data:`SCHEMA_VERSION`); a file of another schema is opened through Optuna (:func:`open_reader`
returns None).
"""

from __future__ import annotations

import copy
import datetime
import json
import os
import sqlite3
import threading
import urllib.parse
import weakref
from collections import defaultdict
from collections.abc import Callable, Container, Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

from optuna.distributions import BaseDistribution, json_to_distribution
from optuna.storages import BaseStorage
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from gpt_optuna.core.errors import UserError
from gpt_optuna.core.log import logger
from gpt_optuna.study.optuna_internals import FrozenStudy

SCHEMA_VERSION = 12
"""The schema of Optuna's database storage (``version_info.schema_version``) this reader knows."""
_INFINITE = {"INF_POS": float("inf"), "INF_NEG": float("-inf"), "NAN": float("nan")}
"""Stored value types other than ``FINITE``, whose value column is empty."""
LOCK_NOTICE_S = 1.0
"""How long a lock is waited for in silence (a tuner's transaction is over in milliseconds)."""
READ_WAIT_S = 10.0
"""How long a reader waits, after saying so, for a lock another process holds on the file."""


def open_reader(path: Path) -> SQLiteReader | None:
    """A reader of the study file at ``path``; None where its schema is not the one this reader knows."""
    reader = SQLiteReader(path)
    try:
        version = reader.schema_version()
    except sqlite3.DatabaseError:  # no such table: not Optuna's schema of today
        version = None
    except UserError:
        reader.close()
        raise
    if version != SCHEMA_VERSION:
        reader.close()
        return None
    return reader


class SQLiteReader(BaseStorage):
    """Optuna's storage interface over a study's SQLite file, read-only: every write refuses."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._read: tuple[tuple[int, int], list[FrozenTrial]] | None = None
        """The last study read: (study id, the file's version) and its trials."""
        uri = read_only_uri(path)
        self._connection = sqlite3.connect(
            uri, uri=True, isolation_level=None, timeout=LOCK_NOTICE_S, check_same_thread=False
        )
        self._lock = threading.RLock()
        self._closing = weakref.finalize(self, _close, self._connection, path, "immutable" not in uri)

    def close(self) -> None:
        """Close the file; at the latest as the process exits."""
        with self._lock:
            self._closing()

    @contextmanager
    def _snapshot(self) -> Iterator[sqlite3.Connection]:
        """One read transaction (the outermost of nested calls): what is read inside sees one state of
        the file. One thread at a time. A file SQLite cannot read (not a database, malformed, locked
        past the wait) raises a :class:`UserError` that says so."""
        with self._lock:
            if self._connection.in_transaction:
                yield self._connection
                return
            try:
                self._begin()
                try:
                    yield self._connection
                finally:
                    self._connection.execute("COMMIT")
            except sqlite3.DatabaseError as exc:
                fault = sqlite_fault(self.path, exc)
                if fault is None:
                    raise
                raise UserError(fault) from exc

    def _begin(self) -> None:
        """Begin a read transaction holding the file's read lock: a lock another process holds past
        :data:`LOCK_NOTICE_S` is waited for up to :data:`READ_WAIT_S`, said as the wait begins."""
        try:
            self._read_lock()
        except sqlite3.OperationalError as exc:
            if not _locked(exc):
                raise
            logger(__name__).warning(lock_wait(self.path, READ_WAIT_S))
            self._connection.execute(f"PRAGMA busy_timeout = {round(READ_WAIT_S * 1000)}")
            try:
                self._read_lock()
            finally:
                self._connection.execute(f"PRAGMA busy_timeout = {round(LOCK_NOTICE_S * 1000)}")

    def _read_lock(self) -> None:
        """Begin a transaction and take the read lock, which it holds until its COMMIT."""
        self._connection.execute("BEGIN")
        try:
            self._connection.execute("SELECT count(*) FROM sqlite_master")
        except BaseException:
            self._connection.execute("ROLLBACK")
            raise

    def _rows(self, query: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._snapshot() as db:
            return db.execute(query, args).fetchall()

    def schema_version(self) -> int | None:
        rows = self._rows("SELECT schema_version FROM version_info")
        return int(rows[0][0]) if rows else None

    def get_study_id_from_name(self, study_name: str) -> int:
        rows = self._rows("SELECT study_id FROM studies WHERE study_name = ?", (study_name,))
        if not rows:
            raise KeyError(f"No such study {study_name}.")
        return int(rows[0][0])

    def get_study_name_from_id(self, study_id: int) -> str:
        rows = self._rows("SELECT study_name FROM studies WHERE study_id = ?", (study_id,))
        if not rows:
            raise KeyError(f"No study with study_id {study_id} exists.")
        return str(rows[0][0])

    def get_study_directions(self, study_id: int) -> list[StudyDirection]:
        with self._snapshot():
            rows = self._rows(
                "SELECT direction FROM study_directions WHERE study_id = ? ORDER BY objective", (study_id,)
            )
            if not rows:
                self.get_study_name_from_id(study_id)  # no such study: KeyError
        return [StudyDirection[name] for (name,) in rows]

    def get_study_user_attrs(self, study_id: int) -> dict[str, Any]:
        return self._study_attrs("study_user_attributes", study_id)

    def get_study_system_attrs(self, study_id: int) -> dict[str, Any]:
        return self._study_attrs("study_system_attributes", study_id)

    def _study_attrs(self, table: str, study_id: int) -> dict[str, Any]:
        rows = self._rows(f"SELECT key, value_json FROM {table} WHERE study_id = ?", (study_id,))
        return {key: json.loads(value) for key, value in rows}

    def get_all_studies(self) -> list[FrozenStudy]:
        with self._snapshot() as db:
            names = db.execute("SELECT study_id, study_name FROM studies ORDER BY study_id").fetchall()
            return [
                FrozenStudy(
                    study_name=name,
                    direction=None,
                    directions=self.get_study_directions(study_id),
                    user_attrs=self.get_study_user_attrs(study_id),
                    system_attrs=self.get_study_system_attrs(study_id),
                    study_id=study_id,
                )
                for study_id, name in names
            ]

    def count_by_state(self, study_id: int) -> dict[TrialState, int]:
        rows = self._rows("SELECT state, COUNT(*) FROM trials WHERE study_id = ? GROUP BY state", (study_id,))
        return {TrialState[state]: int(count) for state, count in rows}

    def get_n_trials(self, study_id: int, state: tuple[TrialState, ...] | TrialState | None = None) -> int:
        counts = self.count_by_state(study_id)
        if state is None:
            return sum(counts.values())
        states = (state,) if isinstance(state, TrialState) else state
        return sum(counts.get(s, 0) for s in states)

    def get_trial_id_from_study_id_trial_number(self, study_id: int, trial_number: int) -> int:
        rows = self._rows("SELECT trial_id FROM trials WHERE study_id = ? AND number = ?", (study_id, trial_number))
        if not rows:
            raise KeyError(f"No trial with trial number {trial_number} exists in study with study_id {study_id}.")
        return int(rows[0][0])

    def get_trial(self, trial_id: int) -> FrozenTrial:
        with self._snapshot() as db:
            found = self._trials(db, "trial_id = ?", (trial_id,))
        if not found:
            raise KeyError(f"No trial with trial-id {trial_id} found.")
        return found[0]

    def get_all_trials(
        self, study_id: int, deepcopy: bool = True, states: Container[TrialState] | None = None
    ) -> list[FrozenTrial]:
        """The study's trials; read once while the file is unchanged (a reader asks several times)."""
        with self._snapshot() as db:
            if db.execute("SELECT 1 FROM studies WHERE study_id = ?", (study_id,)).fetchone() is None:
                raise KeyError(f"No study with study_id {study_id} exists.")
            version = (study_id, db.execute("PRAGMA data_version").fetchone()[0])  # changes with each commit
            if self._read is None or self._read[0] != version:
                self._read = version, self._trials(db, "study_id = ?", (study_id,))
        trials = self._read[1] if states is None else [t for t in self._read[1] if t.state in states]
        return copy.deepcopy(trials) if deepcopy else list(trials)

    @staticmethod
    def _trials(db: sqlite3.Connection, where: str, args: tuple[int, ...]) -> list[FrozenTrial]:
        """The trials ``where`` selects, each built as Optuna's database storage builds it."""
        rows = db.execute(
            f"SELECT trial_id, number, state, datetime_start, datetime_complete FROM trials WHERE {where}"
            " ORDER BY trial_id",
            args,
        ).fetchall()
        chosen = f"trial_id IN (SELECT trial_id FROM trials WHERE {where})"

        def per_trial(query: str) -> dict[int, list[tuple[Any, ...]]]:
            grouped: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
            for row in db.execute(query.format(chosen=chosen), args):
                grouped[row[0]].append(row[1:])
            return grouped

        params = per_trial(
            "SELECT trial_id, param_name, param_value, distribution_json FROM trial_params WHERE {chosen}"
            " ORDER BY param_id"
        )
        values = per_trial("SELECT trial_id, objective, value, value_type FROM trial_values WHERE {chosen}")
        steps = per_trial(
            "SELECT trial_id, step, intermediate_value, intermediate_value_type FROM trial_intermediate_values"
            " WHERE {chosen}"
        )
        user = per_trial("SELECT trial_id, key, value_json FROM trial_user_attributes WHERE {chosen}")
        system = per_trial("SELECT trial_id, key, value_json FROM trial_system_attributes WHERE {chosen}")
        trials = []
        for trial_id, number, state, start, complete in rows:
            objectives = sorted(values.get(trial_id, ()))
            distributions = {name: _distribution(text) for name, _, text in params.get(trial_id, ())}
            trials.append(
                FrozenTrial(
                    number=number,
                    state=TrialState[state],
                    value=None,
                    values=[_stored(value, kind) for _, value, kind in objectives] or None,
                    datetime_start=_local_time(start),
                    datetime_complete=_local_time(complete),
                    params={name: distributions[name].to_external_repr(v) for name, v, _ in params.get(trial_id, ())},
                    distributions=distributions,
                    user_attrs={key: json.loads(text) for key, text in user.get(trial_id, ())},
                    system_attrs={key: json.loads(text) for key, text in system.get(trial_id, ())},
                    intermediate_values={step: _stored(v, kind) for step, v, kind in steps.get(trial_id, ())},
                    trial_id=trial_id,
                )
            )
        return trials

    def _refuse(self, *_: Any, **__: Any) -> Any:
        raise PermissionError(f"{self.path} is open for reading only")

    create_new_study: Callable[..., int] = _refuse
    delete_study: Callable[..., None] = _refuse
    set_study_user_attr: Callable[..., None] = _refuse
    set_study_system_attr: Callable[..., None] = _refuse
    create_new_trial: Callable[..., int] = _refuse
    set_trial_param: Callable[..., None] = _refuse
    set_trial_state_values: Callable[..., bool] = _refuse
    set_trial_intermediate_value: Callable[..., None] = _refuse
    set_trial_user_attr: Callable[..., None] = _refuse
    set_trial_system_attr: Callable[..., None] = _refuse


def _close(connection: sqlite3.Connection, path: Path, tidy: bool) -> None:
    """Close a reader's connection and, with ``tidy``, take away an empty write-ahead log and its
    index beside the file. A connection that may not write cannot remove them, so one that may is
    opened and closed: SQLite removes them as it closes only where no other connection, in any
    process, has the file open (a tuner's stay), and from an empty log writes nothing to the file."""
    connection.close()
    wal = path.with_name(path.name + "-wal")
    if not tidy or not wal.exists() or wal.stat().st_size:
        return
    try:
        closer = sqlite3.connect(_uri(path, "mode=rw"), uri=True, timeout=0, isolation_level=None)  # never creates it
        try:
            closer.execute("SELECT count(*) FROM sqlite_master").fetchall()  # opens the log
        finally:
            closer.close()
    except sqlite3.Error:
        pass  # another process holds the file: its companions stay for it


def read_only_uri(path: Path) -> str:
    """An SQLite URI that opens the file without writing to it, nor to its folder (where a file that
    cannot be written would need its write-ahead-log index created)."""
    writable = os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)
    return _uri(path, "mode=ro" if writable else "mode=ro&immutable=1")


def _uri(path: Path, query: str) -> str:
    return f"file:{urllib.parse.quote(str(path.resolve()))}?{query}"


def lock_wait(path: Path, wait_s: float) -> str:
    """What is said as a wait for another process's lock on ``path`` begins."""
    return f"waiting for the lock on {path} held by another process (up to {wait_s:g} s)"


def sqlite_fault(path: Path, exc: BaseException) -> str | None:
    """One line naming what SQLite found wrong with the file at ``path`` (not a database, malformed,
    locked), from its error anywhere in ``exc``'s chain; None for any other error."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        name = getattr(current, "sqlite_errorname", None) or ""
        if name.startswith("SQLITE_NOTADB"):
            return f"{path} is not an SQLite database"
        if name.startswith("SQLITE_CORRUPT"):
            return f"{path} is malformed (corrupt or truncated)"
        if isinstance(current, sqlite3.OperationalError) and _locked(current):
            return f"{path} stays locked by another process; run the command again once that one is done"
        current = current.__cause__ or current.__context__
    return None


def _locked(exc: sqlite3.OperationalError) -> bool:
    """Whether SQLite gave up waiting for a lock another connection holds."""
    return (getattr(exc, "sqlite_errorname", None) or "").startswith(("SQLITE_BUSY", "SQLITE_LOCKED"))


@lru_cache(maxsize=256)
def _distribution(text: str) -> BaseDistribution:
    """A parameter's distribution from its JSON (a study repeats a handful of them in every trial)."""
    return json_to_distribution(text)


def _stored(value: float | None, kind: str) -> float:
    return float(value) if kind == "FINITE" else _INFINITE[kind]  # type: ignore[arg-type]


def _local_time(text: str | None) -> datetime.datetime | None:
    """A stored time (naive UTC) as Optuna's database storage returns it: naive local time."""
    if text is None:
        return None
    utc = datetime.datetime.fromisoformat(text).replace(tzinfo=datetime.UTC)
    return utc.astimezone().replace(tzinfo=None)
