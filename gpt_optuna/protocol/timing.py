"""The latency protocol's figures and round sizes, which the tuner reads and its workers report
(its settings: :mod:`gpt_optuna.core.measure_settings`; the protocol itself: :mod:`gpt_optuna.worker.measure`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LatencyStats:
    """Robust statistics of per-launch latency, in milliseconds."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    iqr_ms: float
    cv: float
    rel_ci: float
    samples: int
    warmup: int
    stable: bool


ROUNDS, BLOCK = 10, 10
"""Interleaved rounds, and launches per candidate in each (where no latency is known yet)."""
BLOCK_S = 0.1
"""A re-measurement's block lasts about this long: a round costs as much time for a 100 ms model as
for a 1 ms one (:func:`block_for`)."""
MAX_BLOCK = 100
"""Launches per candidate in a round at most, however fast the model."""
ROUNDS_BUDGET_S = 60.0
"""The rounds of one process stop (after three at least) once this long has passed."""
MIN_ROUNDS = 3
"""Rounds a process times at least, whatever its deadline."""


def block_for(latencies_ms: list[float]) -> int:
    """Launches per candidate in a round: as many as fill :data:`BLOCK_S` with the slowest of
    ``latencies_ms`` (one at least, :data:`MAX_BLOCK` at most); :data:`BLOCK` where none is known."""
    slowest = max((ms for ms in latencies_ms if ms > 0), default=None)
    if slowest is None:
        return BLOCK
    return max(1, min(MAX_BLOCK, round(BLOCK_S * 1000 / slowest)))
