"""Fold a graph's constant subgraphs into initializers, as TensorRT's own advice is before parsing.

Exporters leave weights computed in the graph: int8 weights cast to float and scaled (an encoder
stored compressed), shapes computed from constants. TensorRT's parser takes an int8 constant that
does not feed a DequantizeLinear for a quantized value and refuses to build. Folding evaluates
every node whose inputs are all constants (with ONNX's reference evaluator, no extra library) and
stores the results as initializers. QuantizeLinear/DequantizeLinear are never folded: they are
how a graph asks TensorRT for int8 or fp8 kernels.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpt_optuna.graph.model import ModelInfo, load_model_info
from gpt_optuna.graph.model_cache import produce

KEEP = frozenset({"QuantizeLinear", "DequantizeLinear", "RandomNormal", "RandomUniform", "Multinomial", "Bernoulli"})
KEEP |= {"RandomNormalLike", "RandomUniformLike"}
"""Ops never folded: explicit quantization, and ops whose value is not a function of their inputs."""


def foldable_nodes(model: Any) -> list[Any]:
    """The nodes whose inputs are all constants (initializers, or outputs of such nodes)."""
    onnx_inputs = {v.name for v in model.graph.input}
    constant = {i.name for i in model.graph.initializer if i.name not in onnx_inputs}
    found = []
    for node in model.graph.node:
        if node.op_type in KEEP or node.domain not in ("", "ai.onnx") or any(a.type == 5 for a in node.attribute):
            continue  # 5: a GRAPH attribute (If, Loop, Scan)
        if node.op_type == "Constant" or all(not name or name in constant for name in node.input):
            found.append(node)
            constant |= set(node.output)
    return [n for n in found if n.op_type != "Constant" or _feeds_fold(n, found)]


def _feeds_fold(constant: Any, nodes: list[Any]) -> bool:
    """A Constant node is folded only with a node that reads it (alone it is constant already)."""
    return any(name in n.input for n in nodes if n is not constant for name in constant.output)


def fold(model: Any) -> Any:
    """A copy of ``model`` with its constant subgraphs replaced by initializers (itself if none)."""
    import onnx
    from onnx import numpy_helper

    nodes = foldable_nodes(model)
    if not any(n.op_type != "Constant" for n in nodes):
        return model
    folded_ids = {id(n) for n in nodes}
    remaining = [n for n in model.graph.node if id(n) not in folded_ids]
    needed = {name for n in remaining for name in n.input} | {v.name for v in model.graph.output}
    produced = [name for n in nodes for name in n.output if name in needed]
    values = _constant_values(model, nodes, produced)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    copy.graph.ClearField("node")
    copy.graph.node.extend(remaining)
    kept = [i for i in model.graph.initializer if i.name in needed]
    copy.graph.ClearField("initializer")
    copy.graph.initializer.extend(kept + [numpy_helper.from_array(v, n) for n, v in zip(produced, values, strict=True)])
    return copy


def _constant_values(model: Any, nodes: list[Any], produced: list[str]) -> list[Any]:
    """The values of ``produced`` that the constant ``nodes`` of ``model`` compute (ONNX's reference evaluator)."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    initializers = {i.name: i for i in model.graph.initializer}
    used = sorted({name for n in nodes for name in n.input if name in initializers})
    sub = helper.make_graph(
        nodes,
        "constants",
        [],
        [helper.make_tensor_value_info(name, 0, None) for name in produced],
        [initializers[name] for name in used],
    )
    return ReferenceEvaluator(helper.make_model(sub, opset_imports=model.opset_import)).run(None, {})


def folded(model: ModelInfo, cache_dir: Path) -> ModelInfo:
    """The model with its constants folded, made once per model in ``cache_dir`` (the model itself
    where nothing folds)."""
    import onnx

    graph = onnx.load(str(model.path))
    if not any(n.op_type != "Constant" for n in foldable_nodes(graph)):
        return model
    out = cache_dir / f"folded-{model.sha256[:24]}.onnx"
    return load_model_info(produce(out, lambda tmp: onnx.save(fold(graph), str(tmp))))
