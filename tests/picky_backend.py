"""ONNX Runtime on the CPU, made picky, to test how checking a space reacts to what an engine refuses.

Its ``check_model`` crashes the process (SIGSEGV) on fp16 graphs, refuses graphs with Q/DQ nodes
(as an engine without int8 kernels would), and reports that ``mem_pattern`` works only at
``ORT_ENABLE_ALL``; everything else is ONNX Runtime's own. Used as
``--backend picky_backend:PickyBackend`` (the tests folder is on the path).
"""

from __future__ import annotations

import ctypes

import onnx

from gpt_optuna.backends import BuildError, KnobLimit
from gpt_optuna.backends.onnxruntime.backend import OnnxRuntimeBackend
from gpt_optuna.core.engine_paths import EnginePaths
from gpt_optuna.core.space import Candidate, Condition, Space
from gpt_optuna.graph.model import ModelInfo, ShapeRange


class PickyBackend(OnnxRuntimeBackend):
    def check_model(
        self, model: ModelInfo, space: Space, candidate: Candidate, paths: EnginePaths, shapes: dict[str, ShapeRange]
    ) -> list[KnobLimit]:
        graph = onnx.load(str(model.path)).graph
        ops = {node.op_type for node in graph.node}
        if any(init.data_type == onnx.TensorProto.FLOAT16 for init in graph.initializer):
            ctypes.string_at(0)
        if "QuantizeLinear" in ops:
            raise BuildError("no int8 kernels here")
        super().check_model(model, space, candidate, paths, shapes)
        return [KnobLimit("mem_pattern", Condition("graph_optimization_level", ("ORT_ENABLE_ALL",)), "picky")]
