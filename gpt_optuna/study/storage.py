"""Opening a study's storage: SQLite (write-ahead log, read-only access), PostgreSQL and Optuna's gRPC proxy."""

from __future__ import annotations

import codecs
import contextlib
import itertools
import json
import os
import sqlite3
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import optuna

from gpt_optuna.core.errors import MissingDependencyError, UserError
from gpt_optuna.core.log import RESULT, logger, tell
from gpt_optuna.graph.model import one_line
from gpt_optuna.study.optuna_internals import (
    CONSTRAINTS_KEY,
    UPSERTS,
    count_in_database,
    database,
    is_cached,
    params_held,
    storage_of,
    study_id,
    write_running_trial,
)
from gpt_optuna.study.recovery import retry_trial

_HEARTBEAT_S = 30
_GRACE_S = 120


def open_storage(
    url: str, create: bool = True, make_dirs: bool = False, read_only: bool = False
) -> optuna.storages.BaseStorage:
    """An Optuna storage for a URL; ``journal:PATH`` is a journal file for several local workers.

    Database servers get a heartbeat, so trials of a tuner that died on another host are failed
    and retried after a grace period. ``create=False`` (``status``, ``best``, ``confirm``) creates
    no file and no table, so it cannot race a tuner that is creating them; ``read_only`` also
    writes nothing, so a study the user may not write can still be read. A file's folder is made
    only with ``make_dirs`` (the default ``studies/`` folder), never for a path the user gave. A
    file that is not what the URL says is refused before anything is written to it, and what SQLite
    finds wrong with a file (not a database, malformed, locked past the wait) is said in one line.
    """
    path = None
    try:
        path = storage_file(url)
        if path is not None:
            _check_storage_file(url, path, create)
            _check_folder(path, make_dirs)
        return _opened(url, path, create, read_only)
    except UserError:
        raise
    except ImportError as exc:
        raise UserError(f"storage {url!r} needs a database driver that is not installed: {exc}") from exc
    except Exception as exc:
        raise _open_error(url, path, exc) from exc


def _check_folder(path: Path, make_dirs: bool) -> None:
    """The folder of a storage file: made with ``make_dirs``, else there already (a user error)."""
    if make_dirs:
        if path.parent.exists() and not path.parent.is_dir():
            raise UserError(
                f"{path.parent} is a file, not a folder: {path} cannot be made (move the file away, or give --storage)"
            )
        path.parent.mkdir(parents=True, exist_ok=True)
    elif not path.parent.is_dir():
        raise UserError(f"the folder of {path} does not exist")


def _opened(url: str, path: Path | None, create: bool, read_only: bool) -> optuna.storages.BaseStorage:
    """The storage ``url`` names (``path``: its file, where it has one), as :func:`open_storage` opens it."""
    if url.startswith("journal:"):
        from optuna.storages.journal import JournalFileBackend

        return optuna.storages.JournalStorage(JournalFileBackend(str(path)))
    if url.startswith("grpc://"):
        return _grpc_storage(url)
    if path is None:
        return _rdb_storage(url, create, heartbeat=True)
    if read_only:
        from gpt_optuna.study.sqlite_reader import open_reader, read_only_uri

        reader = open_reader(path)  # a schema it does not know: through Optuna
        return reader or _rdb_storage(f"sqlite:///{read_only_uri(path)}&uri=true", create=False, heartbeat=False)
    if not os.access(path.parent, os.W_OK) or path.exists() and not os.access(path, os.W_OK):
        raise UserError(f"{path} is read-only: the study can be read (status, best, report), not searched")
    _use_write_ahead_log(path)
    storage = _rdb_storage(url, create, heartbeat=False)
    _configure_sqlite(storage)
    return storage


def _open_error(url: str, path: Path | None, exc: Exception) -> UserError:
    """What went wrong opening the storage, in one line: SQLite's fault with a file, else the
    driver's own error (Optuna's wrapper says less)."""
    from gpt_optuna.study.sqlite_reader import sqlite_fault

    fault = sqlite_fault(path, exc) if path is not None else None
    cause: BaseException = exc
    while cause.__cause__ is not None:  # Optuna's own wrapper says less than the driver's error
        cause = cause.__cause__
    return UserError(fault or f"cannot open storage {url!r}: {one_line(cause)}")


def _check_storage_file(url: str, path: Path, create: bool) -> None:
    """Refuse, in one line and before anything is written to it, a storage file that is not what the
    URL says: a journal is opened only if it is missing, empty or an Optuna journal, an SQLite file
    only if it is missing, empty or an SQLite database (missing or empty only for a new study:
    ``create``)."""
    if not path.exists():
        if not create:
            raise UserError(f"no study file at {path}")
        return
    journal = url.startswith("journal:")
    wanted = "an Optuna journal" if journal else "an SQLite database"
    kind = _file_kind(path)
    if kind == wanted or kind == "an empty file" and create:
        return
    if kind is None:
        raise UserError(f"{path} is not {wanted}: it holds other data")
    hint = {
        ("an SQLite database", True): f" (open it with --storage sqlite:///{path})",
        ("an Optuna journal", False): f" (open it with --storage journal:{path})",
    }.get((kind, journal), "")
    raise UserError(f"{path} is {kind}, not {wanted}{hint}")


def _file_kind(path: Path) -> str | None:
    """What a storage file is, as a refusal names it: a folder, an empty file, an SQLite database, an
    Optuna journal (its first line one of the JSON records Optuna's journal writes) or a text file;
    None for other data. SQLite itself says whether the file is a database: a file this process
    opened and closed on its own would drop the locks its SQLite connections to it hold."""
    if path.is_dir():
        return "a folder"
    if path.stat().st_size == 0:
        return "an empty file"
    if _is_sqlite(path):
        return "an SQLite database"
    with path.open("rb") as file:
        head = file.read(1 << 16)  # a journal's first record is far shorter
    try:
        record = json.loads(head.split(b"\n", 1)[0])
    except ValueError:  # not JSON, or not text at all
        record = None
    if isinstance(record, dict) and "op_code" in record:
        return "an Optuna journal"
    try:  # the whole head, not its first line: random bytes may start with a short valid one
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError:
        return None
    return None if b"\0" in head else "a text file"


def _is_sqlite(path: Path) -> bool:
    """Whether SQLite takes the file for a database (a locked or damaged one included), read only."""
    from gpt_optuna.study.sqlite_reader import read_only_uri

    try:
        with contextlib.closing(sqlite3.connect(read_only_uri(path), uri=True, timeout=0)) as connection:
            connection.execute("PRAGMA schema_version").fetchone()
    except sqlite3.DatabaseError as exc:
        return not (getattr(exc, "sqlite_errorname", None) or "").startswith("SQLITE_NOTADB")
    return True


GRPC_WAIT_S = 10.0
SQLITE_WAIT_S = 60.0


def _grpc_storage(url: str) -> optuna.storages.BaseStorage:
    """A client of ``gpt-optuna storage-proxy`` (Optuna's gRPC storage proxy) at ``grpc://HOST:PORT``."""
    host, _, port = url.removeprefix("grpc://").rstrip("/").rpartition(":")
    if not host or not port.isdigit():
        raise UserError(f"malformed storage {url!r}: use grpc://HOST:PORT")
    try:
        from optuna.storages import GrpcStorageProxy

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            proxy = GrpcStorageProxy(host=host, port=int(port))
    except ImportError as exc:
        raise MissingDependencyError("gRPC (for grpc:// storages)", "grpc") from exc
    try:
        proxy.wait_server_ready(timeout=GRPC_WAIT_S)
    except Exception as exc:
        raise UserError(f"no storage proxy answers at {url} (start one with gpt-optuna storage-proxy)") from exc
    return proxy


def serve_storage(url: str, host: str, port: int) -> int:
    """Serve a storage to many workers with Optuna's gRPC proxy until stopped (Ctrl-C)."""
    if url.startswith(("grpc://", "journal:")):
        raise UserError("the storage proxy serves a database storage (postgresql://, mysql://, sqlite:///)")
    storage = open_storage(url, make_dirs=False)
    try:
        from optuna.storages import run_grpc_proxy_server
    except ImportError as exc:
        raise MissingDependencyError("gRPC (for the storage proxy)", "grpc") from exc
    tell(f"serving {url} at grpc://{host}:{port}; workers use --storage grpc://{host}:{port}", RESULT)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    run_grpc_proxy_server(storage, host=host, port=port)
    return 0


SQLITE_COMPANIONS = ("-wal", "-shm", "-journal")
"""The files SQLite keeps beside a database file while it is open."""


def storage_file(url: str) -> Path | None:
    """The file behind a journal or SQLite URL; None for a database server or an in-memory one."""
    if url.startswith("journal:"):
        return Path(url.removeprefix("journal:"))
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        return Path(url.removeprefix("sqlite:///"))
    return None


def _rdb_storage(url: str, create: bool, heartbeat: bool) -> optuna.storages.RDBStorage:
    """RDBStorage, retried when another process created the same new database's tables first.

    A SQLite file serves tuners on one host, whose dead trials are found by process id
    (``recover_interrupted``); the heartbeat, a write and a query per trial, is for servers
    shared by several hosts.
    """
    beat: dict[str, Any] = (
        {"heartbeat_interval": _HEARTBEAT_S, "grace_period": _GRACE_S, "heartbeat_stale_trial_callback": retry_trial}
        if heartbeat
        else {}
    )
    # a SQLite writer waits this long for another's transaction (many workers write at once)
    waiting = {"engine_kwargs": {"connect_args": {"timeout": SQLITE_WAIT_S}}} if url.startswith("sqlite") else {}
    import sqlalchemy.exc

    for attempt in range(5):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(url, skip_table_creation=not create, **beat, **waiting)
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.OperationalError) as exc:
            racing = isinstance(exc, sqlalchemy.exc.IntegrityError) or _racing(exc)
            if not racing or attempt == 4:
                raise
            time.sleep(0.2 * (attempt + 1))  # another process is creating the same new database
    raise AssertionError("unreachable")


def _use_write_ahead_log(path: Path) -> None:
    """WAL mode (kept in the file): readers such as ``status`` never block the tuner's writes; and
    the write lock taken once, so a file another process keeps locked is found as it is opened.

    Several tuners creating one new file at once race for the switch, which SQLite answers at once
    (its busy timeout does not cover it) with an error or the old mode: tried again until the file
    reads back in WAL mode and its lock is had, for up to :data:`SQLITE_WAIT_S`, a wait said once it
    passes :data:`~gpt_optuna.study.sqlite_reader.LOCK_NOTICE_S`."""
    from gpt_optuna.study.sqlite_reader import LOCK_NOTICE_S, lock_wait

    start = time.monotonic()
    deadline = start + SQLITE_WAIT_S
    announced = False
    for attempt in itertools.count():
        try:
            timeout = deadline - time.monotonic() if announced else LOCK_NOTICE_S
            connection = sqlite3.connect(path, timeout=max(timeout, 0.0), isolation_level=None)
            try:
                if connection.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal":
                    connection.execute("BEGIN IMMEDIATE")
                    connection.execute("ROLLBACK")
                    return
            finally:
                connection.close()
        except sqlite3.OperationalError as exc:
            if not _racing(exc) or time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise sqlite3.OperationalError(f"{path} stays out of WAL mode: another process holds it")
        if not announced and time.monotonic() - start >= LOCK_NOTICE_S:
            logger(__name__).warning(lock_wait(path, SQLITE_WAIT_S))
            announced = True
        time.sleep(min(0.5, 0.02 * 2**attempt))


def _racing(exc: Exception) -> bool:
    """Whether SQLite's error is what another process creating the same new database causes."""
    return any(sign in str(exc) for sign in ("database is locked", "unable to open database file", "already exists"))


def _configure_sqlite(storage: optuna.storages.RDBStorage) -> None:
    """Every transaction takes the write lock as it begins (``BEGIN IMMEDIATE``): Optuna reads a
    waiting trial's state and then marks it running, and on SQLite (no ``SELECT ... FOR UPDATE``)
    two workers could otherwise both take the same trial. In WAL mode, synchronous=NORMAL is still
    safe against a killed process, and saves an fsync per write."""
    import sqlalchemy

    def on_connect(connection: Any, _record: Any) -> None:
        connection.isolation_level = None  # the driver begins no transaction of its own
        connection.execute("PRAGMA synchronous=NORMAL")

    sqlalchemy.event.listen(storage.engine, "connect", on_connect)
    sqlalchemy.event.listen(storage.engine, "begin", lambda connection: connection.exec_driver_sql("BEGIN IMMEDIATE"))
    storage.engine.dispose()


def set_trial_attrs(trial: optuna.Trial, attrs: dict[str, Any], constraints: dict[str, float] | None = None) -> None:
    """Store a running trial's user attrs and its constraints (as ``trial.set_constraint`` does).

    On SQLite and PostgreSQL, in one statement per kind in one transaction: Optuna writes each
    attr in a transaction of its own, a dozen a trial, which made most of the tuner's own cost.
    Elsewhere, through Optuna one by one.
    """
    constraints = constraints or {}
    backend = database(trial.storage)
    if backend is None or backend.engine.name not in UPSERTS:
        for key, value in attrs.items():
            trial.set_user_attr(key, value)
        for key, value in constraints.items():
            trial.set_constraint(key, value)
        return
    system = {f"{CONSTRAINTS_KEY}:{key}": float(value) for key, value in constraints.items()}
    write_running_trial(trial, backend, attrs, system, [])


@contextmanager
def one_transaction(trial: optuna.Trial) -> Iterator[dict[str, Any]]:
    """The params ``trial`` is given inside the block (its ``suggest_*`` calls) and the user attrs put in
    the dict the block gets, stored as it ends, in one transaction on SQLite and PostgreSQL, each param
    checked against the study's earlier ones as Optuna checks it: Optuna writes each param in a
    transaction of its own (a search space's knobs cost a trial several milliseconds). Elsewhere the
    params as Optuna writes them and the attrs as :func:`set_trial_attrs` does."""
    attrs: dict[str, Any] = {}
    cached = trial.storage
    backend = database(cached)
    if backend is None or backend.engine.name not in UPSERTS or not is_cached(cached):
        yield attrs
        set_trial_attrs(trial, attrs)
        return
    try:
        with params_held(trial) as params:
            yield attrs
    finally:
        write_running_trial(trial, backend, attrs, {}, params)  # given before an error too: the trial's record


def count_by_state(study: optuna.Study) -> dict[optuna.trial.TrialState, int] | None:
    """The study's trials per state, counted by the database (None where the storage is not one:
    then only reading every trial tells)."""
    from gpt_optuna.study.sqlite_reader import SQLiteReader

    storage = storage_of(study)
    if isinstance(storage, SQLiteReader):
        return storage.count_by_state(study_id(study))
    backend = database(storage)
    return None if backend is None else count_in_database(backend, study)


def load_study(storage: optuna.storages.BaseStorage, name: str) -> optuna.Study:
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        names = optuna.get_all_study_names(storage)
        known = f"; studies there: {', '.join(names)}" if names else "; the storage holds no study"
        raise UserError(f"no study named {name!r}{known}") from None
