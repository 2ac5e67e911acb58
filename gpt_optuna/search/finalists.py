"""Finalists: the best feasible candidates and the baseline re-measured together, interleaved.

Trial latencies come from separate moments of a long search, and a shared machine drifts. Before
a winner is declared, the best K feasible candidates and the baseline are built again in fresh
processes and timed in rounds (A B C ..., then B C A ...), so drift hits all of them alike. Several
processes, because a process is a sample too: an engine whose latency is CPU-side launch work
runs as fast as the CPU its process gets, and that differs between processes by far more than
drift. The ranking by speedup, each speedup the ratio of the baseline's median to the candidate's
(as shown), with a bootstrap 95 % interval of the paired per-round ratios over
processes and rounds, are stored in the study (user attr ``confirmed``); ``best`` and the report
use them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from optuna.trial import FrozenTrial, TrialState

from gpt_optuna.core import interrupts
from gpt_optuna.evaluation.confirm_job import BLOCK, ROUNDS, ROUNDS_BUDGET_S, ConfirmJob
from gpt_optuna.evaluation.jobs import EvaluateJob
from gpt_optuna.evaluation.measure import MeasureSettings, bootstrap_ratio
from gpt_optuna.evaluation.worker import FailureKind, JobFailure, Worker
from gpt_optuna.study.artifacts import INPUTS_FILE, REFERENCE_FILE
from gpt_optuna.study.record import CONFIRMED_ATTR, StudyRecord
from gpt_optuna.study.taxonomy import baseline_trial, measured_latency_ms

WORKER_START_S = 5.0
"""A fresh worker process's start and library load, in the estimate of a process's time where it
was not measured."""


def process_seconds(candidates: list[FrozenTrial], settings: MeasureSettings, start_s: float = WORKER_START_S) -> float:
    """One confirmation process's estimated seconds for ``candidates`` (the baseline included),
    from what the search measured: the process's start (``start_s``), each one's build, a warm-up
    each, and the interleaved rounds (each one's search latency ``ROUNDS x BLOCK`` times, twice
    over for the timer's own work, at most the rounds' budget)."""
    builds = sum(float(t.user_attrs.get("build_s") or 0.0) for t in candidates)
    warm = len(candidates) * min(1.0, settings.budget_s)
    latency_s = sum(measured_latency_ms(t) or 0.0 for t in candidates) / 1000
    return start_s + builds + warm + min(ROUNDS_BUDGET_S, 2 * ROUNDS * BLOCK * latency_s)


def finalists(study: optuna.Study, top: int) -> tuple[FrozenTrial | None, list[FrozenTrial]]:
    """The baseline trial and the ``top`` best distinct feasible candidates (reused trials skipped)."""
    trials = study.get_trials(deepcopy=False)
    baseline = baseline_trial(trials)
    if baseline is not None and "latency" not in baseline.user_attrs:
        baseline = None  # nothing measured to compare with
    complete = [t for t in trials if t.state is TrialState.COMPLETE and t.values and "reused_from" not in t.user_attrs]
    complete.sort(key=lambda t: t.values[0])
    best = [t for t in complete if baseline is None or t.number != baseline.number][:top]
    return baseline, best


def summarize_rounds(numbers: list[int], medians: np.ndarray, processes: np.ndarray) -> dict[str, Any]:
    """Ranking and speedups (column 0 is the baseline) from the per-round medians and the process
    each round ran in."""
    rows = []
    labels = np.unique(processes)
    baseline_ms = float(np.median(medians[:, 0]))
    for column, number in enumerate(numbers):
        _, low, high = bootstrap_ratio(medians[:, 0], medians[:, column], processes)
        median_ms = float(np.median(medians[:, column]))
        speedup = baseline_ms / median_ms  # the ratio of the two medians shown beside it
        low, high = min(low, speedup), max(high, speedup)  # resampled percentiles can miss a tight estimate
        rows.append(
            {
                "number": number,
                "median_ms": median_ms,
                "process_ms": [float(np.median(medians[processes == p, column])) for p in labels],
                "speedup": speedup,
                "ci_low": low,
                "ci_high": high,
                "significant": low > 1.0,
            }
        )
    ranking = sorted(rows[1:], key=lambda row: -row["speedup"])
    return {"baseline": rows[0], "ranking": ranking, "rounds": len(medians), "processes": len(labels)}


def confirm(
    study: optuna.Study,
    template: EvaluateJob,
    worker_log: Any,
    top: int = 5,
    processes: int = 3,
    say: Callable[[str], None] = lambda _: None,
    env: dict[str, str] | None = None,
    deadline: float | None = None,
    start_s: float = WORKER_START_S,
) -> dict[str, Any] | None:
    """Re-measure the finalists in ``processes`` fresh worker processes, one after the other (with
    ``env``: pinned to one GPU; ``start_s``: a worker's measured start), and store the result in
    the study. Each process builds and visits the candidates in another order; ``say`` is told as
    each process starts.

    A process is given time from what the search measured (:func:`process_seconds`, thrice over
    and a minute besides), never a fixed slice; with a ``deadline`` (monotonic seconds) each one's
    rounds end within its share of the time left, none runs past the deadline, and a process that
    would not fit (as long as the longest one so far) is not started: the result holds the
    processes that finished (at least one, else the first one's failure is raised)."""
    baseline, best = finalists(study, top)
    if baseline is None or not best:
        return None
    trials = [baseline, *best]
    expected = process_seconds(trials, template.settings, start_s)
    tables, labels = [], []
    for process in range(processes):
        interrupts.check()
        left = None if deadline is None else deadline - time.monotonic()
        if tables and left is not None and left < expected:
            say(f"  processes {process + 1}-{processes} left out: no time left before --timeout")
            break
        say(f"  process {process + 1} of {processes}: building {len(trials)} candidates, timing rounds ...")
        order = [(process + k) % len(trials) for k in range(len(trials))]
        timeout_s, rounds_until = 3 * expected + 60, None
        if left is not None:
            timeout_s = min(timeout_s, max(left, 1.0))
            rounds_until = time.monotonic() + left / (processes - process) - 1.0
        job = ConfirmJob(template, tuple(dict(trials[i].params) for i in order), rounds_until=rounds_until)
        started = time.monotonic()
        try:
            with Worker(worker_log, env) as worker:
                measured = np.asarray(worker.run(job, timeout_s))
        except JobFailure as failure:
            if not tables or failure.kind is not FailureKind.TIMEOUT or left is None:
                raise
            say(f"  process {process + 1} left out: it ran into --timeout")
            break
        expected = max(expected, time.monotonic() - started)
        table = np.empty_like(measured)
        table[:, order] = measured
        tables.append(table)
        labels += [process] * len(table)
    result = summarize_rounds([t.number for t in trials], np.vstack(tables), np.asarray(labels))
    study.set_user_attr(CONFIRMED_ATTR, result)
    return result


def template_from_study(study: optuna.Study, model: Path | None = None, workdir: Path | None = None) -> EvaluateJob:
    """Rebuild the evaluation settings of a study from what it recorded (for ``gpt-optuna confirm``
    and joining workers): the recorded model file, or ``model`` (same content), with the data in
    the study folder (or ``workdir``)."""
    from gpt_optuna.core.errors import UserError
    from gpt_optuna.evaluation.accuracy import parse_criterion
    from gpt_optuna.evaluation.measure import MeasureSettings
    from gpt_optuna.graph.model import ShapeRange, load_model_info, with_distinct_dims
    from gpt_optuna.study.artifacts import verified
    from gpt_optuna.study.record import MEASURE_ATTR, study_folder

    record = StudyRecord.of(study)
    if record is None:
        raise UserError(f"study {study.study_name!r} was not made by gpt-optuna")
    if record.dry_run:
        raise UserError(f"study {study.study_name!r} is a dry run: there is no latency to confirm")
    info = load_model_info(model or record.model)
    if info.sha256 != record.model_sha256:
        raise UserError(f"{info.path} has changed since the study was made")
    workdir = verified(study, (workdir or study_folder(study)).resolve())
    info = with_distinct_dims(info, workdir / "models")
    for name in (INPUTS_FILE, REFERENCE_FILE):
        if not (workdir / name).is_file():
            raise UserError(f"the study folder {workdir} lacks {name}: it was moved or removed")
    return EvaluateJob.in_study(
        workdir,
        record.backend,
        info,
        {n: ShapeRange(*(tuple(s) for s in r)) for n, r in (record.shapes or {}).items()},
        parse_criterion(record.accuracy, user_metrics=record.metric is not None),
        MeasureSettings(**study.user_attrs.get(MEASURE_ATTR, {})),
        record.defaults,
        metric=record.metric,
    )
