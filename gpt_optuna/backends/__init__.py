"""Engines the tuner can drive, looked up by name or by ``package.module:Class`` import path.

The tuner reads an engine through its description (:func:`describe`); a worker runs it
(:func:`load_backend`). Everything a backend of one's own needs is importable from here: the
:class:`Backend` base class and what its methods take and return (the space's knobs and
candidates, the model's description, the files its builds share, the facts a build and a run learn).
"""

from __future__ import annotations

from gpt_optuna.backends.base import Backend, BuildError, Built, Deployment, EngineDescription, KnobLimit, Runner
from gpt_optuna.backends.engine_choice import EngineChoice, EnginesDescription, labelled_engines
from gpt_optuna.backends.registry import BACKENDS, DEPLOYMENTS, ENGINES, describe_engine, load_engine
from gpt_optuna.core.engine_facts import BuildFacts, RunFacts
from gpt_optuna.core.engine_paths import EnginePaths
from gpt_optuna.core.engine_spec import is_composition
from gpt_optuna.core.space import Candidate, Condition, Knob, Space, Value
from gpt_optuna.graph.model import Feeds, ModelInfo, ShapeRange, TensorSpec

__all__ = [
    "BACKENDS",
    "Backend",
    "BuildError",
    "BuildFacts",
    "Built",
    "Candidate",
    "DEPLOYMENTS",
    "Deployment",
    "Condition",
    "ENGINES",
    "EngineDescription",
    "EnginePaths",
    "Feeds",
    "Knob",
    "KnobLimit",
    "ModelInfo",
    "RunFacts",
    "Runner",
    "ShapeRange",
    "Space",
    "TensorSpec",
    "Value",
    "describe",
    "load_backend",
]


def describe(spec: str) -> EngineDescription:
    """What the tuner reads of the engine ``spec`` names (a registered name, a ``module:Class``
    path, or several engines as a comma list or ``auto``), without running it."""
    if is_composition(spec):
        return EnginesDescription(labelled_engines(spec, describe_engine))
    return describe_engine(spec)


def load_backend(spec: str) -> Backend:
    """Instantiate the backend a worker runs from a registered name or a ``module:Class`` path;
    several engines (a comma list of those, or ``auto``) as one :class:`~.engine_choice.EngineChoice`."""
    return EngineChoice.of(spec) if is_composition(spec) else load_engine(spec)
