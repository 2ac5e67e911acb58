"""Backend specs that name several engines (``onnxruntime,inductor``, ``auto``) and the engine a
trial of such a study ran: plain strings, read by every layer."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpt_optuna.core.errors import UserError

ENGINE_KNOB = "engine"
AUTO = "auto"


def is_composition(spec: str | None) -> bool:
    """Whether a backend spec names several engines (a comma list, or ``auto``)."""
    return spec is not None and ("," in spec or spec.strip() == AUTO)


def engine_specs(spec: str) -> list[str]:
    """The engines a comma list names, in order; a UserError for an empty name or a duplicate."""
    parts = [p.strip() for p in spec.split(",")]
    if not all(parts):
        raise UserError(f"--backend {spec!r}: an empty engine name; give names separated by commas")
    repeated = next((p for i, p in enumerate(parts) if p in parts[:i]), None)
    if repeated is not None:
        raise UserError(f"--backend {spec!r} names {repeated} twice; name each engine once")
    return parts


def trial_engine(backend: str | None, params: Mapping[str, Any]) -> str | None:
    """The engine a trial ran: its ``engine`` knob in a study of several engines (the first engine
    where it has none), else the study's backend (None where unknown)."""
    if backend is None or not is_composition(backend):
        return backend
    return str(params.get(ENGINE_KNOB, engine_specs(backend)[0]))
