"""The knobs that decide a candidate's transformed graph."""

from __future__ import annotations

from gpt_optuna.graph.fusion import FUSION_KNOB
from gpt_optuna.graph.precision import is_precision_knob

SPEED_VALUES: dict[str, tuple[str, ...]] = {FUSION_KNOB: ("transformer",), "precision": ("fp16",)}
"""Per transform knob, the values that make a graph fast (every engine's seed turns them on)."""


def is_transform_knob(name: str) -> bool:
    """Whether a knob decides the candidate's transformed graph (fusion, precision)."""
    return name == FUSION_KNOB or is_precision_knob(name)
