"""The engines registered by name, once each (:data:`ENGINES`): the description the tuner reads,
the engine a worker loads and its deployment; one engine described or loaded by its name or
``module:Class`` path."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from gpt_optuna.backends.base import Backend, Deployment, EngineDescription
from gpt_optuna.backends.inductor import deployment as _inductor
from gpt_optuna.backends.inductor.deploy import CACHE_SUFFIX as _INDUCTOR_CACHE_SUFFIX
from gpt_optuna.backends.inductor.description import InductorDescription
from gpt_optuna.backends.onnxruntime import settings as _onnxruntime_settings
from gpt_optuna.backends.onnxruntime import triton as _onnxruntime_triton
from gpt_optuna.backends.onnxruntime.description import OnnxRuntimeDescription
from gpt_optuna.backends.tensorrt import commands as _tensorrt_commands
from gpt_optuna.backends.tensorrt import triton as _tensorrt_triton
from gpt_optuna.backends.tensorrt.description import TensorRTDescription, TensorRTRTXDescription
from gpt_optuna.core.errors import UserError


@dataclass(frozen=True)
class Registered:
    """An engine as registered: what the tuner reads of it, the class a worker loads
    (``module:Class``), and how its exported trial runs outside the tuner (None: its export is its
    model or engine and the common record alone)."""

    description: EngineDescription
    engine: str
    deployment: Deployment | None = None


ENGINES = {
    "onnxruntime": Registered(
        OnnxRuntimeDescription(),
        "gpt_optuna.backends.onnxruntime.backend:OnnxRuntimeBackend",
        Deployment(
            _onnxruntime_settings.side_file, 'backend: "onnxruntime"', "model.onnx", _onnxruntime_triton.triton_fields
        ),
    ),
    "tensorrt": Registered(
        TensorRTDescription(),
        "gpt_optuna.backends.tensorrt.backend:TensorRTBackend",
        Deployment(
            _tensorrt_commands.side_file,
            'platform: "tensorrt_plan"',
            "model.plan",
            _tensorrt_triton.triton_fields,
            (".onnx",),
        ),
    ),
    "tensorrt-rtx": Registered(TensorRTRTXDescription(), "gpt_optuna.backends.tensorrt.backend:TensorRTRTXBackend"),
    "inductor": Registered(
        InductorDescription(),
        "gpt_optuna.backends.inductor.backend:InductorBackend",
        Deployment(
            _inductor.side_file,
            shipped=_inductor.needs_program,
            engine_beside=_INDUCTOR_CACHE_SUFFIX,
            suffix=".pt2",
        ),
    ),
}
BACKENDS = {name: registered.engine for name, registered in ENGINES.items()}
"""Each registered engine's class by its name."""
DEPLOYMENTS = {name: r.deployment for name, r in ENGINES.items() if r.deployment is not None}
"""How each registered engine with a deployment runs its exported trial outside the tuner (export's
side file, Triton)."""


def describe_engine(spec: str) -> EngineDescription:
    """One engine's description: a registered name's, else the backend a ``module:Class`` path names
    (a backend of one's own describes itself)."""
    registered = ENGINES.get(spec)
    return registered.description if registered is not None else load_engine(spec)


def load_engine(spec: str) -> Backend:
    """Instantiate one engine, as a worker runs it, from a registered name or a ``module:Class`` path."""
    target = BACKENDS.get(spec, spec)
    if ":" not in target:
        raise UserError(f"unknown backend {spec!r}; choose one of: {', '.join(BACKENDS)} (or module:Class)")
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UserError(f"cannot import backend module {module_name!r}: {exc}") from exc
    cls = getattr(module, class_name, None)
    if cls is None or not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise UserError(f"{target!r} is not a gpt_optuna Backend class")
    return cls()
