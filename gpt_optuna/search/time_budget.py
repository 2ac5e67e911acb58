"""How ``--timeout`` is shared between the search and the finalists' re-measurement.

``--timeout`` bounds the whole command, the space check included. The finalists' re-measurement
(:mod:`gpt_optuna.search.finalists`) needs time at the end: its cost is estimated from what the search
measured (each finalist's and the baseline's build time, their latencies, a worker start per
process), and up to :data:`CONFIRM_SHARE` of ``--timeout`` is kept for it. The search starts a
trial only while that trial (as long as the longest of the last ones) and the kept time still fit
before the deadline, and a trial still running when the search's time is up is stopped and queued
again. When the kept time is short, fewer finalists or processes are re-measured, never a process
that cannot finish.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import optuna

from gpt_optuna.protocol.timing import MeasureSettings
from gpt_optuna.search.finalists import WORKER_START_S, finalists, process_seconds, with_yours
from gpt_optuna.study.taxonomy import your_trial

CONFIRM_SHARE = 0.25
"""At most this share of ``--timeout`` is kept for the finalists' re-measurement."""
FINISH_S = 2.0
"""Kept at the very end: the summary, the report of what comes next."""


@dataclass(frozen=True)
class ConfirmPlan:
    """How many finalists are re-measured in how many processes, and the time that takes."""

    top: int
    processes: int
    process_s: float
    """The estimated seconds of one process: its start, the builds, the warm-ups and the rounds."""

    @property
    def total_s(self) -> float:
        return self.processes * self.process_s


def plan_confirmation(
    study: optuna.Study,
    top: int,
    processes: int,
    settings: MeasureSettings,
    left_s: float | None,
    start_s: float = WORKER_START_S,
) -> ConfirmPlan | None:
    """The most processes, then the most finalists, whose estimated time fits ``left_s`` (all of
    them without a bound); None where there is nothing to confirm or not even one finalist in one
    process fits. ``start_s``: a worker process's measured start."""
    baseline, best = finalists(study, top)
    if baseline is None or not best:
        return None
    yours = your_trial(study.get_trials(deepcopy=False))
    for count in range(processes, 0, -1):
        for k in range(len(best), 0, -1):
            seconds = process_seconds(with_yours([baseline, *best[:k]], yours), settings, start_s)
            if left_s is None or count * seconds <= left_s:
                return ConfirmPlan(k, count, seconds)
    return None


def kept_for_confirmation(
    study: optuna.Study,
    top: int,
    processes: int,
    settings: MeasureSettings,
    timeout_s: float,
    start_s: float = WORKER_START_S,
) -> float:
    """The seconds the search leaves at the end: the whole confirmation's estimated time, at most
    :data:`CONFIRM_SHARE` of ``timeout_s``, and the finish."""
    if top <= 0:
        return FINISH_S
    plan = plan_confirmation(study, top, processes, settings, None, start_s)
    wanted = plan.total_s if plan is not None else 0.0
    return min(wanted, CONFIRM_SHARE * timeout_s) + FINISH_S


KEPT_REFRESH_S = 15.0
"""How often, at most, the time kept for the finalists is estimated again during a search."""


def refresh_s(timeout_s: float | None) -> float:
    """How long an estimate of the time kept may stand: :data:`KEPT_REFRESH_S`, or 1 % of a shorter
    ``--timeout`` (a short search has few trials to read, and little time to misjudge)."""
    return KEPT_REFRESH_S if timeout_s is None else min(KEPT_REFRESH_S, timeout_s / 100)


class Refreshed:
    """A figure worked out again at most every ``every_s`` seconds (the time kept for the
    finalists reads every trial: once per trial would cost a long search more than its trials)."""

    def __init__(self, work_out: Callable[[], float], every_s: float = KEPT_REFRESH_S) -> None:
        self.work_out = work_out
        self.every_s = every_s
        self._value = 0.0
        self._at: float | None = None

    def __call__(self) -> float:
        now = time.monotonic()
        if self._at is None or now - self._at >= self.every_s:
            self._value, self._at = self.work_out(), now
        return self._value
