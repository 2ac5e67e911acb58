"""The engines registered by name, and one engine loaded by its name or ``module:Class`` path."""

from __future__ import annotations

import importlib

from gpt_optuna.backends.base import Backend
from gpt_optuna.core.errors import UserError

BACKENDS = {
    "onnxruntime": "gpt_optuna.backends.onnxruntime:OnnxRuntimeBackend",
    "tensorrt": "gpt_optuna.backends.tensorrt:TensorRTBackend",
    "tensorrt-rtx": "gpt_optuna.backends.tensorrt:TensorRTRTXBackend",
    "inductor": "gpt_optuna.backends.inductor:InductorBackend",
}


def load_engine(spec: str) -> Backend:
    """Instantiate one engine from a registered name or a ``module:Class`` path."""
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
