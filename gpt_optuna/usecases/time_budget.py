"""How ``--timeout`` is shared between preparation, the search and the finalists' re-measurement.

``--timeout`` bounds the whole command. The finalists' re-measurement
(:mod:`gpt_optuna.remeasure.finalists`) needs time at the end; its cost is estimated from what the
search measured (each finalist's and the baseline's build time, their latencies, a worker start
per process). From the baseline's measurement on, the search keeps at least the smallest
re-measurement that says anything (:func:`smallest_confirmation`: one finalist and the baseline in
:data:`MIN_PROCESSES` processes, :data:`MIN_ROUNDS` rounds each) and, up to :data:`CONFIRM_SHARE`
of ``--timeout``, the whole one. Where ``--timeout`` cannot hold even the smallest one, the run
says so as soon as that is known (as the baseline, or the first finalist, is measured), with the
smallest ``--timeout`` that would, and searches to the deadline (:class:`EndingReserve`).

The search starts a trial only while that trial (as long as the longest of the last ones, one-off
work left out) and the kept time still fit before the deadline, and a trial still running when
the search's time is up is stopped and queued again. When the time left at the end is short, the
re-measurement is scaled down (:func:`plan_confirmation`: fewer finalists, then fewer rounds, then
fewer processes down to :data:`MIN_PROCESSES`), never a process that cannot finish.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import optuna
from optuna.trial import FrozenTrial

from gpt_optuna.core.measure_settings import MeasureSettings
from gpt_optuna.core.words import counted
from gpt_optuna.protocol.timing import MIN_ROUNDS, ROUNDS
from gpt_optuna.remeasure.finalists import WORKER_START_S, finalists, process_seconds, with_references

CONFIRM_SHARE = 0.25
"""At most this share of ``--timeout`` is kept for the finalists' whole re-measurement (never less
than its smallest one)."""
MIN_PROCESSES = 2
"""The fewest processes a re-measurement is scaled down to (a process is a sample: one says
nothing of the spread between them)."""
FILL_ROUNDS = 100
"""The most rounds a process of the search's re-measurement times while its share of the time left
lasts: the time the plan's estimate did not need goes to rounds, not left unused."""
FINISH_S = 2.0
"""Kept at the very end: the summary, the report of what comes next."""
STOP_S = 3.0
"""Kept between the search's end and the re-measurement's plan: a trial still running as the
search's time is up is stopped there (its worker killed, its candidate queued again) and the study
is read again. Without it a reserve that holds the smallest re-measurement to the second no longer
holds it once the search has stopped."""


@dataclass(frozen=True)
class ConfirmPlan:
    """How many finalists are re-measured in how many processes of how many rounds, and the time that takes."""

    top: int
    processes: int
    process_s: float
    """The estimated seconds of one process: its start, the builds, the warm-ups and the rounds."""
    rounds: int = ROUNDS
    """The rounds ``process_s`` counts (a process given a deadline times more while its share of
    the time lasts: :data:`FILL_ROUNDS`)."""

    @property
    def total_s(self) -> float:
        return self.processes * self.process_s


Candidates = tuple[list[FrozenTrial], list[FrozenTrial]] | None
"""What :func:`_candidates` finds: the baseline (and the user's configuration, each other engine's
defaults), and the finalists."""


def _candidates(study: optuna.Study, top: int) -> Candidates:
    """The baseline (with the user's own configuration and each other engine's defaults after it,
    where measured) and the ``top`` best finalists; None before the baseline is measured."""
    baseline, best = finalists(study, top)
    if baseline is None:
        return None
    return with_references([baseline], study.get_trials(deepcopy=False)), best


def plan_confirmation(
    study: optuna.Study,
    top: int,
    processes: int,
    settings: MeasureSettings,
    left_s: float | None,
    start_s: float = WORKER_START_S,
) -> ConfirmPlan | None:
    """The largest re-measurement whose estimated time fits ``left_s`` (the whole one without a
    bound): all ``processes`` where they fit, else fewer down to :data:`MIN_PROCESSES`; within
    them the most rounds (:data:`ROUNDS` down to :data:`MIN_ROUNDS`) and, before a round is given
    up, the most finalists. None where there is nothing to confirm or not even the smallest fits."""
    return _largest(_candidates(study, top), processes, settings, left_s, start_s)


def _largest(
    found: Candidates, processes: int, settings: MeasureSettings, left_s: float | None, start_s: float
) -> ConfirmPlan | None:
    if found is None or not found[1]:
        return None
    base, best = found
    for count in range(processes, min(MIN_PROCESSES, processes) - 1, -1):
        for rounds in range(ROUNDS, MIN_ROUNDS - 1, -1):
            for k in range(len(best), 0, -1):
                seconds = process_seconds([*base[:1], *best[:k], *base[1:]], settings, start_s, rounds)
                if left_s is None or count * seconds <= left_s:
                    return ConfirmPlan(k, count, seconds, rounds)
    return None


def smallest_confirmation(
    study: optuna.Study, processes: int, settings: MeasureSettings, start_s: float = WORKER_START_S
) -> ConfirmPlan | None:
    """The smallest re-measurement worth making: the best finalist (before there is one, a stand-in
    as costly as the baseline) and the baseline in :data:`MIN_PROCESSES` processes (``processes``
    where fewer are asked for) of :data:`MIN_ROUNDS` rounds; None before the baseline is measured."""
    return _smallest(_candidates(study, 1), processes, settings, start_s)


def _smallest(found: Candidates, processes: int, settings: MeasureSettings, start_s: float) -> ConfirmPlan | None:
    if found is None:
        return None
    base, best = found
    trials = [*base[:1], *(best[:1] or base[:1]), *base[1:]]
    seconds = process_seconds(trials, settings, start_s, MIN_ROUNDS)
    return ConfirmPlan(1, min(MIN_PROCESSES, processes), seconds, MIN_ROUNDS)


def reserve_s(smallest: ConfirmPlan, whole: ConfirmPlan | None, timeout_s: float) -> float:
    """The seconds the search keeps for the end: the ``whole`` re-measurement's estimate, at most
    :data:`CONFIRM_SHARE` of ``timeout_s``, but the ``smallest`` one's at least; the search's stop
    and the finish."""
    wanted = whole.total_s if whole is not None else smallest.total_s
    return max(smallest.total_s, min(wanted, CONFIRM_SHARE * timeout_s)) + STOP_S + FINISH_S


def smallest_timeout_s(used_s: float, trial_s: float, smallest: ConfirmPlan) -> int:
    """The smallest ``--timeout`` (whole seconds) that holds what ran so far (``used_s``), a trial
    of ``trial_s`` (0 where there is a finalist already) and the ``smallest`` re-measurement."""
    return math.ceil(used_s + trial_s + smallest.total_s + STOP_S + FINISH_S)


@dataclass(eq=False)
class EndingReserve:
    """The seconds the search keeps under ``--timeout`` (which ends at ``deadline``, monotonic
    seconds) for the finalists' re-measurement and the finish (:func:`reserve_s`), by the study's
    measurements as they come. From the baseline's measurement on, whether the time left holds the
    smallest re-measurement (after one more trial, of ``trial_s`` seconds, where there is no
    finalist yet) is judged each time; once it does not, ``say`` is told (with the smallest
    ``--timeout`` that would) and only the finish is kept: the search runs to the deadline."""

    study: optuna.Study
    top: int
    processes: int
    settings: MeasureSettings
    timeout_s: float
    deadline: float
    trial_s: Callable[[], float]
    say: Callable[[str], None]
    start_s: float = WORKER_START_S
    holds: bool | None = field(default=None, init=False)
    """Whether ``--timeout`` holds the smallest re-measurement (None: not judged yet)."""

    def __call__(self) -> float:
        if self.top <= 0 or self.holds is False:
            return FINISH_S
        found = _candidates(self.study, self.top)  # one read of the study for both plans
        smallest = _smallest(found, self.processes, self.settings, self.start_s)
        if smallest is None:
            return FINISH_S
        whole = _largest(found, self.processes, self.settings, None, self.start_s)
        self.holds = self._holds(smallest, 0.0 if whole is not None else self.trial_s())
        return reserve_s(smallest, whole, self.timeout_s) if self.holds else FINISH_S

    def _holds(self, smallest: ConfirmPlan, trial_s: float) -> bool:
        """Whether the time left holds ``smallest`` after a trial of ``trial_s``; where not, said."""
        left = self.deadline - time.monotonic()
        if left >= trial_s + smallest.total_s + STOP_S + FINISH_S:
            return True
        enough = smallest_timeout_s(self.timeout_s - left, trial_s, smallest)
        after = f" after one more trial of about {trial_s:.0f} s" if trial_s else ""
        processes = counted(smallest.processes, "process", "processes")
        self.say(
            f"warning: --timeout {self.timeout_s:g}s cannot hold the finalists' re-measurement: its smallest (the"
            f" best candidate and the baseline in {processes}, {smallest.rounds} rounds) takes about"
            f" {smallest.total_s:.0f} s{after}, and {left:.0f} s are left; the search runs to the deadline"
            f" without it (--timeout {enough}s or more would hold it)"
        )
        return False


KEPT_REFRESH_S = 15.0
"""How often, at most, the time kept for the finalists is estimated again during a search."""


def refresh_s(timeout_s: float | None) -> float:
    """How long an estimate of the time kept may stand: :data:`KEPT_REFRESH_S`, or 1 % of a shorter
    ``--timeout`` (a short search has few trials to read, and little time to misjudge)."""
    return KEPT_REFRESH_S if timeout_s is None else min(KEPT_REFRESH_S, timeout_s / 100)


@dataclass(eq=False)
class Refreshed:
    """A figure worked out again at most every ``every_s`` seconds (the time kept for the
    finalists reads every trial: once per trial would cost a long search more than its trials)."""

    work_out: Callable[[], float]
    every_s: float = KEPT_REFRESH_S
    _value: float = field(default=0.0, init=False)
    _at: float | None = field(default=None, init=False)

    def __call__(self) -> float:
        now = time.monotonic()
        if self._at is None or now - self._at >= self.every_s:
            self._value, self._at = self.work_out(), now
        return self._value
