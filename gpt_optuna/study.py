"""Storage, sampler, resume checks, the baseline trial and recovery of interrupted trials."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
import sqlite3
import time
import warnings
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from gpt_optuna.config import STUDIES
from gpt_optuna.errors import MissingDependencyError, UserError
from gpt_optuna.evaluate import is_transform_knob
from gpt_optuna.interface import IO_CHANGE_ATTR
from gpt_optuna.sampling import FreshSampler
from gpt_optuna.space import Space
from gpt_optuna.taxonomy import (
    STATUSES,
    failure_causes,
    has_own_result,
    is_interrupted,
    retried_numbers,
    trial_status,
)

FINGERPRINT_ATTR = "gpt_optuna"
MEASURE_ATTR = "measure_settings"
"""The latency protocol of the latest search (it may change between resumes, so it is not in the fingerprint)."""
SPACE_ATTR = "space_record"
"""The whole search space (:meth:`Space.to_record`), for workers that join from other hosts."""
SEARCH_ATTR = "search"
"""The latest search's sampler and trial target, which joining workers follow."""
FOLDER_ATTR = "study_folder"
"""The study folder (absolute): cached data, transformed models and logs, found from any directory."""
_HEARTBEAT_S = 30
_GRACE_S = 120
_MAX_RETRY = 3


WHY_TRIED = ("baseline", "seeded", "warm_start_from")
"""The user attrs that say why a candidate was tried: a retry keeps them."""


def retry_trial(study: optuna.Study, trial: FrozenTrial) -> None:
    """Enqueue an interrupted trial's candidate again, keeping the marks of why it was tried.

    The retry records ``failed_trial`` and ``retry_history`` as Optuna's own retry callback
    does; a candidate interrupted more than three times is not retried again.
    """
    history = [*trial.system_attrs.get("retry_history", []), trial.number]
    if len(history) > _MAX_RETRY:
        return
    study.add_trial(
        optuna.create_trial(
            state=TrialState.WAITING,
            params=trial.params,
            distributions=trial.distributions,
            user_attrs={k: v for k, v in trial.user_attrs.items() if k in WHY_TRIED},
            system_attrs={
                "failed_trial": trial.system_attrs.get("failed_trial", trial.number),
                "retry_history": history,
            },
        )
    )


def open_storage(
    url: str, create: bool = True, make_dirs: bool = False, read_only: bool = False
) -> optuna.storages.BaseStorage:
    """An Optuna storage for a URL; ``journal:PATH`` is a journal file for several local workers.

    Database servers get a heartbeat, so trials of a tuner that died on another host are failed
    and retried after a grace period. ``create=False`` (``status``, ``best``, ``confirm``) creates
    no file and no table, so it cannot race a tuner that is creating them; ``read_only`` also
    writes nothing, so a study the user may not write can still be read. A file's folder is made
    only with ``make_dirs`` (the default ``studies/`` folder), never for a path the user gave.
    """
    try:
        path = storage_file(url)
        if path is not None:
            if not create and not path.is_file():
                raise UserError(f"no study file at {path}")
            if make_dirs:
                path.parent.mkdir(parents=True, exist_ok=True)
            elif not path.parent.is_dir():
                raise UserError(f"the folder of {path} does not exist")
        if url.startswith("journal:"):
            from optuna.storages.journal import JournalFileBackend

            return optuna.storages.JournalStorage(JournalFileBackend(str(path)))
        if url.startswith("grpc://"):
            return _grpc_storage(url)
        if path is None:
            return _rdb_storage(url, create, heartbeat=True)
        if read_only:
            return _rdb_storage(_read_only_sqlite(path), create=False, heartbeat=False)
        if not os.access(path.parent, os.W_OK) or path.exists() and not os.access(path, os.W_OK):
            raise UserError(f"{path} is read-only: the study can be read (status, best, report), not searched")
        _use_write_ahead_log(path)
        storage = _rdb_storage(url, create, heartbeat=False)
        _configure_sqlite(storage)
        return storage
    except UserError:
        raise
    except ImportError as exc:
        raise UserError(f"storage {url!r} needs a database driver that is not installed: {exc}") from exc
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"cannot open storage {url!r}: {first}") from exc


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
    print(f"serving {url} at grpc://{host}:{port}; workers use --storage grpc://{host}:{port}", flush=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    run_grpc_proxy_server(storage, host=host, port=port)
    return 0


def storage_file(url: str) -> Path | None:
    """The file behind a journal or SQLite URL; None for a database server or an in-memory one."""
    if url.startswith("journal:"):
        return Path(url.removeprefix("journal:"))
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        return Path(url.removeprefix("sqlite:///"))
    return None


def _read_only_sqlite(path: Path) -> str:
    """A URL that opens a SQLite file without writing to it (nor to its folder, where a file that
    cannot be written would need its write-ahead-log index created)."""
    import urllib.parse

    writable = os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)
    mode = "mode=ro" if writable else "mode=ro&immutable=1"
    return f"sqlite:///file:{urllib.parse.quote(str(path.resolve()))}?{mode}&uri=true"


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
            racing = isinstance(exc, sqlalchemy.exc.IntegrityError) or "already exists" in str(exc)
            if not racing or attempt == 4:
                raise
            time.sleep(0.2 * (attempt + 1))  # another process is creating the same new database
    raise AssertionError("unreachable")


def _use_write_ahead_log(path: Path) -> None:
    """WAL mode (kept in the file): readers such as ``status`` never block the tuner's writes."""
    connection = sqlite3.connect(path)
    try:
        connection.execute("PRAGMA journal_mode=WAL")
    finally:
        connection.close()


def _configure_sqlite(storage: optuna.storages.RDBStorage) -> None:
    """Every transaction takes the write lock as it begins (``BEGIN IMMEDIATE``): Optuna reads a
    waiting trial's state and then marks it running, and on SQLite (no ``SELECT ... FOR UPDATE``)
    two workers could otherwise both take the same trial. In WAL mode, synchronous=NORMAL is still
    safe against a killed process, and saves an fsync per write."""
    import sqlalchemy

    def on_connect(connection: Any, _record: Any) -> None:
        connection.isolation_level = None  # the driver begins no transaction of its own
        connection.execute("PRAGMA synchronous=NORMAL")

    def on_begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    sqlalchemy.event.listen(storage.engine, "connect", on_connect)
    sqlalchemy.event.listen(storage.engine, "begin", on_begin)
    storage.engine.dispose()


def make_sampler(name: str, seed: int | None, space: Space) -> optuna.samplers.BaseSampler:
    """TPE (multivariate, few start-up trials) by default; it handles several objectives too.

    Whichever it is, it proposes only candidates the study does not hold yet (:class:`FreshSampler`).
    """
    return FreshSampler(_base_sampler(name, seed), space, is_transform_knob, seed)


def check_sampler(name: str) -> None:
    """A MissingDependencyError where the sampler needs a library that is not installed (GPSampler
    fits with PyTorch and SciPy), found without importing it."""
    import importlib.util

    if name == "gp":
        for module, library in (("torch", "PyTorch"), ("scipy", "SciPy")):
            if importlib.util.find_spec(module) is None:
                raise MissingDependencyError(f"{library} (needed by the GP sampler)", "gp")


def _base_sampler(name: str, seed: int | None) -> optuna.samplers.BaseSampler:
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "gp":
        check_sampler(name)
        return optuna.samplers.GPSampler(seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        # constant liar: a running trial counts as a bad result, so parallel workers spread out
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=5, constant_liar=True)


def load_study(
    storage: optuna.storages.BaseStorage, name: str, sampler: optuna.samplers.BaseSampler | None = None
) -> optuna.Study:
    try:
        return optuna.load_study(study_name=name, storage=storage, sampler=sampler)
    except KeyError:
        names = [s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)]
        known = f"; studies there: {', '.join(names)}" if names else "; the storage holds no study"
        raise UserError(f"no study named {name!r}{known}") from None


def fingerprint_differences(stored: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """Plain-language differences between a study's recorded configuration and this run's."""
    labels = {
        "model_sha256": "the model (content hash)",
        "backend": "the backend",
        "accuracy": "the accuracy criterion",
        "metric": "the user metric function (--metric)",
        "inputs_sha256": "the input data",
        "shapes": "the input shapes",
        "space": "the search space",
        "objective": "the objective (--dry-run)",
        "objectives": "the objectives (--objectives)",
        "calibration_sha256": "the calibration data",
        "allow_io_change": "I/O precision changes (--allow-io-change)",
    }
    diffs = []
    for key, label in labels.items():
        old, new = stored.get(key), current.get(key)
        if key == "allow_io_change":  # studies made before it was recorded kept their I/O dtypes
            old, new = bool(old), bool(new)
        if old == new:
            continue
        if key == "space":
            diffs.append(f"{label}: {_space_difference(old or [], new or [])}")
        elif key.endswith("sha256"):
            diffs.append(f"{label}: {str(old)[:12]} in the study, {str(new)[:12]} now")
        else:
            diffs.append(f"{label}: {old!r} in the study, {new!r} now")
    return diffs


def _space_difference(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> str:
    before = {k["name"]: k for k in old}
    after = {k["name"]: k for k in new}
    parts = [f"knob {n} is new" for n in after if n not in before]
    parts += [f"knob {n} is gone" for n in before if n not in after]
    parts += [f"knob {n} changed" for n in after if n in before and after[n] != before[n]]
    return ", ".join(parts) or "knob order changed"


def open_study(
    storage: optuna.storages.BaseStorage,
    name: str,
    sampler: optuna.samplers.BaseSampler,
    fingerprint: dict[str, Any],
    baseline: dict[str, Any],
    objectives: int = 1,
    seeds: Sequence[tuple[dict[str, Any], dict[str, Any]]] = (),
) -> tuple[optuna.Study, bool]:
    """Create the study with its baseline trial enqueued, then each seed candidate that differs
    from it (with its user attrs: ``seeded`` or ``warm_start_from``), or resume it if its
    configuration matches."""
    directions = ["minimize"] * objectives
    try:
        study = optuna.create_study(
            storage=storage, study_name=name, sampler=sampler, directions=directions, load_if_exists=True
        )
    except ValueError as exc:  # an existing study with another number of objectives
        raise UserError(f"study {name!r} exists with other objectives ({exc}); choose another --study-name") from exc
    stored = study.user_attrs.get(FINGERPRINT_ATTR)
    if stored is None:
        if study.trials:
            raise UserError(f"study {name!r} exists but was not made by gpt-optuna; choose another --study-name")
        study.set_user_attr(FINGERPRINT_ATTR, fingerprint)
        study.enqueue_trial(baseline, user_attrs={"baseline": True})
        for seed, attrs in seeds:
            if seed != baseline:
                study.enqueue_trial(seed, user_attrs=attrs)
        return study, False
    refuse_if_different(name, stored, fingerprint)
    return study, True


def refuse_if_different(name: str, stored: Mapping[str, Any], current: Mapping[str, Any]) -> None:
    """A UserError saying what differs between a study's recorded configuration and this run's."""
    diffs = fingerprint_differences(stored, current)
    if diffs:
        raise UserError(
            f"study {name!r} was made with a different configuration ({'; '.join(diffs)}); "
            "resume it with the same settings, or start a new study with --study-name"
        )


def recorded_fingerprint(storage: optuna.storages.BaseStorage, name: str) -> dict[str, Any] | None:
    """The configuration a study of that name recorded, or None where there is no such study yet."""
    try:
        study_id = storage.get_study_id_from_name(name)
    except KeyError:
        return None
    recorded = storage.get_study_user_attrs(study_id).get(FINGERPRINT_ATTR)
    if recorded is None and storage.get_all_trials(study_id, deepcopy=False):
        raise UserError(f"study {name!r} exists but was not made by gpt-optuna; choose another --study-name")
    return recorded


def recorded_folder(storage: optuna.storages.BaseStorage, name: str) -> Path | None:
    """The study folder a study of that name recorded, or None (no such study, or made before it was)."""
    try:
        study_id = storage.get_study_id_from_name(name)
    except KeyError:
        return None
    recorded = storage.get_study_user_attrs(study_id).get(FOLDER_ATTR)
    return Path(recorded) if recorded else None


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


ORPHAN_AFTER_S = 60.0
"""A RUNNING trial that names no owner this long after it started was killed right after Optuna
created it (the tuner names itself at once)."""
RETRY_GRACE_S = 30.0
"""An interrupted trial's retry is the failing process's to queue for this long."""


@contextlib.contextmanager
def tuner_presence(workdir: Path) -> Iterator[bool]:
    """Hold a shared lock on the study folder's ``tuners.lock`` for a tuning run; yield whether no
    other tuner on this host holds one (then every RUNNING trial of the study is an orphan)."""
    import fcntl

    workdir.mkdir(parents=True, exist_ok=True)
    with (workdir / "tuners.lock").open("a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            alone = True
        except BlockingIOError:
            alone = False
        fcntl.flock(lock, fcntl.LOCK_SH)
        yield alone


def no_tuner_runs_here(workdir: Path) -> bool:
    """Whether no tuner on this host holds the study folder's ``tuners.lock`` (it only reads: the
    lock is tried and let go at once, and nothing is created)."""
    import fcntl

    try:
        descriptor = os.open(workdir / "tuners.lock", os.O_RDONLY)
    except OSError:
        return True
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(descriptor)


def _owner_is_dead(trial: FrozenTrial, alone: bool) -> bool:
    """Whether the process that runs a RUNNING trial is gone: a dead process on this host, one
    that no longer runs gpt-optuna (its number reused) while no tuner but this one runs here, or
    none named long after the trial started. Owners on other hosts are the heartbeat's to judge."""
    owner = trial.user_attrs.get("owner")
    if not owner:
        started = trial.datetime_start
        return alone or started is not None and (datetime.datetime.now() - started).total_seconds() > ORPHAN_AFTER_S
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname():
        return False
    if not pid.isdigit() or int(pid) == os.getpid():
        return alone  # this process's own earlier run (in a notebook, say)
    return not _process_alive(int(pid)) or alone and not _runs_gpt_optuna(int(pid))


def _runs_gpt_optuna(pid: int) -> bool:
    """Whether process ``pid`` runs gpt-optuna (true where that cannot be read)."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True
    return b"gpt_optuna" in command or b"gpt-optuna" in command


def recover_interrupted(study: optuna.Study, alone: bool = False) -> list[int]:
    """Fail the RUNNING trials whose tuner on this host is dead, and queue their candidates again;
    queue too any interrupted candidate whose retry a kill kept from being queued (a kill between
    failing a trial and queueing its retry), once per candidate. ``alone``: no other tuner runs
    on this host (see :func:`tuner_presence`).

    Trials of a tuner on another host are left to the storage heartbeat.
    """
    recovered = [
        trial.number
        for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        if _owner_is_dead(trial, alone) and fail_as_interrupted(study, trial, "the tuner was killed")
    ]
    trials = study.get_trials(deepcopy=False)
    retried = retried_numbers(trials)
    settled = {_params_key(t) for t in trials if has_own_result(t, retried) or not t.state.is_finished()}
    for trial in trials:
        key = _params_key(trial)
        if (
            is_interrupted(trial, retried)
            and trial.number not in retried
            and key not in settled
            and trial.params
            and (alone or trial.number in recovered or _retry_overdue(trial))
        ):
            retry_trial(study, trial)
            settled.add(key)
    return recovered


def fail_as_interrupted(study: optuna.Study, trial: FrozenTrial, reason: str) -> bool:
    """Fail a RUNNING trial whose candidate was not evaluated as interrupted (``reason``), so that
    its candidate is retried; false where another process ended the trial first."""
    try:
        study._storage.set_trial_user_attr(trial._trial_id, "interrupted", reason)
        study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
    except optuna.exceptions.UpdateFinishedTrialError:
        return False
    return True


def _retry_overdue(trial: FrozenTrial) -> bool:
    """Whether an interrupted trial ended so long ago that the process that failed it would have
    queued its retry by now: until then that process may still be about to, and a second retry
    would evaluate the candidate twice."""
    ended = trial.datetime_complete
    return ended is None or (datetime.datetime.now() - ended).total_seconds() > RETRY_GRACE_S


def _params_key(trial: FrozenTrial) -> str:
    return json.dumps(trial.params or trial.system_attrs.get("fixed_params", {}), sort_keys=True, default=str)


def finished_count(study: optuna.Study) -> int:
    """Trials that count towards --n-trials: evaluated ones, not interrupted ones."""
    trials = study.get_trials(deepcopy=False)
    retried = retried_numbers(trials)
    return sum(1 for t in trials if has_own_result(t, retried))


def study_folder(study: optuna.Study) -> Path:
    """The folder of the study's cached data and transformed models: the one it recorded, else
    ``studies/<name>`` here (studies made before it was recorded)."""
    recorded = study.user_attrs.get(FOLDER_ATTR)
    return Path(recorded) if recorded else (STUDIES / study.study_name).resolve()


def first_value(trial: FrozenTrial) -> float | None:
    """The trial's first objective: latency (or build time in a dry run), in any number of objectives."""
    return trial.values[0] if trial.values else None


@dataclass(frozen=True)
class Figures:
    """A trial's latency beside the baseline's, both from one named measurement, and their ratio:
    ``confirmed`` (the finalists' interleaved re-measurement, with a 95 % interval) where the
    trial was a finalist, else ``search``."""

    number: int
    measurement: str
    latency_ms: float | None
    baseline_ms: float | None
    ci: tuple[float, float] | None = None
    """The bootstrap 95 % interval of the speedup (confirmed finalists only)."""
    process_ms: tuple[float, ...] = ()
    """The trial's median in each confirmation process."""

    @property
    def speedup(self) -> float | None:
        """``baseline_ms / latency_ms``: the ratio of the two figures shown beside it."""
        return self.baseline_ms / self.latency_ms if self.baseline_ms and self.latency_ms else None

    @property
    def significant(self) -> bool:
        """The interval lies above 1.0: a real improvement over the baseline."""
        return self.ci is not None and self.ci[0] > 1.0


@dataclass(frozen=True)
class Stability:
    """How many of the search's latency measurements missed their precision target."""

    unstable: int
    measured: int
    target: float
    """The target: the median's 95 % half-width as a fraction of it."""
    worst: float
    """The largest half-width among the unstable ones."""
    winner_unstable: bool
    on_gpu: bool
    """Measured on a GPU (else on the CPU), for the advice."""


@dataclass(frozen=True)
class StudySummary:
    """What status, best, the report, export and the end of tune say about a study: one winner,
    one pair of latencies of one measurement, and their ratio.

    Where the finalists were confirmed, the confirmation decides: its top finalist, or the baseline
    itself when the baseline was significantly faster than every finalist; the latencies are the
    confirmed medians. Otherwise the fastest feasible trial of the search, with search latencies.
    """

    name: str
    counts: dict[str, int]
    """Trials per status of :func:`trial_status`."""
    reused: int
    baseline: FrozenTrial | None
    best: FrozenTrial | None
    dry_run: bool = False
    confirmed: dict[str, Any] | None = None
    failures: tuple[tuple[int, str], ...] = ()
    """(count, cause) of the failed candidates."""
    warm_started: tuple[str, ...] = ()
    """``STUDY:TRIAL`` of each trial a warm start queued."""
    allow_io_change: bool = False
    """The study let candidates change the model's input and output dtypes (``--allow-io-change``)."""
    stability: Stability | None = None
    orphaned: tuple[int, ...] = ()
    """RUNNING trials whose tuner on this host is gone (a killed run, a full disk): the next run
    fails them and retries their candidates."""
    trials: tuple[FrozenTrial, ...] = ()
    """Every trial of the study, by number."""

    @property
    def unit(self) -> str:
        return "s to build" if self.dry_run else "ms"

    @property
    def baseline_search_value(self) -> float | None:
        """The baseline's figure in the search: its latency (measured even when infeasible), or build time."""
        if self.baseline is None:
            return None
        if self.dry_run:
            return first_value(self.baseline)
        latency = self.baseline.user_attrs.get("latency")
        return float(latency["median_ms"]) if latency else None

    def figures(self, trial: FrozenTrial) -> Figures:
        """The trial's figures beside the baseline's: confirmed where it was a finalist (or is the
        confirmed baseline), else the search's."""
        confirmed = self.confirmed or {}
        rows = [confirmed["baseline"], *confirmed.get("ranking", [])] if confirmed.get("baseline") else []
        row = next((r for r in rows if r["number"] == trial.number), None)
        if row is None:
            return Figures(trial.number, "search", first_value(trial), self.baseline_search_value)
        base = float(confirmed["baseline"]["median_ms"])
        ci = (float(row["ci_low"]), float(row["ci_high"])) if "ci_low" in row else None
        each = tuple(float(v) for v in row.get("process_ms", []))
        return Figures(trial.number, "confirmed", float(row["median_ms"]), base, ci, each)

    @property
    def winner(self) -> Figures | None:
        """The winner's figures (None before any feasible trial)."""
        return None if self.best is None else self.figures(self.best)

    @property
    def measurement(self) -> str:
        """Which measurement the figures come from: ``confirmed`` or ``search``."""
        return self.winner.measurement if self.winner is not None else "search"

    @property
    def baseline_value(self) -> float | None:
        """The baseline's latency in the measurement the winner is judged by."""
        return self.winner.baseline_ms if self.winner is not None else self.baseline_search_value

    @property
    def best_value(self) -> float | None:
        """The winner's latency (or build time) in that same measurement."""
        return self.winner.latency_ms if self.winner is not None else None

    @property
    def speedup(self) -> float | None:
        """``baseline_value / best_value``: the ratio of the two figures shown beside it."""
        return self.winner.speedup if self.winner is not None else None

    @property
    def baseline_wins(self) -> bool:
        """The baseline is the winner: the confirmation found it significantly faster than every
        finalist, or (unconfirmed) no feasible candidate was faster in the search."""
        return bool(self.best is not None and self.baseline is not None and self.best.number == self.baseline.number)

    @property
    def verdict(self) -> str:
        """What the study found, in one word: ``faster`` (the winner is significantly faster than
        the baseline in the confirmation), ``not_significant`` (its interval includes 1.0),
        ``baseline`` (keep the default configuration), ``unconfirmed`` (search figures only),
        ``none`` (no feasible candidate yet) or ``dry_run``."""
        if self.dry_run:
            return "dry_run"
        winner = self.winner
        if winner is None:
            return "none"
        if self.baseline_wins:
            return "baseline"
        if winner.measurement == "search":
            return "unconfirmed"
        return "faster" if winner.significant else "not_significant"

    @property
    def io_changes(self) -> dict[str, dict[str, list[str]]]:
        """The winner's input and output dtypes that differ from the model's (``--allow-io-change``)."""
        return dict(self.best.user_attrs.get(IO_CHANGE_ATTR, {})) if self.best is not None else {}


def stability(trials: Sequence[FrozenTrial], target: float, winner: FrozenTrial | None) -> Stability | None:
    """The search's measurements that missed the precision target (None where none was measured)."""
    measured = [t for t in trials if "latency" in t.user_attrs and "reused_from" not in t.user_attrs]
    if not measured:
        return None
    unstable = [t for t in measured if not t.user_attrs["latency"].get("stable", True)]
    worst = max((float(t.user_attrs["latency"].get("rel_ci", 0.0)) for t in unstable), default=0.0)
    flagged = winner is not None and any(t.number == winner.number for t in unstable)
    on_gpu = any(t.user_attrs.get("gpu", "cpu") != "cpu" for t in measured)
    return Stability(len(unstable), len(measured), target, worst, flagged, on_gpu)


def summarize_study(study: optuna.Study) -> StudySummary:
    trials = study.get_trials(deepcopy=False)
    retried = retried_numbers(trials)
    counts = dict.fromkeys(STATUSES, 0) | Counter(trial_status(t, retried) for t in trials)
    baselines = [t for t in trials if t.user_attrs.get("baseline") and has_own_result(t, retried)]
    complete = [t for t in trials if t.state is TrialState.COMPLETE and t.values]
    best = min(complete, key=lambda t: (t.values[0], t.number)) if complete else None
    confirmed = study.user_attrs.get("confirmed")
    if confirmed and confirmed.get("ranking"):  # the interleaved re-measurement decides the winner
        top = max(confirmed["ranking"], key=lambda row: row["speedup"])
        best = trials[confirmed["baseline"]["number"] if top["ci_high"] < 1.0 else top["number"]]
    recorded = study.user_attrs.get(FINGERPRINT_ATTR, {})
    target = float(study.user_attrs.get(MEASURE_ATTR, {}).get("target_rel_ci", 0.01))
    return StudySummary(
        name=study.study_name,
        counts=counts,
        reused=sum(1 for t in trials if "reused_from" in t.user_attrs),
        baseline=next((t for t in baselines if t.state is TrialState.COMPLETE or "latency" in t.user_attrs), None)
        or (baselines[0] if baselines else None),
        best=best,
        dry_run=recorded.get("objective") == "build_s",
        confirmed=confirmed,
        failures=tuple(failure_causes(trials)),
        warm_started=tuple(
            str(t.user_attrs["warm_start_from"])
            for t in trials
            if "warm_start_from" in t.user_attrs and not is_interrupted(t, retried)  # a retry counts once
        ),
        allow_io_change=bool(recorded.get("allow_io_change")),
        stability=stability(trials, target, best),
        orphaned=orphans(study, trials),
        trials=tuple(trials),
    )


def orphans(study: optuna.Study, trials: Sequence[FrozenTrial]) -> tuple[int, ...]:
    """The RUNNING trials whose tuner on this host is gone (see :func:`recover_interrupted`)."""
    running = [t for t in trials if t.state is TrialState.RUNNING]
    if not running:
        return ()
    alone = no_tuner_runs_here(study_folder(study))
    return tuple(t.number for t in running if _owner_is_dead(t, alone))
