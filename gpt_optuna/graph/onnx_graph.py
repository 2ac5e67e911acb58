"""Lookups over an ONNX graph for the graph rewrites: producers, consumers, constants, shapes,
a part of the graph evaluated on its own with ONNX Runtime (CPU), and dead nodes dropped."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from functools import cached_property
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from gpt_optuna.core.log import onnxruntime_options
from gpt_optuna.graph.model import Dim, every_node, subgraphs

SHAPE_ONLY = ("Shape", "Size")
"""Operators whose output depends on their input's shape alone, not its values."""


class GraphIndex:
    """Lookups over a model's main graph; the names it makes start with ``prefix``."""

    def __init__(self, model: onnx.ModelProto, prefix: str) -> None:
        self.model = model
        self.graph = model.graph
        self.initializers = {t.name: t for t in self.graph.initializer}
        self.inputs = {i.name: i for i in self.graph.input if i.name not in self.initializers}
        self.producer = {o: n for n in self.graph.node for o in n.output}
        self.consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        for node in self.graph.node:
            for name in node.input:
                self.consumers[name].append(node)
        self._prefix = prefix
        self._names = 0

    @cached_property
    def inferred(self) -> dict[str, onnx.ValueInfoProto]:
        """Each tensor's type and shape as shape inference knows them."""
        try:
            inferred = onnx.shape_inference.infer_shapes(self.model, data_prop=True).graph
        except (ValueError, onnx.shape_inference.InferenceError):  # e.g. over 2 GB in memory
            inferred = self.graph
        return {v.name: v for v in [*inferred.value_info, *inferred.input, *inferred.output]}

    @cached_property
    def shapes(self) -> dict[str, list[Dim]]:
        """Each tensor's dims as shape inference knows them (a name, a size, or None)."""
        return {
            name: [d.dim_param or d.dim_value or None for d in v.type.tensor_type.shape.dim]
            for name, v in self.inferred.items()
            if v.type.tensor_type.HasField("shape")
        }

    def name(self, base: str) -> str:
        self._names += 1
        return f"{self._prefix}_{base}_{self._names}"

    def constant(self, name: str) -> np.ndarray | None:
        """The value of an initializer or a Constant node's output."""
        if name in self.initializers:
            return numpy_helper.to_array(self.initializers[name])
        node = self.producer.get(name)
        if node is not None and node.op_type == "Constant" and node.attribute[0].name == "value":
            return numpy_helper.to_array(node.attribute[0].t)
        return None

    def scalar(self, name: str) -> float | None:
        value = self.constant(name)
        return None if value is None or value.size != 1 else float(value.reshape(()))

    def parent(self, name: str, op_type: str, perm: list[int] | None = None) -> onnx.NodeProto | None:
        """The producer of ``name`` if it is an ``op_type`` (with that ``perm``)."""
        node = self.producer.get(name)
        if node is None or node.op_type != op_type:
            return None
        if perm is not None and attribute(node, "perm") != perm:
            return None
        return node

    def add(self, nodes: list[onnx.NodeProto]) -> None:
        """Make ``nodes`` (not yet placed in the graph) the producers of their outputs, so that
        :func:`evaluate` can run them."""
        for node in nodes:
            for name in node.output:
                self.producer[name] = node

    def initializer(self, value: np.ndarray, base: str) -> str:
        name = self.name(base)
        tensor = numpy_helper.from_array(value, name)
        self.graph.initializer.append(tensor)
        self.initializers[name] = tensor
        return name


def attribute(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def elem_type(graph: GraphIndex, name: str) -> int:
    """The element type of tensor ``name``: as declared or inferred, else that of a weight its readers take."""
    for value in [*graph.graph.value_info, *graph.graph.input, *graph.graph.output, graph.inferred.get(name)]:
        if value is not None and value.name == name and value.type.tensor_type.elem_type:
            return value.type.tensor_type.elem_type
    weight = next(
        (graph.initializers[i] for n in graph.consumers[name] for i in n.input if i in graph.initializers), None
    )
    return weight.data_type if weight is not None else TensorProto.FLOAT


def value_sources(graph: GraphIndex, name: str) -> set[str]:
    """The graph inputs whose values (not only shapes) ``name`` is computed from."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        node = graph.producer.get(current)
        if node is not None:
            todo.extend(node.input[1:] if node.op_type in SHAPE_ONLY else node.input)
    return seen.intersection(graph.inputs)


def subgraph(graph: GraphIndex, target: str, given: set[str]) -> tuple[list[onnx.NodeProto], set[str], set[str]]:
    """The nodes ``target`` is computed by from ``given`` tensors, in an order that runs (inputs
    first), the initializers they read, and the graph inputs they need besides ``given``."""
    nodes: list[onnx.NodeProto] = []
    expanded: set[int] = set()
    initializers: set[str] = set()
    inputs: set[str] = set()
    todo: list[tuple[str, bool]] = [(target, False)]
    while todo:
        current, done = todo.pop()
        node = graph.producer.get(current)
        if done:
            nodes.append(node)  # type: ignore[arg-type]  # its inputs' producers are in the list
        elif current in given or current == "":
            continue
        elif current in graph.initializers:
            initializers.add(current)
        elif current in graph.inputs:
            inputs.add(current)
        elif node is not None and id(node) not in expanded:
            expanded.add(id(node))
            todo.append((current, True))
            todo.extend((name, False) for name in node.input)
    return nodes, initializers, inputs


def evaluate(graph: GraphIndex, target: str, feeds: dict[str, np.ndarray]) -> np.ndarray | None:
    """``target`` computed by ONNX Runtime (CPU) from ``feeds`` alone; None where it needs more or fails."""
    import onnxruntime as ort

    nodes, initializers, missing = subgraph(graph, target, set(feeds))
    if missing - set(feeds) or any(a.type in (a.GRAPH, a.GRAPHS) for n in nodes for a in n.attribute):
        return None
    inputs = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), None) for n, v in feeds.items()
    ]
    output = helper.make_tensor_value_info(target, elem_type(graph, target), None)
    sub = helper.make_graph(nodes, "subgraph", inputs, [output], [graph.initializers[i] for i in initializers])
    model = helper.make_model(sub, opset_imports=graph.model.opset_import, ir_version=graph.model.ir_version)
    model.functions.extend(graph.model.functions)
    options = onnxruntime_options(ort)
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return np.asarray(session.run(None, feeds)[0])
    except Exception:  # ONNX Runtime's own error types: the subgraph does not run on its own
        return None


def disagreement(graph: GraphIndex, original: str, rewritten: str, feed: dict[str, np.ndarray]) -> str | None:
    """Why ``rewritten`` does not compute what ``original`` does from ``feed`` (both run with ONNX
    Runtime on the CPU; a relative tolerance of 1e-4 in fp32, 2e-2 otherwise); None where they agree."""
    expected, got = evaluate(graph, original, feed), evaluate(graph, rewritten, feed)
    if expected is None or got is None:
        return "the original or its rewrite does not run on its own with ONNX Runtime (CPU)"
    tolerance = 1e-4 if next(iter(feed.values())).dtype == np.float32 else 2e-2
    atol = tolerance * float(np.abs(expected).max())
    if expected.shape != got.shape or not np.allclose(got, expected, rtol=tolerance, atol=atol):
        return "the rewrite computes something else than the original (checked on a random input)"
    return None


def drop_dead(graph: onnx.GraphProto) -> None:
    """Remove nodes, initializers and value_info no graph output (or subgraph) reads any more."""
    live = {o.name for o in graph.output}
    kept: list[onnx.NodeProto] = []
    for node in reversed(graph.node):
        if any(o in live for o in node.output):
            kept.append(node)
            live.update(reads(node))
    graph.ClearField("node")
    graph.node.extend(reversed(kept))
    inputs = {i.name for i in graph.input}
    initializers = [t for t in graph.initializer if t.name in live or t.name in inputs]
    graph.ClearField("initializer")
    graph.initializer.extend(initializers)
    produced = {o for n in graph.node for o in n.output}
    value_info = [v for v in graph.value_info if v.name in produced]
    graph.ClearField("value_info")
    graph.value_info.extend(value_info)


def reads(node: onnx.NodeProto) -> Iterable[str]:
    """The names a node reads, its subgraphs' outer-scope references included."""
    yield from node.input
    for inner in every_node(*subgraphs(node)):
        yield from inner.input
