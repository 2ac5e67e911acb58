"""Several evaluation workers on one study: one thread per worker, each driving its own worker
process pinned to its GPU, all drawing on one trial budget that other processes share too.

A study ends with exactly its target of trials that hold a result, however many workers on
however many hosts search it: a worker starts a trial only while the study's finished and running
trials fall short of the target, and waits (rather than leaves) while the last ones run, in case
one of them is interrupted and its candidate comes back to the queue. Two processes can both count
one slot left before either's trial exists; the storage's start stamps then decide which trial
keeps it, and the other is given up unevaluated.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from gpt_optuna.core import interrupts
from gpt_optuna.core.errors import UserError, environment_fault
from gpt_optuna.protocol.jobs import WarmUpJob
from gpt_optuna.protocol.process import Worker, gpu_names
from gpt_optuna.search.ledger import StudyLedger
from gpt_optuna.search.objective import CandidateFailed, Lane, Objective, SearchTimeUp
from gpt_optuna.search.sampling import FreshSampler
from gpt_optuna.study.folder import StudyFolder
from gpt_optuna.study.optuna_internals import storage_of, trial_id
from gpt_optuna.study.recovery import fail_as_interrupted, has_orphans, recover_interrupted, requeue, retry_trial
from gpt_optuna.study.storage import count_by_state
from gpt_optuna.study.taxonomy import baseline_trial, has_own_result, is_interrupted, retried_numbers
from gpt_optuna.study.trial_record import TrialRecord, mark_interrupted

WAIT_S = 1.0
"""How often a worker with nothing to start looks at the study again."""
RECOVER_EVERY_S = 60.0
"""How often the whole study is searched for interrupted candidates whose retry was never queued."""
WARM_UP_S = 300.0


def measured_on(gpu: str, on_cpu: bool) -> str:
    """The device trials are measured on: the GPU's name (``none`` where there is none), or
    ``cpu`` where the candidates run there (``on_cpu``)."""
    return "cpu" if gpu == "none" or on_cpu else gpu


def pinned(gpu: str | None) -> dict[str, str]:
    """The environment that pins a worker process to one GPU."""
    return {} if gpu is None else {"CUDA_VISIBLE_DEVICES": gpu}


def lane_gpus(workers: int | None, gpus: str | None, log: Path) -> list[str | None]:
    """The GPU of each worker (None: the default device).

    ``gpus`` is ``all`` or a comma-separated list of CUDA device indices; each listed GPU gets
    one worker, or ``workers`` are spread over them in turn.
    """
    if workers is not None and workers < 1:
        raise UserError(f"--workers must be at least 1, got {workers}")
    if gpus is None:
        return [None] * (workers or 1)
    with Worker(log) as probe:
        names = probe.run(gpu_names, 120.0)
    if not names:
        raise UserError("--gpus: no GPU is visible here (no CUDA driver, device or CuPy)")
    if gpus.strip() == "all":
        listed = [str(i) for i in range(len(names))]
    else:
        listed = [g.strip() for g in gpus.split(",") if g.strip()]
        known = ", ".join(f"{i} {n}" for i, n in enumerate(names))
        bad = [g for g in listed if not g.isdigit() or int(g) >= len(names)]
        if not listed or bad:
            raise UserError(f"--gpus {gpus!r}: no GPU {bad[0] if bad else repr(gpus)} here; this host has {known}")
        if len(set(listed)) != len(listed):
            raise UserError(f"--gpus {gpus!r} lists a GPU twice")
    count = workers or len(listed)
    return [listed[i % len(listed)] for i in range(count)]


def open_workers(stack: contextlib.ExitStack, gpus: Sequence[str | None], log_dir: Path, log_name: str) -> list[Worker]:
    """One worker process per entry of ``gpus``, pinned to it, logging to ``log_dir/<log_name>.log``
    (the first) and ``<log_name>-<index>.log``; at the stack's end all are let go at once, then closed."""
    workers = [
        stack.enter_context(Worker(StudyFolder(log_dir).log(f"{log_name}-{index}" if index else log_name), pinned(gpu)))
        for index, gpu in enumerate(gpus)
    ]
    stack.callback(lambda: [worker.let_go() for worker in workers])
    return workers


@contextlib.contextmanager
def warming(workers: Sequence[Worker], backend: str) -> Iterator[list[str]]:
    """Start ``workers`` and load the backend in each, in the background while the block runs
    (the first trial of a cold worker would otherwise pay for it); yields the list that then holds
    the name of each one's GPU (``none`` without one)."""
    names: list[str] = []
    with concurrent.futures.ThreadPoolExecutor(max(len(workers), 1)) as pool:
        futures = [pool.submit(worker.run, WarmUpJob(backend), WARM_UP_S) for worker in workers]
        yield names
        names += [future.result() for future in futures]


def started_in(worker: Worker, backend: str) -> float:
    """Start ``worker`` with the backend loaded; the seconds that took (what a fresh process costs)."""
    start = time.monotonic()
    worker.run(WarmUpJob(backend), WARM_UP_S)
    return time.monotonic() - start


def make_lanes(workers: Sequence[Worker], gpus: Sequence[str | None], names: Sequence[str], on_cpu: bool) -> list[Lane]:
    """The lanes of ``workers``, each measuring on its GPU (``names``), or on the CPU (``on_cpu``)."""
    return [
        Lane(index, worker, gpu, measured_on(name, on_cpu))
        for index, (worker, gpu, name) in enumerate(zip(workers, gpus, names, strict=True))
    ]


def check_devices(lanes: Sequence[Lane], study_device: str | None, allow_mixed: bool) -> list[str]:
    """Refuse workers whose devices differ from each other or from the study's (latencies of
    different GPU models are never ranked together) unless ``allow_mixed``; warnings to show."""
    devices = sorted({lane.device for lane in lanes})
    mixed = len(devices) > 1 or (study_device is not None and devices != [study_device])
    if mixed and not allow_mixed:
        seen = ", ".join(devices)
        where = f"; the study was measured on {study_device}" if study_device and devices != [study_device] else ""
        raise UserError(
            f"workers on different devices ({seen}{where}): their latencies cannot be ranked together; "
            "use GPUs of one model, or --allow-mixed-gpus"
        )
    crowded = [gpu for gpu, count in Counter(lane.gpu for lane in lanes).items() if count > 1]
    if not crowded:
        return []
    which = "the default device" if crowded == [None] else f"GPU {', '.join(str(g) for g in crowded)}"
    return [
        f"warning: {len(lanes)} workers share {which}: candidates timed at the same moment on one device "
        "disturb each other's latency; give each worker its own GPU with --gpus"
    ]


def study_device(study: optuna.Study) -> str | None:
    """The device the study's baseline was measured on (None before it ran)."""
    baseline = baseline_trial(study.get_trials(deepcopy=False))
    return None if baseline is None else TrialRecord(baseline).gpu


class TrialBudget:
    """Which trials this process may start: while the study holds fewer finished and running
    trials than ``target`` (None: no limit), while one more trial (as long as the longest of the
    last ones) and the time ``kept`` for after the search fit before ``deadline`` (``time.monotonic``),
    and while the sampler has a candidate left (``sampler``: a covered space ends the search).

    The study is read once per claim, into the sampler's ledger (a ledger of its own without one).
    """

    def __init__(
        self,
        study: optuna.Study,
        target: int | None,
        deadline: float | None,
        kept: Callable[[], float] = lambda: 0.0,
        sampler: FreshSampler | None = None,
    ) -> None:
        self.study = study
        self.target = target
        self.deadline = deadline
        self.kept = kept
        self.sampler = sampler
        self.ledger = sampler.ledger if sampler is not None else StudyLedger()
        self._lock = threading.Lock()
        self._starting = 0  # claimed by a worker of this process, whose trial may not be in the storage yet
        self._stopped = threading.Event()
        self._recovered_at = time.monotonic()
        self.covered = False
        """The search ended because no candidate was left."""

    def stop(self) -> None:
        self._stopped.set()

    def has_room(self) -> bool:
        """Whether one more trial would start after those queued and running, as :meth:`claim`
        judges trials and time (without taking the slot)."""
        if self._stopped.is_set():
            return False
        self._read()
        if self._out_of_time(self.ledger.longest_recent_s()):
            return False
        finished, running, waiting = self.ledger.counts()
        return self.target is None or finished + running + waiting < self.target

    def claim(self) -> bool:
        """Whether a worker may start one more trial; waits while the study's last trials run."""
        while True:
            with self._lock:
                if self._stopped.is_set():
                    return False
                self._recover()
                if self._out_of_time(self.ledger.longest_recent_s()):
                    return False
                finished, running, waiting = self._counts(exact=False)
                if not waiting and self.sampler is not None and self.sampler.covered():
                    self.covered = True
                    return False
                if self.target is not None and finished + running + self._starting >= self.target:
                    finished, running, waiting = self._counts(exact=True)
                if self.target is None or finished + running + self._starting < self.target:
                    self._starting += 1
                    return True
                if finished >= self.target:
                    return False
            interrupts.check()
            time.sleep(WAIT_S)

    def beyond_target(self, trial: optuna.Trial) -> bool:
        """Whether a trial this process just started is beyond the target: the study's trials that
        started before it (by the storage's start stamps, then numbers) and still count, finished
        with their own result or running, fill it already. A claim counts before its trial exists,
        so another process may take the last slot in between; every process reads the same stamps,
        so exactly one of them keeps it (the other gives its trial up: :meth:`give_up`)."""
        if self.target is None:
            return False
        counted = count_by_state(self.study)
        if counted is not None and sum(counted.get(state, 0) for state in LIVE_STATES) <= self.target:
            return False
        trials = self.study.get_trials(deepcopy=False)
        retried = retried_numbers(trials)
        mine = next(t for t in trials if t.number == trial.number)
        earlier = sum(
            1
            for t in trials
            if _start_order(t) < _start_order(mine) and (t.state is TrialState.RUNNING or has_own_result(t, retried))
        )
        return earlier >= self.target

    def give_up(self, trial: optuna.Trial) -> None:
        """Mark a trial started beyond the target as interrupted before it ran and, where it came
        from the queue (enqueued or a retry), queue it again as it was."""
        mark_interrupted(trial, f"not run: other workers took the study's {self.target} trials")
        frozen = storage_of(self.study).get_trial(trial_id(trial))
        if TrialRecord(frozen).queued:
            requeue(self.study, frozen)

    def ended(self, trial: FrozenTrial) -> None:
        """A trial of this process ended: the ledger holds it before the next read."""
        self.ledger.add(trial)

    def _out_of_time(self, longest: float) -> bool:
        """Whether one more trial as long as ``longest`` and the time kept for after the search
        would run past the deadline."""
        return self.deadline is not None and time.monotonic() + longest + self.kept() >= self.deadline

    def started(self) -> None:
        """The claimed trial is in the storage, RUNNING, named as this process's."""
        with self._lock:
            self._starting -= 1

    def search_left(self) -> float | None:
        """Seconds left for the search: before the deadline, less the time kept for after it."""
        return None if self.deadline is None else self.deadline - self.kept() - time.monotonic()

    def _read(self) -> None:
        trials = self.study.get_trials(deepcopy=False)
        if self.sampler is not None:
            self.sampler.read(trials)
        else:
            self.ledger.update(trials)

    def _recover(self) -> None:
        """Fail the trials of dead processes, so their candidates are retried: a lost host's where
        the storage keeps heartbeats, a dead tuner's on this host (the whole study is searched
        for them now and then)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(self.study)
        if time.monotonic() - self._recovered_at > RECOVER_EVERY_S or has_orphans(self.ledger.running()):
            recover_interrupted(self.study)
            self._recovered_at = time.monotonic()
            self._read()

    def _counts(self, exact: bool) -> tuple[int, int, int]:
        """Trials holding a result, running and waiting (in any process). Unless ``exact``, a count
        by the database where there is one, in which every finished trial counts as holding its
        result (an interrupted one does not): never fewer than there are."""
        counted = None if exact else count_by_state(self.study)
        if counted is None:
            self._read()
            return self.ledger.counts()
        finished = sum(counted.get(state, 0) for state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL))
        return finished, counted.get(TrialState.RUNNING, 0), counted.get(TrialState.WAITING, 0)


LIVE_STATES = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL, TrialState.RUNNING)


class BeyondTarget(Exception):
    """Raised for a trial started beyond the study's target (see :meth:`TrialBudget.beyond_target`)."""


def _start_order(trial: FrozenTrial) -> tuple[float, int]:
    started = trial.datetime_start
    return (started.timestamp() if started is not None else float("inf"), trial.number)


def run_lanes(
    sampler: optuna.samplers.BaseSampler,
    lanes: Sequence[Lane],
    objective: Objective,
    budget: TrialBudget,
    on_trial: Callable[[optuna.Study, FrozenTrial], None],
) -> None:
    """Search the budget's study with every lane at once until the budget is spent, telling
    ``on_trial`` as each trial ends. After an error (a Ctrl-C before any other), once every lane has
    stopped, the trials it stopped are queued again and it is raised.

    The lanes share the budget's study's storage, and so its cache of the trials: one copy of a
    large study in memory, not one per lane and one more for the budget."""
    errors: list[BaseException] = []
    shared = storage_of(budget.study)

    def lane_main(lane: Lane) -> None:
        study = optuna.load_study(study_name=budget.study.study_name, storage=shared, sampler=sampler)
        began: list[int] = []

        def evaluate(trial: optuna.Trial) -> Any:
            budget.started()
            began.append(trial.number)
            if budget.beyond_target(trial):
                budget.give_up(trial)
                raise BeyondTarget
            return objective(trial, lane)

        try:
            while budget.claim():
                began.clear()
                try:
                    callbacks = [lambda _, trial: budget.ended(trial), on_trial, stop_on_ctrl_c]
                    study.optimize(evaluate, n_trials=1, catch=(CandidateFailed, BeyondTarget), callbacks=callbacks)
                finally:
                    if not began:  # no trial was started after all
                        budget.started()
                if objective.space_exhausted:
                    budget.stop()
        except SearchTimeUp:  # a trial ran into the time kept for after the search: it is queued again
            budget.stop()
        except BaseException as exc:
            errors.append(with_trial_fate(study, began, exc))
            budget.stop()

    ended = [threading.Event() for _ in lanes]

    def lane_thread(lane: Lane, done: threading.Event) -> None:
        try:
            lane_main(lane)
        finally:
            done.set()

    threads = [
        threading.Thread(target=lane_thread, args=(lane, done), name=f"worker-{lane.index}")
        for lane, done in zip(lanes, ended, strict=True)
    ]
    for thread in threads:
        thread.start()
    try:
        _wait_all(ended)
    except KeyboardInterrupt as exc:
        budget.stop()  # the workers see the press themselves (interrupts.check) and stop their trials
        _wait_all(ended)
        errors.insert(0, exc)
    finally:
        for thread in threads:
            thread.join()
    trials = budget.study.get_trials(deepcopy=False)
    for number in objective.interrupted:  # the next run (or another worker) retries them
        retry_trial(budget.study, trials[number])
    objective.interrupted.clear()
    if errors:
        raise next((e for e in errors if isinstance(e, KeyboardInterrupt)), errors[0])


def with_trial_fate(study: optuna.Study, began: list[int], exc: BaseException) -> BaseException:
    """A fault of the machine (a full disk) that stopped a trial, as one line that says what became
    of the trial: failed as interrupted (the next run retries it), or left running where even that
    could not be written (``status`` names it; the next run fails and retries it). Other errors as
    they are."""
    fault = environment_fault(exc)
    if fault is None or not began:
        return exc
    number = began[-1]
    try:
        trials = study.get_trials(deepcopy=False)
        trial = next(t for t in trials if t.number == number)
        if trial.state is TrialState.RUNNING:
            marked = fail_as_interrupted(study, trial, f"stopped: {fault}")
            fate = f"trial {number} " + (
                "was marked as interrupted; the next run retries it" if marked else "was ended by another process"
            )
        elif is_interrupted(trial, retried_numbers(trials)):
            fate = f"trial {number} was stopped before its result was kept; the next run retries it"
        else:
            fate = f"trial {number} had ended ({trial.state.name.lower()})"
    except Exception:
        fate = (
            f"trial {number} is left running (the study could not be written): status names it, and the next run"
            " fails and retries it"
        )
    error = UserError(f"{fault}; {fate}")
    error.__cause__ = exc
    return error


def stop_on_ctrl_c(*_: object) -> None:
    interrupts.check()


def _wait_all(events: Sequence[threading.Event]) -> None:
    """Wait until every event is set. (Not ``Thread.join``: a Ctrl-C inside a join can leave the
    thread looking finished while it runs on.)"""
    for event in events:
        while not event.wait(0.2):
            pass
