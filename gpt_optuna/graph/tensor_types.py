"""Element types of a graph's tensors, inferred from the operators' schemas."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

FLOAT, FLOAT16, DOUBLE, BFLOAT16 = 1, 10, 11, 16
"""``onnx.TensorProto`` element types, as plain ints so that this module imports onnx lazily."""
TYPE_AGNOSTIC = frozenset({"Shape", "Size"})
"""Ops that read only the shape of their input: any type will do, so no Cast is ever needed."""


_TYPE_NAMES = {"tensor(float)": FLOAT, "tensor(float16)": FLOAT16, "tensor(bfloat16)": BFLOAT16}


def onnx_module() -> Any:
    """ONNX, imported on first use: importing the graph modules does not load it."""
    import onnx

    return onnx


@dataclass(frozen=True)
class _Schema:
    """The typing of one operator version: each formal input/output's type string, whether the
    last one is variadic, and each type parameter's allowed types."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    variadic_in: bool
    variadic_out: bool
    allowed: dict[str, frozenset[str]] = field(hash=False)

    @classmethod
    def of(cls, op: Any, type_str: str, variadic: Any) -> _Schema:
        """The typing of ``op``, an ONNX or ONNX Runtime operator schema (whose formals hold their
        type string in attribute ``type_str``, and ``variadic`` as their option where they are)."""
        return cls(
            tuple(getattr(p, type_str) for p in op.inputs),
            tuple(getattr(p, type_str) for p in op.outputs),
            bool(op.inputs) and op.inputs[-1].option == variadic,
            bool(op.outputs) and op.outputs[-1].option == variadic,
            {c.type_param_str: frozenset(c.allowed_type_strs) for c in op.type_constraints},
        )

    def input_type(self, position: int) -> str:
        return _formal(self.inputs, position, self.variadic_in)

    def output_type(self, position: int) -> str:
        return _formal(self.outputs, position, self.variadic_out)

    def admits(self, type_str: str, elem_type: int) -> bool:
        """Whether a formal of this type string can hold ``elem_type``."""
        if type_str in _TYPE_NAMES:
            return _TYPE_NAMES[type_str] == elem_type
        wanted = {v: k for k, v in _TYPE_NAMES.items()}[elem_type]
        return wanted in self.allowed.get(type_str, frozenset())


def _formal(types: tuple[str, ...], position: int, variadic: bool) -> str:
    if position < len(types):
        return types[position]
    return types[-1] if variadic and types else ""


@functools.cache
def _ort_schemas() -> dict[tuple[str, str], list[tuple[int, _Schema]]]:
    """ONNX Runtime's operator schemas by (domain, op): its contrib operators (com.microsoft, ...)
    and those it registers in ONNX's domain (SimplifiedLayerNormalization)."""
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as ort_c
    except ImportError:
        return {}
    variadic = ort_c.schemadef.OpSchema.FormalParameterOption.Variadic
    table: dict[tuple[str, str], list[tuple[int, _Schema]]] = {}
    for op in ort_c.get_all_operator_schema():
        schema = _Schema.of(op, "typeStr", variadic)
        table.setdefault(("" if op.domain == "ai.onnx" else op.domain, op.name), []).append((op.since_version, schema))
    return table


@functools.cache
def schema(op_type: str, domain: str, version: int) -> _Schema | None:
    """The schema of ``op_type`` as of opset ``version`` of ``domain`` ("" for ONNX's), or None where unknown."""
    onnx = onnx_module()
    if domain == "":
        try:
            found = onnx.defs.get_schema(op_type, version, "")
        except onnx.defs.SchemaError:  # perhaps one of ONNX Runtime's own
            found = None
        if found is not None:
            return _Schema.of(found, "type_str", onnx.defs.OpSchema.FormalParameterOption.Variadic)
    versions = [(v, s) for v, s in _ort_schemas().get((domain, op_type), []) if v <= version]
    return max(versions, key=lambda item: item[0])[1] if versions else None


def tensor_types(model: Any) -> dict[str, int]:
    """The element type of every tensor of the main graph that ONNX's inference or the operator
    schemas can tell (contrib operators' outputs included)."""
    onnx = onnx_module()
    graph = model.graph
    try:
        inferred = onnx.shape_inference.infer_shapes(_skeleton(model)).graph
    except Exception:  # inference is a help here, not a requirement
        inferred = graph
    types: dict[str, int] = {}
    for value in [*inferred.value_info, *graph.value_info, *graph.input, *graph.output]:
        if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type:
            types.setdefault(value.name, value.type.tensor_type.elem_type)
    types.update({init.name: init.data_type for init in graph.initializer})
    opsets = model_opsets(model)
    for node in graph.node:
        for position, name in enumerate(node.output):
            if name and name not in types:
                found = _output_type(node, position, types, opsets)
                if found:
                    types[name] = found
    return types


SKELETON_ELEMENTS = 4096
"""Initializers larger than this lose their data in :func:`_skeleton` (shape tensors are smaller)."""


def _skeleton(model: Any) -> Any:
    """The model with its large initializers' data left out (their names, types and dims kept):
    all that type inference reads, without serializing the weights. Small ones (shapes, axes) keep
    their values, which inference may read."""
    onnx = onnx_module()
    graph = onnx.GraphProto(name=model.graph.name)
    for part in ("node", "input", "output", "value_info", "sparse_initializer"):
        getattr(graph, part).extend(getattr(model.graph, part))
    for init in model.graph.initializer:
        if int(np.prod(init.dims)) <= SKELETON_ELEMENTS:
            graph.initializer.append(init)
        else:
            graph.initializer.add(name=init.name, data_type=init.data_type, dims=init.dims)
    light = onnx.ModelProto(ir_version=model.ir_version, graph=graph)
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    return light


def model_opsets(model: Any) -> dict[str, int]:
    return {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}


def node_schema(node: Any, opsets: dict[str, int]) -> _Schema | None:
    domain = "" if node.domain == "ai.onnx" else node.domain
    return schema(node.op_type, domain, opsets.get(domain, 0))


def attribute(node: Any, name: str) -> Any | None:
    return next((a for a in node.attribute if a.name == name), None)


def _output_type(node: Any, position: int, types: dict[str, int], opsets: dict[str, int]) -> int:
    """An output's element type from its node: Cast's ``to``, a constant's value, or the type
    its schema binds from the inputs; 0 where none of these tells."""
    if node.op_type == "Cast":
        return int(attribute(node, "to").i)
    if node.op_type in ("Constant", "ConstantOfShape"):
        value = attribute(node, "value")
        if value is not None:
            return int(value.t.data_type)
        return FLOAT if node.op_type == "ConstantOfShape" or attribute(node, "value_float") else 0
    found = node_schema(node, opsets)
    if found is None:
        return 0
    wanted = found.output_type(position)
    if wanted in _TYPE_NAMES:
        return _TYPE_NAMES[wanted]
    for index, name in enumerate(node.input):
        if name and found.input_type(index) == wanted and name in types:
            return types[name]
    return 0


def has_subgraph(node: Any) -> bool:
    onnx = onnx_module()
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)
