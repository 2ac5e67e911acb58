"""fp32 -> fp16 or bf16 conversion of an ONNX graph, typed correctly by construction.

Every node that touches fp32 values either computes in the reduced type or stays fp32: stays
when the caller keeps it (by op type or by name), when a block list or a subgraph says so, or
when its fp32 values only feed shape arithmetic (sizes and scales, which fp16 cannot hold
exactly). Which of a converted node's inputs and outputs change type comes from the operator's
schema (ONNX's, or ONNX Runtime's for its contrib operators): a type parameter that admits the
reduced type changes, a fixed ``tensor(float)`` (Resize's scales, say) stays. Wherever a
tensor's type and its reader's differ, one Cast is inserted and shared by every such reader;
weights read in both types are stored in both; constants in attributes (Constant,
ConstantOfShape) are converted with their node. So no reader ever sees a type its schema
forbids, which is what onnxconverter-common's converter gets wrong at the edges of kept nodes.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import numpy as np

from gpt_optuna.graph.model import every_node, fresh_name, subgraphs
from gpt_optuna.graph.tensor_types import (
    BFLOAT16,
    DOUBLE,
    FLOAT,
    FLOAT16,
    TYPE_AGNOSTIC,
    attribute,
    has_subgraph,
    model_opsets,
    node_schema,
    onnx_module,
    tensor_types,
)

BLOCKED = frozenset(
    {"NonMaxSuppression", "TopK", "RoiAlign", "Range", "CumSum", "EyeLike", "Multinomial", "Bernoulli"}
    | {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike"}
)
"""Ops that stay fp32: index-producing or precision-critical, or typed by a ``dtype`` attribute."""


def to_reduced_array(values: np.ndarray, target: int) -> Any:
    """fp32 values as a numpy array (fp16) or raw bf16 bits: fp16 saturates at ±65504 and keeps
    tiny non-zero values at its smallest subnormal rather than flushing them to zero (an
    epsilon of 1e-12 must not become 0)."""
    values = np.asarray(values, np.float32)
    if target == FLOAT16:
        tiny = np.float32(2.0**-24)
        kept = np.where((values != 0) & (np.abs(values) < tiny), np.copysign(tiny, values), values)
        return np.clip(kept, -65504.0, 65504.0).astype(np.float16)
    bits = np.ascontiguousarray(values).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def reduced_tensor(tensor: Any, target: int, name: str | None = None) -> Any:
    """A TensorProto of fp32 values in the reduced type."""
    from onnx import helper, numpy_helper

    values = numpy_helper.to_array(tensor)
    converted = to_reduced_array(values, target)
    return helper.make_tensor(
        tensor.name if name is None else name, target, values.shape, converted.tobytes(), raw=True
    )


def _taken_names(graph: Any) -> set[str]:
    """Every name of a tensor or node of the graph, which a fresh name must not collide with."""
    taken = {n.name for n in graph.node} | {i.name for i in graph.initializer}
    taken |= {v.name for v in [*graph.input, *graph.output, *graph.value_info]}
    return taken | {t for n in graph.node for t in [*n.input, *n.output]}


def convert(
    model: Any,
    target: int = FLOAT16,
    keep_ops: Collection[str] = (),
    keep_nodes: Collection[str] = (),
    keep_io: bool = True,
) -> Any:
    """A copy of ``model`` computing in ``target`` (FLOAT16 or BFLOAT16) wherever it may.

    ``keep_ops`` and ``keep_nodes`` (op types, node names) stay fp32; ``keep_io`` keeps the
    graph's fp32 inputs and outputs fp32, otherwise they take the reduced type too.
    """
    onnx = onnx_module()
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return _Conversion(copy, target, frozenset(keep_ops), frozenset(keep_nodes), keep_io).run()


_ANY = 0
"""A reader that takes any type (Cast's input, Shape's): never given a Cast."""


class _Conversion:
    def __init__(self, model: Any, target: int, keep_ops: frozenset[str], keep_nodes: frozenset[str], keep_io: bool):
        self.model, self.graph, self.target, self.keep_io = model, model.graph, target, keep_io
        self.keep_ops, self.keep_nodes = keep_ops, keep_nodes
        self.opsets = model_opsets(model)
        self.types = tensor_types(model)
        self.initializers = {i.name: i for i in self.graph.initializer}
        self.graph_inputs = {v.name for v in self.graph.input if v.name not in self.initializers}
        bodies = [body for node in self.graph.node for body in subgraphs(node)]
        self.outer_reads = {name for inner in every_node(*bodies) for name in inner.input if name}
        self.taken = _taken_names(self.graph)
        self.out_of_range = _out_of_range_constants(self.graph) if target == FLOAT16 else set()

    def is_float(self, name: str) -> bool:
        return bool(name) and self.types.get(name) == FLOAT

    # -- which nodes compute in the reduced type ------------------------------------------------

    def converted_nodes(self) -> set[int]:
        """Indices of the nodes that compute in the reduced type."""
        candidates = {
            index
            for index, node in enumerate(self.graph.node)
            if any(self.is_float(n) for n in [*node.input, *node.output])
            and not self._kept(node)
            and self._admits_target(node)
        }
        producers = {out: index for index, node in enumerate(self.graph.node) for out in node.output if out}
        for name in self.outer_reads:  # a subgraph reads these by name: they must stay fp32
            candidates.discard(producers.get(name, -1))
        return candidates - self._shape_arithmetic(candidates)

    def _kept(self, node: Any) -> bool:
        return (
            any(name in self.out_of_range for name in [*node.input, *node.output])
            or node.op_type in self.keep_ops
            or node.name in self.keep_nodes
            or node.op_type in BLOCKED
            or node.domain == "ai.onnx.ml"
            or has_subgraph(node)
        )

    def _admits_target(self, node: Any) -> bool:
        """Whether the node's schema lets any of its fp32 tensors take the reduced type."""
        found = node_schema(node, self.opsets)
        if found is None:
            return False
        slots = [found.input_type(p) for p, n in enumerate(node.input) if self.is_float(n)]
        slots += [found.output_type(p) for p, n in enumerate(node.output) if self.is_float(n)]
        return any(found.admits(slot, self.target) for slot in slots)

    def _shape_arithmetic(self, candidates: set[int]) -> set[int]:
        """Candidates whose fp32 outputs only feed sizes, scales or integer casts (directly or
        through other such nodes): fp16 cannot hold those values exactly, so they stay fp32."""
        readers: dict[str, list[tuple[Any, int]]] = {}
        for node in self.graph.node:
            for position, name in enumerate(node.input):
                readers.setdefault(name, []).append((node, position))
        outputs = {v.name for v in self.graph.output}
        shape_only: set[int] = set()
        index_of = {id(node): index for index, node in enumerate(self.graph.node)}
        for index in sorted(candidates, reverse=True):
            node = self.graph.node[index]
            floats = [n for n in node.output if self.is_float(n)]
            if not floats or any(n in outputs or n in self.outer_reads or not readers.get(n) for n in floats):
                continue
            if all(self._is_shape_sink(r, p, shape_only, index_of) for n in floats for r, p in readers[n]):
                shape_only.add(index)
        return shape_only

    def _is_shape_sink(self, reader: Any, position: int, shape_only: set[int], index_of: dict[int, int]) -> bool:
        if reader.op_type == "Cast":
            return int(attribute(reader, "to").i) not in (FLOAT, FLOAT16, BFLOAT16, DOUBLE)
        if index_of[id(reader)] in shape_only:
            return True
        found = node_schema(reader, self.opsets)
        return found is not None and found.input_type(position) == "tensor(float)"

    # -- the types each tensor gets, and each reader wants ----------------------------------------

    def _io_type(self) -> int:
        return FLOAT if self.keep_io else self.target

    def produced_type(self, node: Any, position: int, converted: bool) -> int:
        if not converted:
            return FLOAT
        found = node_schema(node, self.opsets)
        assert found is not None
        return self.target if found.admits(found.output_type(position), self.target) else FLOAT

    def wanted_type(self, node: Any, position: int, converted: bool) -> int:
        if node.op_type == "Cast" or node.op_type in TYPE_AGNOSTIC:
            return _ANY
        if not converted:
            return FLOAT
        found = node_schema(node, self.opsets)
        assert found is not None
        return self.target if found.admits(found.input_type(position), self.target) else FLOAT

    # -- the rewrite ------------------------------------------------------------------------------

    def run(self) -> Any:
        converted = self.converted_nodes()
        new_types: dict[str, int] = {}
        for name in self.graph_inputs:
            if self.is_float(name):
                new_types[name] = FLOAT if name in self.outer_reads else self._io_type()
        wants: dict[str, set[int]] = {name: {FLOAT} for name in self.outer_reads if self.is_float(name)}
        for index, node in enumerate(self.graph.node):
            is_converted = index in converted
            for position, name in enumerate(node.input):
                if self.is_float(name):
                    wants.setdefault(name, set()).add(self.wanted_type(node, position, is_converted))
            for position, name in enumerate(node.output):
                if self.is_float(name):
                    new_types[name] = self.produced_type(node, position, is_converted)
        for value in self.graph.output:
            if self.is_float(value.name):
                wants.setdefault(value.name, set()).add(self._io_type())
        copies = self._convert_initializers(wants, new_types)
        self._cast_graph_outputs(new_types)
        self._rewrite_nodes(converted, new_types, copies)
        self._retype_values(new_types)
        return self.model

    def _convert_initializers(self, wants: dict[str, set[int]], new_types: dict[str, int]) -> dict[str, str]:
        """Weights read only in the reduced type are converted; read in both, they get a reduced
        copy (returned: fp32 name -> copy's name); the rest stay fp32."""
        copies: dict[str, str] = {}
        for position, init in enumerate(self.graph.initializer):
            if init.data_type != FLOAT or init.name in self.graph_inputs:
                continue
            wanted = wants.get(init.name, set()) - {_ANY}
            if self.target not in wanted:
                new_types[init.name] = FLOAT
            elif wanted == {self.target}:
                self.graph.initializer[position].CopyFrom(reduced_tensor(init, self.target))
                new_types[init.name] = self.target
            else:
                copies[init.name] = fresh_name(f"{init.name}_{_suffix(self.target)}", self.taken)
                new_types[init.name] = FLOAT
        for name, copy in copies.items():
            self.graph.initializer.append(reduced_tensor(self.initializers[name], self.target, copy))
        return copies

    def _cast_graph_outputs(self, new_types: dict[str, int]) -> None:
        """A graph output whose producer yields the other type is renamed inside the graph and
        cast back to its own name at the end."""
        for value in self.graph.output:
            name = value.name
            if not self.is_float(name) or new_types.get(name, FLOAT) == self._io_type():
                continue
            if name in self.graph_inputs or name in self.initializers:
                continue
            inner = fresh_name(f"{name}_{_suffix(new_types[name])}", self.taken)
            for node in self.graph.node:
                node.output[:] = [inner if n == name else n for n in node.output]
                node.input[:] = [inner if n == name else n for n in node.input]
            self.types[inner] = FLOAT
            new_types[inner] = new_types[name]
            self.graph.node.append(self._cast(inner, name, self._io_type()))
            new_types[name] = self._io_type()

    def _cast(self, source: str, target_name: str, to: int) -> Any:
        from onnx import helper

        name = fresh_name(f"{target_name}_cast", self.taken)
        return helper.make_node("Cast", [source], [target_name], to=to, name=name)

    def _rewrite_nodes(self, converted: set[int], new_types: dict[str, int], copies: dict[str, str]) -> None:
        casts: dict[tuple[str, int], str] = {}
        nodes = []
        for index, node in enumerate(self.graph.node):
            is_converted = index in converted
            for position, name in enumerate(node.input):
                if not self.is_float(name):
                    continue
                wanted = self.wanted_type(node, position, is_converted)
                have = new_types.get(name, FLOAT)
                if wanted in (_ANY, have):
                    continue
                if name in copies and wanted == self.target:
                    node.input[position] = copies[name]
                    continue
                if (name, wanted) not in casts:
                    casts[(name, wanted)] = fresh_name(f"{name}_{_suffix(wanted)}", self.taken)
                    nodes.append(self._cast(name, casts[(name, wanted)], wanted))
                node.input[position] = casts[(name, wanted)]
            if is_converted:
                self._convert_attributes(node)
            nodes.append(node)
        self.graph.ClearField("node")
        self.graph.node.extend(nodes)

    def _convert_attributes(self, node: Any) -> None:
        """Constants carried in attributes take their node's new type."""
        from onnx import helper

        if node.op_type == "Cast" and attribute(node, "to").i == FLOAT:
            attribute(node, "to").i = self.target
        elif node.op_type in ("Constant", "ConstantOfShape"):
            value = attribute(node, "value")
            if value is not None and value.t.data_type == FLOAT:
                value.t.CopyFrom(reduced_tensor(value.t, self.target))
            elif node.op_type == "ConstantOfShape" and value is None:
                node.attribute.append(helper.make_attribute("value", _vector([0.0], self.target, scalar=False)))
            for scalar_name in ("value_float", "value_floats"):
                scalar = attribute(node, scalar_name)
                if scalar is not None:
                    values = [scalar.f] if scalar_name == "value_float" else list(scalar.floats)
                    node.attribute.remove(scalar)
                    tensor = _vector(values, self.target, scalar_name == "value_float")
                    node.attribute.append(helper.make_attribute("value", tensor))

    def _retype_values(self, new_types: dict[str, int]) -> None:
        for value in [*self.graph.input, *self.graph.output, *self.graph.value_info]:
            if value.name in new_types and value.type.tensor_type.elem_type == FLOAT:
                value.type.tensor_type.elem_type = new_types[value.name]


def _out_of_range_constants(graph: Any) -> set[str]:
    """fp32 weights and constants beyond fp16's range (a batch norm's variance of 1e7, say):
    their readers stay fp32, since no fp16 value is near them."""
    from onnx import numpy_helper

    tensors = [(i.name, i) for i in graph.initializer if i.data_type == FLOAT]
    for node in graph.node:
        value = attribute(node, "value") if node.op_type == "Constant" else None
        if value is not None and value.t.data_type == FLOAT:
            tensors.append((node.output[0], value.t))
    with np.errstate(invalid="ignore"):
        return {
            name
            for name, tensor in tensors
            if np.any(np.abs(np.nan_to_num(numpy_helper.to_array(tensor), posinf=0.0, neginf=0.0)) > 65504.0)
        }


def _suffix(elem_type: int) -> str:
    return {FLOAT: "fp32", FLOAT16: "fp16", BFLOAT16: "bf16"}[elem_type]


def _vector(values: list[float], target: int, scalar: bool) -> Any:
    from onnx import helper

    array = to_reduced_array(np.asarray(values, np.float32), target)
    shape = () if scalar else (len(values),)
    return helper.make_tensor("value", target, shape, array.tobytes(), raw=True)
