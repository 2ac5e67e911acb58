"""The files an engine's builds share across a study's trials: what a worker hands an engine
instead of the study folder, laid out once here (the study folder's own layout takes them)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class EnginePaths:
    """Where an engine finds and keeps what its builds share."""

    models: Path
    """Transformed models, each made once (``graph.model_cache``); the TensorRT backend keeps its
    constant-folded copies there too."""
    timing_cache: Path
    """TensorRT's timing cache, shared by the study's builds."""
    caches: Path
    """The folder for the engine's own caches and scratch files (ONNX Runtime's TensorRT provider
    keeps its timing cache there, Inductor its compiles)."""

    @classmethod
    def under(cls, folder: Path) -> EnginePaths:
        """The paths in a study folder (or any folder: a self-test's, a test's)."""
        return cls(folder / "models", folder / "timing.cache", folder)
