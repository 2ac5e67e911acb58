"""What interleaved rounds in fresh processes say about a speedup, and the verdict they support.

A confirmation times the baseline and each finalist in rounds (paired: every round visits each
one) in several fresh processes. A process is the unit of evidence: a launch-bound engine runs as
fast as the CPU time its process gets, and on a shared host that differs between processes far
more than rounds differ within one. So each process gives one estimate, the ratio of the
baseline's median to the candidate's over its rounds, and the speedup is their geometric mean
with a Student-t interval over processes (``processes - 1`` degrees of freedom), never narrower
than what the rounds within the processes allow. The intervals are simultaneous over the
finalists (Bonferroni): picking the best of several noisy estimates would otherwise call a
speedup of 1.0 "faster" more often than the stated level allows.

From that, one word (:func:`judge`): ``faster`` where the interval lies above 1.0 from two
processes or more; ``indicative`` from one process; ``inconclusive`` where the interval includes
1.0 yet reaches a gain worth having (:data:`WORTHWHILE`): the spread between processes, or the
noise between rounds within them (:func:`widened_by` says which), was too large to decide;
``not_significant`` where it includes 1.0 and excludes such a gain; ``baseline`` where it lies
below 1.0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

LEVEL = 0.95
"""The confidence of every interval, jointly over the finalists compared."""
WORTHWHILE = 1.10
"""A gain the verdict must be able to rule out before it says "no significant improvement"."""
MIN_PROCESSES = 2
"""Processes a "confirmed" verdict needs; one process is only indicative."""
MORE_ROUNDS = 4
"""How many times the rounds a confirmation widened by its rounds' noise is advised to take again:
the noise of a process's speedup shrinks as the square root of its rounds, so four times halve it."""
_RESAMPLES = 2000


@dataclass(frozen=True)
class Speedup:
    """A candidate's speedup over the baseline (``baseline_ms / latency_ms``), its interval, and
    the latencies it is the ratio of: each the geometric mean of the per-process medians."""

    estimate: float
    low: float
    high: float
    latency_ms: float
    baseline_ms: float
    process_ms: tuple[float, ...]
    processes: int
    process_ratios: tuple[float, ...] = ()
    """The speedup each process measured."""
    between_sd: float = 0.0
    """How much the processes' log speedups differ: their standard deviation (0 from one process)."""
    within_sd: float = 0.0
    """How much one process's log speedup varies from round to round: the root mean square of the
    processes' standard errors, by resampling their rounds. The interval's width comes from the
    larger of the two (:func:`widened_by`)."""


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile (p > 0.5) of Student's t with ``df`` degrees of freedom (exact for
    integer df, by bisection over its closed-form distribution function)."""
    if df < 1:
        raise ValueError("df must be at least 1")
    target = 2 * p - 1  # P(|T| < t)
    low, high = 0.0, 1.0
    while _t_central(high, df) < target:
        high *= 2
    for _ in range(200):
        middle = (low + high) / 2
        if _t_central(middle, df) < target:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def _t_central(t: float, df: int) -> float:
    """P(|T| < t) for Student's t with integer ``df`` (Abramowitz and Stegun 26.7.3-4)."""
    theta = math.atan(t / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2:
        term, total = math.cos(theta), 0.0
        if df > 1:
            total = term
            for k in range(3, df - 1, 2):
                term *= c2 * (k - 1) / k
                total += term
        return 2 / math.pi * (theta + math.sin(theta) * total)
    term = total = 1.0
    for k in range(2, df - 1, 2):
        term *= c2 * (k - 1) / k
        total += term
    return math.sin(theta) * total


def speedups(medians: np.ndarray, processes: np.ndarray) -> list[Speedup]:
    """Each candidate's :class:`Speedup` over the baseline (column 0 of ``medians``: per round, the
    median of its launches; rows labelled by ``processes``), with intervals simultaneous over the
    candidates. The baseline's own row (estimate 1.0) comes first."""
    medians = np.asarray(medians, np.float64)
    labels = np.unique(processes)
    rows = [medians[np.asarray(processes) == p] for p in labels]
    candidates = medians.shape[1] - 1
    tail = (1 - LEVEL) / 2 / max(candidates, 1)
    rng = np.random.default_rng(0)  # the same resamples for the same rounds: a record reads alike everywhere
    draws = [rng.integers(0, len(r), (_RESAMPLES, len(r))) for r in rows]
    process_base = np.array([np.median(r[:, 0]) for r in rows])
    found = []
    for column in range(medians.shape[1]):
        process_ms = np.array([np.median(r[:, column]) for r in rows])
        logs = np.log(process_base) - np.log(process_ms)
        within = np.array([_within_se(r[:, 0], r[:, column], d) for r, d in zip(rows, draws, strict=True)])
        centre = float(np.mean(logs))
        between = float(np.var(logs, ddof=1)) if len(labels) >= MIN_PROCESSES else 0.0
        rounds = float(np.mean(within**2))
        if len(labels) >= MIN_PROCESSES:
            se = math.sqrt(max(between, rounds) / len(labels))
            half = t_quantile(1 - tail, len(labels) - 1) * se
        else:
            half = NormalDist().inv_cdf(1 - tail) * float(within[0])
        latency_ms = float(np.exp(np.mean(np.log(process_ms))))
        baseline_ms = float(np.exp(np.mean(np.log(process_base))))
        found.append(
            Speedup(
                estimate=baseline_ms / latency_ms,  # exp(centre), as the ratio of the two figures shown beside it
                low=math.exp(centre - half),
                high=math.exp(centre + half),
                latency_ms=latency_ms,
                baseline_ms=baseline_ms,
                process_ms=tuple(float(v) for v in process_ms),
                processes=len(labels),
                process_ratios=tuple(float(v) for v in np.exp(logs)),
                between_sd=math.sqrt(between),
                within_sd=math.sqrt(rounds),
            )
        )
    return found


def _within_se(baseline: np.ndarray, candidate: np.ndarray, draws: np.ndarray) -> float:
    """The standard error of one process's log ratio of medians, by resampling its rounds (paired)."""
    if len(baseline) < 2:
        return 0.0
    ratios = np.log(np.median(baseline[draws], axis=1)) - np.log(np.median(candidate[draws], axis=1))
    return float(np.std(ratios, ddof=1))


def widened_by(between_sd: float, within_sd: float) -> str:
    """Which term set an interval's width (see :func:`speedups`): ``processes`` where the processes'
    speedups differ more than the noise of their rounds explains (more processes, a quieter host
    narrow it), else ``rounds`` (more rounds in each process narrow it)."""
    return "processes" if between_sd > within_sd else "rounds"


def judge(low: float, high: float, processes: int) -> str:
    """The verdict an interval of a speedup supports (see the module's docstring)."""
    if processes < MIN_PROCESSES:
        return "indicative"
    if high < 1.0:
        return "baseline"
    if low > 1.0:
        return "faster"
    return "inconclusive" if high > WORTHWHILE else "not_significant"


def significant(low: float, high: float, processes: int) -> bool:
    """Whether an interval of a speedup shows a real one: the one definition every reader uses."""
    return judge(low, high, processes) == "faster"
