"""The one module that names Optuna's private parts; no other module may (``tests/test_layers.py``).

What the tuner takes from inside Optuna, and why:

- a study's storage and id (``Study._storage``, ``Study._study_id``) and a trial's id
  (``Trial._trial_id``, ``FrozenTrial._trial_id``): to read or fail one trial alone, and to keep
  system attrs where Optuna's public API has no call for them;
- the study's cached trials (``Study._get_trials(deepcopy=False, use_cache=True)``): the one read of
  the trials that the sampler and the objective share, without a copy of a large study;
- the cache over a database (``optuna.storages._CachedStorage``: ``_backend``, ``_lock``,
  ``_studies[id].param_distribution``) and the database's tables and session
  (``optuna.storages._rdb``; ``RDBStorage._set_trial_param_without_commit``): a running trial's
  params and attrs written in one transaction, and trials counted by state in one query;
- the system attr a constraint is stored under (:data:`CONSTRAINTS_KEY`): a trial's constraints
  written with its attrs (the system attrs of a queued trial are named in the trial record, which
  reads them);
- ``optuna.study._frozen.FrozenStudy``: the study list a storage returns.

:data:`SUPPORTED_RELEASES` are the Optuna releases this module is tested against
(``tests/test_optuna_internals.py``, which ``.ci/run`` runs under each of them); ``pyproject.toml``
bounds Optuna to them.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.study._frozen import FrozenStudy as FrozenStudy  # the storage readers' study list
from optuna.trial import FrozenTrial, TrialState

SUPPORTED_RELEASES = ("5.0", "5.1")
"""The Optuna minor releases whose internals this module is tested against."""

UPSERTS = {"sqlite": "sqlalchemy.dialects.sqlite", "postgresql": "sqlalchemy.dialects.postgresql"}
"""The databases whose insert-or-update :func:`write_running_trial` writes in one statement."""
CONSTRAINTS_KEY = "constraints"
"""The trial system attrs' prefix under which ``optuna.Trial.set_constraint`` stores a constraint."""


def storage_of(study: optuna.Study) -> optuna.storages.BaseStorage:
    """The storage ``study`` reads and writes through (Optuna's cache over a database)."""
    return study._storage


def study_id(study: optuna.Study) -> int:
    """The study's id in its storage."""
    return study._study_id


def trial_id(trial: optuna.Trial | FrozenTrial) -> int:
    """The trial's id in its storage (not its number)."""
    return trial._trial_id


def shared_trials(study: optuna.Study) -> list[FrozenTrial]:
    """The study's trials as its storage's cache holds them, not copied: read only."""
    return study._get_trials(deepcopy=False, use_cache=True)


@dataclass(frozen=True)
class NoteTarget:
    """A finished trial as optuna-dashboard's ``save_note`` reads one: its storage, study and id
    (an ``optuna.Trial`` of a finished trial would call the sampler's hooks)."""

    storage: optuna.storages.BaseStorage
    study: optuna.Study
    _trial_id: int


def note_target(study: optuna.Study, trial: FrozenTrial) -> NoteTarget:
    """A finished trial of ``study`` for optuna-dashboard's ``save_note``."""
    return NoteTarget(study._storage, study, trial._trial_id)


@contextmanager
def params_held(trial: optuna.Trial) -> Iterator[list[tuple[str, float, BaseDistribution]]]:
    """The params ``trial`` is given inside the block (its ``suggest_*`` calls), held in the list the
    block gets instead of written (Optuna's trial writes each through ``storage.set_trial_param``)."""
    held: list[tuple[str, float, BaseDistribution]] = []
    storage = trial.storage
    trial.storage = _HeldParams(storage, held)
    try:
        yield held
    finally:
        trial.storage = storage


class _HeldParams:
    """A trial's storage that holds the params it is given, for :func:`params_held`."""

    def __init__(self, storage: optuna.storages.BaseStorage, held: list[tuple[str, float, BaseDistribution]]) -> None:
        self._storage = storage
        self._held = held

    def __getattr__(self, name: str) -> Any:
        return getattr(self._storage, name)

    def set_trial_param(self, trial_id: int, name: str, value: float, distribution: BaseDistribution) -> None:
        self._held.append((name, value, distribution))


def is_cached(storage: optuna.storages.BaseStorage) -> bool:
    """Whether ``storage`` is Optuna's cache over a database."""
    return isinstance(storage, optuna.storages._CachedStorage)


def database(storage: optuna.storages.BaseStorage) -> optuna.storages.RDBStorage | None:
    """The database storage behind ``storage`` (Optuna's cache over it), None for any other."""
    backend = storage._backend if isinstance(storage, optuna.storages._CachedStorage) else storage
    return backend if isinstance(backend, optuna.storages.RDBStorage) else None


def write_running_trial(
    trial: optuna.Trial,
    backend: optuna.storages.RDBStorage,
    attrs: dict[str, Any],
    system: dict[str, Any],
    params: list[tuple[str, float, BaseDistribution]],
) -> None:
    """A running trial's params, user and system attrs in one transaction, a statement per kind, each
    param checked against the study's earlier ones as Optuna checks it. ``backend`` is one of
    :data:`UPSERTS`; where ``params`` are given, ``trial.storage`` is Optuna's cache over it."""
    if not (attrs or system or params):
        return
    import sqlalchemy
    from optuna.distributions import check_distribution_compatibility, distribution_to_json
    from optuna.storages._rdb import models

    insert = importlib.import_module(UPSERTS[backend.engine.name]).insert
    cached = trial.storage
    known: dict[str, BaseDistribution] = {}
    if params:  # what this process knows of each param's distribution, read before the database's write
        assert isinstance(cached, optuna.storages._CachedStorage)  # lock is taken (a lane holding this lock
        with cached._lock:  # may be waiting for that one)
            known = dict(cached._studies[trial.study._study_id].param_distribution)
    new = {name: distribution for name, _, distribution in params if name not in known}
    with _session(backend) as session:
        state = models.TrialModel.find_or_raise_by_id(trial._trial_id, session).state
        backend.check_trial_is_updatable(trial._trial_id, state)
        rows = []
        for name, value, distribution in params:
            if name in new:  # new to this process: Optuna's own check against the study's trials
                backend._set_trial_param_without_commit(session, trial._trial_id, name, value, distribution)
                continue
            check_distribution_compatibility(known[name], distribution)
            rows.append(
                {
                    "trial_id": trial._trial_id,
                    "param_name": name,
                    "param_value": value,
                    "distribution_json": distribution_to_json(distribution),
                }
            )
        if rows:
            session.execute(sqlalchemy.insert(models.TrialParamModel), rows)
        for model, values in ((models.TrialUserAttributeModel, attrs), (models.TrialSystemAttributeModel, system)):
            if values:
                statement = insert(model)
                statement = statement.on_conflict_do_update(
                    index_elements=[model.trial_id, model.key], set_={"value_json": statement.excluded.value_json}
                )
                rows = [{"trial_id": trial._trial_id, "key": k, "value_json": json.dumps(v)} for k, v in values.items()]
                session.execute(statement, rows)
    if new:
        assert isinstance(cached, optuna.storages._CachedStorage)
        with cached._lock:
            cached._studies[trial.study._study_id].param_distribution.update(new)


def count_in_database(backend: optuna.storages.RDBStorage, study: optuna.Study) -> dict[TrialState, int]:
    """The study's trials per state, counted by the database in one query."""
    import sqlalchemy
    from optuna.storages._rdb import models

    with _session(backend) as session:
        return dict(
            session.query(models.TrialModel.state, sqlalchemy.func.count())
            .filter(models.TrialModel.study_id == study._study_id)
            .group_by(models.TrialModel.state)
            .all()
        )


@contextmanager
def _session(backend: optuna.storages.RDBStorage) -> Iterator[Any]:
    """One transaction on the database, committed as the block ends, rolled back on an error."""
    from optuna.storages._rdb.storage import _create_scoped_session

    with _create_scoped_session(backend.scoped_session) as session:
        yield session
