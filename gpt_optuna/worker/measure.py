"""Latency measurement: CuPy CUDA events on a runner's stream, a monotonic clock on the host.

Protocol: warm up until the per-launch time stops drifting, then time single launches in blocks
until the median's distribution-free 95 % confidence half-width is under the target fraction of
the median, or the time budget is spent. A measurement that never got there is flagged.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import numpy as np

from gpt_optuna.backends.base import Runner
from gpt_optuna.core.measure_settings import MeasureSettings
from gpt_optuna.protocol.timing import MIN_ROUNDS, LatencyStats


def median_rel_ci(samples: np.ndarray) -> float:
    """Half-width of the distribution-free 95 % confidence interval of the median, over the median."""
    n = len(samples)
    if n < 3:
        return math.inf
    ordered = np.sort(samples)
    half = 1.96 * math.sqrt(n) / 2
    lo = max(int(math.floor(n / 2 - half)), 0)
    hi = min(int(math.ceil(n / 2 + half)), n - 1)
    median = float(np.median(ordered))
    if median <= 0:
        return math.inf
    return float(ordered[hi] - ordered[lo]) / 2 / median


def summarize(samples: np.ndarray, warmup: int, target_rel_ci: float) -> LatencyStats:
    p10, p25, p50, p75, p90 = np.percentile(samples, [10, 25, 50, 75, 90])
    mean = float(np.mean(samples))
    rel_ci = median_rel_ci(samples)
    return LatencyStats(
        median_ms=float(p50),
        p10_ms=float(p10),
        p90_ms=float(p90),
        iqr_ms=float(p75 - p25),
        cv=float(np.std(samples) / mean) if mean > 0 else 0.0,
        rel_ci=rel_ci,
        samples=len(samples),
        warmup=warmup,
        stable=rel_ci <= target_rel_ci,
    )


def launch_timer(runner: Runner, flush_l2: bool = False) -> Callable[[], float]:
    """A function that launches once and returns that launch's latency in milliseconds.

    On a GPU runner, CUDA events bracket the launch on the runner's stream; with ``flush_l2`` a
    buffer twice the L2 size is written on that stream first, outside the events.
    """
    if runner.stream is None:

        def host() -> float:
            start = time.perf_counter_ns()
            runner.launch()
            return (time.perf_counter_ns() - start) / 1e6

        return host

    import cupy

    start_event, end_event = cupy.cuda.Event(), cupy.cuda.Event()
    scratch = None
    if flush_l2:
        with runner.stream:
            scratch = cupy.empty(2 * int(cupy.cuda.Device().attributes["L2CacheSize"]), cupy.uint8)

    def device() -> float:
        if scratch is not None:
            with runner.stream:
                scratch.fill(1)
        start_event.record(runner.stream)
        runner.launch()
        end_event.record(runner.stream)
        end_event.synchronize()
        return float(cupy.cuda.get_elapsed_time(start_event, end_event))

    return device


def measure(runner: Runner, settings: MeasureSettings) -> LatencyStats:
    """Warm up, then time launches until the median is known well enough or the budget is spent."""
    return measure_with(launch_timer(runner, settings.flush_l2), settings)


def measure_with(timed_launch: Callable[[], float], settings: MeasureSettings) -> LatencyStats:
    deadline = time.monotonic() + settings.budget_s
    warmup_deadline = time.monotonic() + settings.budget_s / 4
    warmup = 0
    previous: float | None = None
    while True:
        block = [timed_launch() for _ in range(settings.warmup_min)]
        warmup += len(block)
        current = float(np.median(block))
        settled = previous is not None and abs(current - previous) <= settings.warmup_tolerance * previous
        if settled or time.monotonic() >= warmup_deadline:
            break
        previous = current
    samples: list[float] = []
    while len(samples) < settings.max_samples:
        samples.extend(timed_launch() for _ in range(settings.block))
        if len(samples) >= settings.min_samples and (
            median_rel_ci(np.asarray(samples)) <= settings.target_rel_ci or time.monotonic() >= deadline
        ):
            break
    return summarize(np.asarray(samples), warmup, settings.target_rel_ci)


SETTLE_POLL_S = 0.005
SETTLE_MAX_S = 1.0


def settle_cpu() -> None:
    """Wait until this process's threads are idle: a CPU engine's thread pool spins for tens of
    milliseconds after its last run (ONNX Runtime's, with spinning on), and those threads would
    take the cores from the next candidate timed in this process, as they never would in a
    deployment running one engine. Returns once a poll finds the process using almost no CPU
    (or after :data:`SETTLE_MAX_S`)."""
    end = time.monotonic() + SETTLE_MAX_S
    while time.monotonic() < end:
        used = time.process_time()
        time.sleep(SETTLE_POLL_S)
        if time.process_time() - used < SETTLE_POLL_S / 10:
            return


def interleaved_rounds(
    timers: Sequence[Callable[[], float]],
    rounds: int,
    block: int,
    deadline: float | None = None,
    on_round: Callable[[np.ndarray], None] = lambda _: None,
    settle: Callable[[], None] | None = None,
) -> np.ndarray:
    """Per round and candidate, the median of ``block`` launches, the candidates taken in turn.

    Each round visits every candidate once (A B C, then B C A, ...: the order rotates so that no
    candidate always follows the same one), so drift over time hits all of them alike. Stops
    early, after :data:`MIN_ROUNDS` at least, when ``deadline`` (monotonic seconds) has passed.
    ``on_round`` is given each round's medians as soon as it is timed; ``settle`` (e.g.
    :func:`settle_cpu`) runs before each candidate's block, untimed.
    """
    count = len(timers)
    medians = []
    for r in range(rounds):
        row = np.empty(count)
        for i in ((r + k) % count for k in range(count)):
            if settle is not None:
                settle()
            row[i] = np.median([timers[i]() for _ in range(block)])
        medians.append(row)
        on_round(row)
        if deadline is not None and len(medians) >= MIN_ROUNDS and time.monotonic() >= deadline:
            break
    return np.asarray(medians)
