"""Finalists: the best feasible candidates and the baseline re-measured together, interleaved.

Trial latencies come from separate moments of a long search, and a shared machine drifts. Before
a winner is declared, the best K feasible candidates and the baseline are built again in fresh
processes and timed in rounds (A B C ..., then B C A ...), so drift hits all of them alike. Several
processes, because a process is a sample too: an engine whose latency is CPU-side launch work
runs as fast as the CPU its process gets, and that differs between processes by far more than
drift. :mod:`gpt_optuna.study.evidence` turns the rounds into speedups with intervals over the
processes and a verdict; the result is stored in the study (user attr ``confirmed``), which every
reader shows.

Each process reports every round as soon as it is timed, so a confirmation stopped by Ctrl-C, by
``--timeout`` or by a process that fails keeps what it measured; a process is given time by how
it advances (a worker that says nothing for :func:`quiet_seconds` is hung), not by a guess of its
whole length.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from optuna.trial import FrozenTrial

from gpt_optuna.core import interrupts
from gpt_optuna.core.errors import UserError
from gpt_optuna.core.measure_settings import MeasureSettings
from gpt_optuna.protocol.jobs import ConfirmJob, EvaluateJob, RoundTimed
from gpt_optuna.protocol.process import FailureKind, JobFailure, Worker
from gpt_optuna.protocol.timing import BLOCK, MIN_ROUNDS, ROUNDS, ROUNDS_BUDGET_S, block_for
from gpt_optuna.search.options import DEFAULT_PROCESSES, DEFAULT_TOP
from gpt_optuna.study.artifacts import INPUTS_FILE, REFERENCE_FILE, kept_engine
from gpt_optuna.study.confirmation import record_confirmation, summarize_rounds
from gpt_optuna.study.record import StudyRecord, recorded_measure
from gpt_optuna.study.taxonomy import baseline_trial, engine_default_trials, search_ranking, your_trial
from gpt_optuna.study.trial_record import TrialRecord

WORKER_START_S = 5.0
"""A fresh worker process's start and library load, in the estimate of a process's time where it
was not measured."""
QUIET_S = 60.0
"""A confirmation process that says nothing for this long, besides its longest step, is hung."""
CPU_SETTLE_S = 0.05
"""The pause before each block of a CPU engine (:func:`settle_cpu`), in a process's estimate."""
TELL_EVERY_S = 2.0
"""Rounds are told at most this often (a fast model's rounds take milliseconds)."""


class ConfirmationFailed(UserError):
    """Not one process of the confirmation measured its rounds; the message says why (one line),
    ``reason`` how the last process ended."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"the finalists could not be re-measured: {reason}")
        self.reason = reason


def process_seconds(
    candidates: list[FrozenTrial], settings: MeasureSettings, start_s: float = WORKER_START_S, rounds: int = ROUNDS
) -> float:
    """One confirmation process's estimated seconds for ``candidates`` (the baseline included),
    from what the search measured: the process's start (``start_s``), each one's build (from the
    caches where it left them), a warm-up each, and ``rounds`` interleaved rounds (each one's search
    latency :func:`block_for` times, twice over for the timer's own work, at most the rounds'
    budget; on the CPU the pause before each block)."""
    builds = sum(TrialRecord(t).fresh_build_s or 0.0 for t in candidates)
    warm = sum(warm_up_seconds(TrialRecord(t).latency_ms or 0.0, settings) for t in candidates)
    on_cpu = all(TrialRecord(t).gpu == "cpu" for t in candidates)
    settling = rounds * len(candidates) * CPU_SETTLE_S if on_cpu else 0.0
    return start_s + builds + warm + settling + min(ROUNDS_BUDGET_S, rounds * round_seconds(candidates))


def warm_up_seconds(latency_ms: float, settings: MeasureSettings) -> float:
    """A candidate's warm-up in a confirmation process (a measurement of at most a second): its
    second, or the launches it takes at least (a warm-up block and the fewest samples) where a
    slow model's take longer."""
    launches = settings.warmup_min + max(settings.min_samples, settings.block)
    return max(min(1.0, settings.budget_s), launches * latency_ms / 1000)


def block_of(candidates: list[FrozenTrial]) -> int:
    """Launches per candidate in a round of ``candidates``: by their search latencies (:func:`block_for`)."""
    return block_for([TrialRecord(t).latency_ms or 0.0 for t in candidates])


def round_seconds(candidates: list[FrozenTrial], block: int | None = None) -> float:
    """One round's estimated seconds: each one's search latency ``block`` times (default:
    :func:`block_of`), twice over for the timer's own work."""
    launches = block_of(candidates) if block is None else block
    return 2 * launches * sum(TrialRecord(t).latency_ms or 0.0 for t in candidates) / 1000


def quiet_seconds(candidates: list[FrozenTrial], settings: MeasureSettings) -> float:
    """How long a confirmation process may go without a word before it counts as hung: its
    longest step (a build, a warm-up, a round) thrice over, and :data:`QUIET_S` besides."""
    builds = [TrialRecord(t).build_s or 0.0 for t in candidates]
    warm = [warm_up_seconds(TrialRecord(t).latency_ms or 0.0, settings) for t in candidates]
    step = max([*builds, *warm, round_seconds(candidates)])
    return QUIET_S + 3 * step


def finalists(study: optuna.Study, top: int) -> tuple[FrozenTrial | None, list[FrozenTrial]]:
    """The baseline trial and the ``top`` best distinct feasible candidates (reused trials skipped)."""
    trials = study.get_trials(deepcopy=False)
    baseline = baseline_trial(trials)
    if baseline is not None and TrialRecord(baseline).latency is None:
        baseline = None  # nothing measured to compare with
    best = [t for t in search_ranking(trials) if baseline is None or t.number != baseline.number][:top]
    return baseline, best


def kept_evaluations(
    template: EvaluateJob, study: optuna.Study, trials: list[FrozenTrial], say: Callable[[str], None]
) -> list[EvaluateJob]:
    """``template`` for each of ``trials``, with the engine each kept (:func:`kept_engine`), so that
    what is re-measured is what was measured and what an export ships; a kept engine that is gone
    is said, and that candidate built again."""
    found = []
    for trial in trials:
        path, gone = kept_engine(study, trial)
        if gone is not None:
            say(f"  {gone}")
        found.append(replace(template, candidate=dict(trial.params), saved_engine=path))
    return found


def with_references(trials: list[FrozenTrial], every: list[FrozenTrial]) -> list[FrozenTrial]:
    """``trials`` (the baseline and finalists) and after them the trials the winner is also stated
    against (of the study's trials ``every``): the user's own configuration, then each other
    engine's defaults, where it measured a latency and is not among them."""
    kept = list(trials)
    for reference in [your_trial(every), *engine_default_trials(every).values()]:
        measured = reference is not None and TrialRecord(reference).latency is not None
        if measured and reference.number not in {t.number for t in kept}:
            kept.append(reference)
    return kept


class _Rounds:
    """The rounds the confirmation's processes reported, in the finalists' order."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.rows: list[np.ndarray] = []
        self.labels: list[int] = []
        self.times: list[float] = []
        """When each round arrived (monotonic seconds)."""

    def add(self, process: int, order: list[int], medians: tuple[float, ...]) -> None:
        row = np.empty(self.count)
        row[order] = medians
        self.rows.append(row)
        self.labels.append(process)
        self.times.append(time.monotonic())

    def least_done(self, process: int) -> float | None:
        """When ``process`` had timed :data:`MIN_ROUNDS` rounds (None: it did not)."""
        times = [t for label, t in zip(self.labels, self.times, strict=True) if label == process]
        return times[MIN_ROUNDS - 1] if len(times) >= MIN_ROUNDS else None

    def usable(self) -> tuple[np.ndarray, np.ndarray]:
        """The rounds of the processes that timed :data:`MIN_ROUNDS` or more."""
        labels = np.asarray(self.labels)
        kept = [p for p in np.unique(labels) if np.count_nonzero(labels == p) >= MIN_ROUNDS]
        mask = np.isin(labels, kept)
        return np.asarray(self.rows)[mask], labels[mask]


def _listener(
    timed: _Rounds, process: int, order: list[int], asked: str, say: Callable[[str], None]
) -> Callable[[object], None]:
    """What a confirmation process reports: each round kept in ``timed``, told at most every
    :data:`TELL_EVERY_S` with the rounds ``asked`` (in words); its steps before the rounds
    (building, warming up) told as they come."""
    told = [time.monotonic()]

    def heard(message: object) -> None:
        round_timed = isinstance(message, RoundTimed)
        if round_timed:
            timed.add(process, order, message.medians)
        if time.monotonic() - told[0] >= TELL_EVERY_S:
            told[0] = time.monotonic()
            say(f"    round {timed.labels.count(process)} ({asked})" if round_timed else f"    {message}")

    return heard


@dataclass(frozen=True)
class Interleaved:
    """What :func:`interleave` measured: per round, each evaluation's median (ms), the process
    each round ran in (processes that timed fewer than :data:`MIN_ROUNDS` left out), and why it
    ended early (None: every process ran)."""

    medians: np.ndarray
    processes: np.ndarray
    stopped: str | None


def interleave(
    evaluations: list[EvaluateJob],
    worker_log: Any,
    processes: int,
    say: Callable[[str], None],
    expected_s: float,
    quiet_s: float,
    env: dict[str, str] | None = None,
    deadline: float | None = None,
    rounds: int = ROUNDS,
    block: int = BLOCK,
) -> Interleaved:
    """Time ``evaluations`` in interleaved rounds in ``processes`` fresh worker processes, one
    after the other, each building and visiting them in another order (``say`` is told as each
    process starts and as its rounds advance), ``block`` launches per candidate in a round. A
    process is expected to take ``expected_s`` to its :data:`MIN_ROUNDS` rounds (then as long as
    the longest one so far took to them) and counts as hung after ``quiet_s`` without a word.

    With a ``deadline`` (monotonic seconds) each process's rounds end within its share of the time
    left (up to ``rounds``: they fill it), none runs past the deadline, and a process that would
    not reach its :data:`MIN_ROUNDS` rounds in time (as expected) is not started. A process that fails, hangs
    or runs into the deadline ends the measurement with what was measured; so does a Ctrl-C,
    raised again once the rounds are in hand (:class:`Stopped` carries them). Where not one
    process measured its rounds, :class:`ConfirmationFailed` (after a Ctrl-C: KeyboardInterrupt)
    is raised."""
    timed = _Rounds(len(evaluations))
    asked = f"{rounds} rounds" if deadline is None else f"up to {rounds} rounds"
    stopped: str | None = None
    interrupted = False
    least = 0.0  # the longest a process so far took to its MIN_ROUNDS rounds
    try:
        for process in range(processes):
            interrupts.check()
            left = None if deadline is None else deadline - time.monotonic()
            need = least or expected_s
            if timed.rows and left is not None and left < need:
                stopped = "no time left before --timeout"
                say(f"  processes {process + 1}-{processes} left out: {stopped}")
                break
            say(f"  process {process + 1} of {processes}: building {len(evaluations)} candidates, {asked} ...")
            order = [(process + k) % len(evaluations) for k in range(len(evaluations))]
            rounds_until = None if left is None else time.monotonic() + left / (processes - process) - 1.0
            job = ConfirmJob(tuple(evaluations[i] for i in order), rounds, block, rounds_until=rounds_until)
            started = time.monotonic()
            listener = _listener(timed, process, order, asked, say)
            stopped = _run_process(Worker(worker_log, env), job, left, listener, quiet_s, deadline, process)
            if stopped is not None:
                say(f"  {stopped}")
                break
            say(f"    {timed.labels.count(process)} rounds in {time.monotonic() - started:.1f} s")
            done = timed.least_done(process)
            least = max(least, (done if done is not None else time.monotonic()) - started)
    except KeyboardInterrupt:
        stopped, interrupted = f"stopped by {interrupts.cause()}", True
    return _measured(timed, stopped, interrupted)


def _run_process(
    worker: Worker,
    job: ConfirmJob,
    left: float | None,
    listener: Any,
    quiet_s: float,
    deadline: float | None,
    process: int,
) -> str | None:
    """One confirmation process run to its end in ``worker``; why it stopped the measurement, where it did."""
    try:
        with worker:
            worker.run(job, None if left is None else max(left, 1.0), listener, quiet_s)
    except JobFailure as failure:
        late = failure.kind is FailureKind.TIMEOUT and deadline is not None and time.monotonic() >= deadline - 1
        return f"process {process + 1} " + ("ran into --timeout" if late else f"failed: {failure}")
    return None


def _measured(timed: _Rounds, stopped: str | None, interrupted: bool) -> Interleaved:
    """The rounds measured (:class:`Stopped` raised with them after a Ctrl-C); where there are none,
    :class:`ConfirmationFailed` (after a Ctrl-C: KeyboardInterrupt)."""
    medians, labels = timed.usable()
    if not len(medians):
        if interrupted:
            raise KeyboardInterrupt
        raise ConfirmationFailed(str(stopped))
    found = Interleaved(medians, labels, stopped)
    if interrupted:
        raise Stopped(found)
    return found


class Stopped(KeyboardInterrupt):
    """A Ctrl-C (or SIGTERM, SIGHUP) during :func:`interleave`, with the rounds measured before it."""

    def __init__(self, measured: Interleaved) -> None:
        super().__init__()
        self.measured = measured


def confirm(
    study: optuna.Study,
    template: EvaluateJob,
    worker_log: Any,
    top: int = DEFAULT_TOP,
    processes: int = DEFAULT_PROCESSES,
    say: Callable[[str], None] = lambda _: None,
    env: dict[str, str] | None = None,
    deadline: float | None = None,
    start_s: float = WORKER_START_S,
    rounds: int = ROUNDS,
) -> dict[str, Any] | None:
    """Re-measure the finalists (:func:`finalists`) and the baseline, interleaved (:func:`interleave`)
    in ``processes`` fresh worker processes (with ``env``: pinned to one GPU; ``start_s``: a
    worker's measured start), and store the result in the study; None where there is nothing to
    confirm. What a stopped confirmation measured is stored too (the result says why it stopped),
    and the Ctrl-C raised again."""
    baseline, best = finalists(study, top)
    if baseline is None or not best:
        return None
    every = study.get_trials(deepcopy=False)
    yours = your_trial(every)
    trials = with_references([baseline, *best], every)
    evaluations = kept_evaluations(template, study, trials, say)
    expected = process_seconds(trials, template.settings, start_s, min(rounds, MIN_ROUNDS))
    quiet = quiet_seconds(trials, template.settings)
    block = block_of(trials)
    stop: Stopped | None = None
    try:
        measured = interleave(evaluations, worker_log, processes, say, expected, quiet, env, deadline, rounds, block)
    except Stopped as exc:
        stop, measured = exc, exc.measured
    numbers = [t.number for t in trials]
    mine = yours.number if yours is not None and yours.number in numbers else None
    engines = {engine: t.number for engine, t in engine_default_trials(every).items()}
    extras = len(trials) - len(best) - 1
    result = summarize_rounds(
        numbers, measured.medians, measured.processes, mine, extras, engines, (processes, measured.stopped)
    )
    record_confirmation(study, result)
    if stop is not None:
        raise stop
    return result


def template_from_study(study: optuna.Study, model: Path | None = None, workdir: Path | None = None) -> EvaluateJob:
    """Rebuild the evaluation settings of a study from what it recorded (for ``gpt-optuna confirm``
    and joining workers): the recorded model file, or ``model`` (same content), with the data in
    the study folder (or ``workdir``)."""
    from gpt_optuna.graph.model import ShapeRange, load_model_info
    from gpt_optuna.graph.model_cache import with_distinct_dims
    from gpt_optuna.protocol.accuracy import parse_criterion
    from gpt_optuna.study.artifacts import verified
    from gpt_optuna.study.folder import StudyFolder
    from gpt_optuna.study.sources import check_weights

    record = StudyRecord.of(study)
    if record is None:
        raise UserError(f"study {study.study_name!r} was not made by gpt-optuna")
    if record.dry_run:
        raise UserError(f"study {study.study_name!r} is a dry run: there is no latency to confirm")
    # the folder first: where it moved with the model, its error says how to link both back
    workdir = verified(study, (workdir or StudyFolder.of(study).root).resolve())
    info = load_model_info(model or record.model)
    if info.sha256 != record.model_sha256:
        raise UserError(f"{info.path} has changed since the study was made")
    check_weights(info.path, record)
    info = with_distinct_dims(info, StudyFolder(workdir).models)
    for name in (INPUTS_FILE, REFERENCE_FILE):
        if not (workdir / name).is_file():
            raise UserError(f"the study folder {workdir} lacks {name}: it was moved or removed")
    return EvaluateJob.in_study(
        workdir,
        record.backend,
        info,
        {n: ShapeRange(*(tuple(s) for s in r)) for n, r in (record.shapes or {}).items()},
        parse_criterion(record.accuracy, user_metrics=record.metric is not None),
        recorded_measure(study),
        record.defaults,
        metric=record.metric,
    )
