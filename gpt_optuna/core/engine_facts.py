"""What building and running a candidate's engine learnt of it, typed as it crosses from the worker
to the tuner; the trial record (:func:`gpt_optuna.study.trial_record.facts_attrs`) names them in the
study. None: not known for this engine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BuildFacts:
    """What a build learnt: the engine's plan and the graph it was built from."""

    engine_bytes: int | None = None
    engine_sha256: str | None = None
    engine_io: dict[str, Any] | None = None
    """The dtypes the engine itself was built to take and return."""
    build_route: str | None = None
    """TensorRT's build route, as read back from the builder."""
    build_log: str | None = None
    """The end of the builder's log, where it said something worth keeping."""
    rebuild_s: float | None = None
    """A build again from the caches this one left (Inductor, where this one took long)."""
    transformed_model: str | None = None
    """The file name of the candidate's transformed model in the study folder's model cache."""
    io_changes: dict[str, dict[str, list[str]]] | None = None
    """The dtypes the candidate's model changed at its inputs and outputs."""


@dataclass(frozen=True)
class RunFacts:
    """What opening and running the engine learnt."""

    device_memory_bytes: int | None = None
    rebuild_s: float | None = None
    """Loading the kept plan (TensorRT): what a confirmation process pays instead of a build."""
    cuda_graph: str | None = None
    """Why the engine ran without the CUDA graph it was asked for."""
