"""How Triton runs an exported TensorRT engine (``platform: "tensorrt_plan"``): CUDA graphs where the
trial captured them; auxiliary streams have no field."""

from __future__ import annotations

from gpt_optuna.backends.base import TritonFields
from gpt_optuna.backends.side_file import SideFile
from gpt_optuna.backends.tensorrt.commands import captures


def triton_fields(record: SideFile) -> TritonFields:
    """The trial's runtime knobs as Triton configuration fields, and those it has no field for."""
    params = record.params or {}
    lines = ["optimization { cuda { graphs: true } }"] if captures(params) else []
    return TritonFields(True, lines, [k for k in params if k == "runtime.aux_streams" and params[k]])
