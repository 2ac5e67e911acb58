"""How hard the latency protocol works for one figure: the settings a search records and every worker follows."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MeasureSettings:
    """How hard to work for one latency figure."""

    target_rel_ci: float = 0.01
    budget_s: float = 2.0
    min_samples: int = 10
    max_samples: int = 5000
    block: int = 10
    warmup_min: int = 3
    warmup_tolerance: float = 0.05
    flush_l2: bool = False
    """GPU only: overwrite a buffer larger than the L2 cache before each launch (cold-cache latency)."""
