"""Fold per-channel scales that follow a projection into the projection's weights.

ConvNeXt-style blocks (and CaiT-style transformers) scale each residual branch by a learned vector
after its last projection: ``(x @ W + b) * g``. That is ``x @ (W * g) + b * g``, one elementwise
kernel fewer per block; the constants are folded here, once.
"""

from __future__ import annotations

import numpy as np
import onnx

from gpt_optuna.graph.onnx_graph import GraphIndex, drop_dead

PREFIX = "layer_scale"


def fold_layer_scales(model: onnx.ModelProto) -> int:
    """Fold ``Mul(Add(MatMul(x, W), b), g)`` by constants ``W`` [in, out], ``b`` and ``g`` of ``out``
    values along the last axis into ``MatMul(x, W * g) + b * g``, in place; return how many."""
    graph = GraphIndex(model, PREFIX)
    folded = 0
    for mul in [n for n in graph.graph.node if n.op_type == "Mul"]:
        found = _scaled_projection(graph, mul)
        if found is None or any(o.name == mul.output[0] for o in graph.graph.output):
            continue
        add, matmul, bias_index, weight, bias, scale = found
        matmul.input[1] = graph.initializer((weight * scale).astype(weight.dtype), "weight")
        add.input[bias_index] = graph.initializer((bias * scale.reshape(bias.shape)).astype(bias.dtype), "bias")
        for user in graph.consumers[mul.output[0]]:
            for i, name in enumerate(user.input):
                if name == mul.output[0]:
                    user.input[i] = add.output[0]
        graph.graph.node.remove(mul)
        folded += 1
    if folded:
        drop_dead(graph.graph)
    return folded


def _scaled_projection(
    graph: GraphIndex, mul: onnx.NodeProto
) -> tuple[onnx.NodeProto, onnx.NodeProto, int, np.ndarray, np.ndarray, np.ndarray] | None:
    """(Add, MatMul, the bias's input index, weight, bias, the scale as a vector) where ``mul`` scales a projection."""
    for side in (0, 1):
        scale, add = graph.constant(mul.input[side]), graph.parent(mul.input[1 - side], "Add")
        if scale is None or add is None or len(graph.consumers[add.output[0]]) != 1:
            continue
        for bias_index in (0, 1):
            matmul = graph.parent(add.input[1 - bias_index], "MatMul")
            weight, bias = graph.constant(matmul.input[1]) if matmul else None, graph.constant(add.input[bias_index])
            if matmul is None or weight is None or bias is None or weight.ndim != 2:
                continue
            width = weight.shape[1]
            rank = len(graph.shapes.get(add.output[0]) or [])
            if (
                len(graph.consumers[matmul.output[0]]) == 1
                and scale.size == width
                and scale.shape[-1] == width
                and rank >= scale.ndim
                and bias.size == width
                and bias.shape[-1] == width
                and np.all(np.isfinite(scale))
            ):
                return add, matmul, bias_index, weight, bias, scale.reshape(width)
    return None
