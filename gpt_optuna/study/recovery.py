"""Trials left running by a process that died: found, failed as interrupted, and retried."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import secrets
import socket
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from gpt_optuna.core.files import is_held, locked, process_runs
from gpt_optuna.study.folder import StudyFolder
from gpt_optuna.study.optuna_internals import storage_of, trial_id
from gpt_optuna.study.taxonomy import is_interrupted, own_results, retried_numbers
from gpt_optuna.study.trial_record import FAILED_TRIAL, INTERRUPTED, INTERRUPTED_BY, RETRY_HISTORY, TrialRecord

_MAX_RETRY = 3

PROCESS = f"{socket.gethostname()}:{os.getpid()}"
"""This process as a trial's ``owner`` and an interrupted trial's ``interrupted_by`` name it."""


def retry_trial(study: optuna.Study, trial: FrozenTrial) -> None:
    """Enqueue an interrupted trial's candidate again, keeping the marks of why it was tried.

    The retry records ``failed_trial`` and ``retry_history`` as Optuna's own retry callback
    does; a candidate interrupted more than three times is not retried again.
    """
    record = TrialRecord(trial)
    history = [*record.retry_history, trial.number]
    if len(history) > _MAX_RETRY:
        return
    _enqueue_copy(study, trial, record.why_tried, {FAILED_TRIAL: record.failed_trial, RETRY_HISTORY: history})


def requeue(study: optuna.Study, trial: FrozenTrial) -> None:
    """Queue again a trial taken from the queue and given up before it ran, as it was queued."""
    record = TrialRecord(trial)
    _enqueue_copy(study, trial, record.as_queued, dict(record.queue_attrs))


def _enqueue_copy(
    study: optuna.Study, trial: FrozenTrial, user_attrs: dict[str, Any], system_attrs: dict[str, Any]
) -> None:
    """Queue the trial's candidate again (its params and distributions) with these attrs."""
    study.add_trial(
        optuna.create_trial(
            state=TrialState.WAITING,
            params=trial.params,
            distributions=trial.distributions,
            user_attrs=user_attrs,
            system_attrs=system_attrs,
        )
    )


ORPHAN_AFTER_S = 60.0
"""A RUNNING trial that names no owner this long after it started was killed right after Optuna
created it (the tuner names itself at once)."""


RETRY_GRACE_S = 30.0
"""An interrupted trial's retry is the failing process's to queue for this long."""


@contextlib.contextmanager
def tuner_presence(workdir: Path) -> Iterator[bool]:
    """Hold a lock of this run's own in the study folder's ``tuners/`` for a tuning run; yield whether
    no other tuner on this host holds one (then every RUNNING trial of the study is an orphan)."""
    folder = StudyFolder(workdir).tuners
    folder.mkdir(parents=True, exist_ok=True)
    mine = folder / f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        with locked(mine):
            yield not any(is_held(other) for other in _present(folder) if other != mine)
    finally:
        mine.with_name(mine.name + ".lock").unlink(missing_ok=True)


def no_tuner_runs_here(workdir: Path) -> bool:
    """Whether no tuner on this host holds a lock in the study folder's ``tuners/`` (it only reads:
    each lock is tried and let go at once)."""
    return not any(is_held(other) for other in _present(StudyFolder(workdir).tuners))


def _present(folder: Path) -> list[Path]:
    """What the locks in ``folder`` guard: one per tuning run that holds or held one."""
    return [lock.with_suffix("") for lock in folder.glob("*.lock")] if folder.is_dir() else []


def _owner_is_dead(trial: FrozenTrial, alone: bool) -> bool:
    """Whether the process that runs a RUNNING trial is gone (:func:`_is_gone`), or none is named
    long after the trial started."""
    owner = TrialRecord(trial).owner
    if not owner:
        started = trial.datetime_start
        return alone or started is not None and (datetime.datetime.now() - started).total_seconds() > ORPHAN_AFTER_S
    return _is_gone(owner, alone)


def _is_gone(process: str, alone: bool) -> bool:
    """Whether ``process`` (``host:pid``) is gone: a dead process on this host, or one that no
    longer runs gpt-optuna (its number reused) while no tuner but this one runs here. Processes on
    other hosts are the heartbeat's to judge."""
    host, _, pid = process.rpartition(":")
    if host != socket.gethostname():
        return False
    if not pid.isdigit() or int(pid) == os.getpid():
        return alone  # this process's own earlier run (in a notebook, say)
    return not process_runs(int(pid)) or alone and not _runs_gpt_optuna(int(pid))


def _failer_is_gone(trial: FrozenTrial, alone: bool) -> bool:
    """Whether the process that failed an interrupted trial, and would queue its retry, is gone: a
    kill between the two left the retry unqueued. A trial failed by the storage's heartbeat names
    no such process: its retry is overdue only (:func:`_retry_overdue`)."""
    record = TrialRecord(trial)
    failer = record.interrupted_by or (record.marked_interrupted and record.owner)
    return bool(failer) and _is_gone(failer, alone)


def _runs_gpt_optuna(pid: int) -> bool:
    """Whether process ``pid`` runs gpt-optuna (true where that cannot be read)."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True
    return b"gpt_optuna" in command or b"gpt-optuna" in command


def has_orphans(running: Iterable[FrozenTrial]) -> bool:
    """Whether a RUNNING trial's tuner on this host is gone (:func:`recover_interrupted` recovers it)."""
    return any(_owner_is_dead(trial, False) for trial in running)


def recover_interrupted(study: optuna.Study, alone: bool = False) -> list[int]:
    """Fail the RUNNING trials whose tuner on this host is dead, and queue their candidates again;
    queue too any interrupted candidate whose retry a kill kept from being queued (a kill between
    failing a trial and queueing its retry), once per candidate: where the process that failed it
    is gone, or long after. ``alone``: no other tuner runs on this host (see :func:`tuner_presence`);
    a process that shares the study from another folder or host may still be about to queue a
    retry it failed, so ``alone`` alone never queues one.

    Trials of a tuner on another host are left to the storage heartbeat.
    """
    recovered = [
        trial.number
        for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        if _owner_is_dead(trial, alone) and fail_as_interrupted(study, trial, "the tuner was killed")
    ]
    trials = study.get_trials(deepcopy=False)
    retried = retried_numbers(trials)
    settled = {_params_key(t) for t in own_results(trials)} | {
        _params_key(t) for t in trials if not t.state.is_finished()
    }
    for trial in trials:
        key = _params_key(trial)
        if (
            is_interrupted(trial, retried)
            and trial.number not in retried
            and key not in settled
            and trial.params
            and (trial.number in recovered or _failer_is_gone(trial, alone) or _retry_overdue(trial))
        ):
            retry_trial(study, trial)
            settled.add(key)
    return recovered


def fail_as_interrupted(study: optuna.Study, trial: FrozenTrial, reason: str) -> bool:
    """Fail a RUNNING trial whose candidate was not evaluated as interrupted (``reason``), so that
    its candidate is retried; false where another process ended the trial first."""
    try:
        storage, stored_id = storage_of(study), trial_id(trial)
        storage.set_trial_user_attr(stored_id, INTERRUPTED_BY, PROCESS)
        storage.set_trial_user_attr(stored_id, INTERRUPTED, reason)
        storage.set_trial_state_values(stored_id, TrialState.FAIL)
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
    return json.dumps(TrialRecord(trial).candidate, sort_keys=True, default=str)


def orphans(study: optuna.Study, trials: Sequence[FrozenTrial]) -> tuple[int, ...]:
    """The RUNNING trials whose tuner on this host is gone (see :func:`recover_interrupted`)."""
    running = [t for t in trials if t.state is TrialState.RUNNING]
    if not running:
        return ()
    alone = no_tuner_runs_here(StudyFolder.of(study).root)
    return tuple(t.number for t in running if _owner_is_dead(t, alone))
