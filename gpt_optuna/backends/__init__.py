"""Engines the tuner can drive, looked up by name or by ``package.module:Class`` import path.

Everything a backend of one's own needs is importable from here: the :class:`Backend` base class and
what its methods take and return (the space's knobs and candidates, the model's description, the
files its builds share, the facts a build and a run learn).
"""

from __future__ import annotations

from gpt_optuna.backends.base import Backend, BuildError, Built, Deployment, KnobLimit, Runner
from gpt_optuna.backends.engine_choice import EngineChoice
from gpt_optuna.backends.inductor import backend as _inductor_deployment
from gpt_optuna.backends.inductor.deploy import CACHE_SUFFIX as _inductor_cache_suffix
from gpt_optuna.backends.onnxruntime import settings as _onnxruntime_settings
from gpt_optuna.backends.onnxruntime import triton as _onnxruntime_triton
from gpt_optuna.backends.registry import BACKENDS, load_engine
from gpt_optuna.backends.tensorrt import commands as _tensorrt_commands
from gpt_optuna.backends.tensorrt import triton as _tensorrt_triton
from gpt_optuna.core.engine_facts import BuildFacts, RunFacts
from gpt_optuna.core.engine_paths import EnginePaths
from gpt_optuna.core.engine_spec import is_composition
from gpt_optuna.core.space import Candidate, Condition, Knob, Space, Value
from gpt_optuna.graph.model import Feeds, ModelInfo, ShapeRange, TensorSpec

DEPLOYMENTS = {
    "onnxruntime": Deployment(
        _onnxruntime_settings.side_file, 'backend: "onnxruntime"', "model.onnx", _onnxruntime_triton.triton_fields
    ),
    "tensorrt": Deployment(
        _tensorrt_commands.side_file,
        'platform: "tensorrt_plan"',
        "model.plan",
        _tensorrt_triton.triton_fields,
        (".onnx",),
    ),
    "inductor": Deployment(
        _inductor_deployment.side_file,
        None,
        "model.pt2",
        _inductor_deployment.triton_fields,
        shipped=_inductor_deployment.needs_program,
        engine_beside=_inductor_cache_suffix,
        suffix=".pt2",
    ),
}
"""How each registered engine's exported trial runs outside the tuner (export's side file, Triton);
an engine without an entry exports its model or engine and the common record alone."""

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
    "load_backend",
]


def load_backend(spec: str) -> Backend:
    """Instantiate a backend from a registered name or a ``module:Class`` path; several engines
    (a comma list of those, or ``auto``) as one :class:`~.engine_choice.EngineChoice`."""
    return EngineChoice.of(spec) if is_composition(spec) else load_engine(spec)
