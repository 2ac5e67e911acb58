"""What the tuner knows of ONNX Runtime without starting it: its fast settings, where its baseline
runs, whether it is installed, and how it reads a user's session settings."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import MappingProxyType

from gpt_optuna.backends.base import EngineDescription
from gpt_optuna.backends.onnxruntime import user_settings
from gpt_optuna.backends.onnxruntime.settings import CPU, CUDA_GRAPH, FUSE_CONV_BIAS, GRAPH_LEVEL, NHWC
from gpt_optuna.core.errors import MissingDependencyError
from gpt_optuna.core.space import Space, Value


class OnnxRuntimeDescription(EngineDescription):
    """ONNX Runtime with whichever of the CPU, CUDA and TensorRT providers work here."""

    name = "onnxruntime"
    speed_values = MappingProxyType(
        {
            GRAPH_LEVEL: ("ORT_ENABLE_ALL",),
            "cuda.use_tf32": (True,),
            NHWC: (True,),
            CUDA_GRAPH: (True,),
            FUSE_CONV_BIAS: (True,),
            "trt.fp16": (True,),
            "trt.cuda_graph": (True,),
        }
    )

    def runs_on_cpu(self, space: Space) -> bool:
        return space.default().get("provider") == CPU

    def missing_library(self) -> MissingDependencyError | None:
        return None if importlib.util.find_spec("onnxruntime") else MissingDependencyError("ONNX Runtime", "cpu")

    def baseline_values(self, path: Path) -> dict[str, Value]:
        return user_settings.knob_values(user_settings.read_settings(path), f"--baseline-config {path.name}")
