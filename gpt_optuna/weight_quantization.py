"""Per-channel symmetric int8 weights, quantized in one array operation per weight.

ONNX Runtime's quantizer computes and applies per-channel scales one channel at a time in Python
(most of an int8 transform of a large transformer). So the quantizer runs per tensor, which is
fast and places every Q/DQ pair and calibrates activations as it would per channel, and each
weight it quantized is then re-quantized here per channel from the float original: the same axis,
scales, rounding and names as its own per-channel symmetric int8 path, so the graph is the one it
would have made.
"""

from __future__ import annotations

from typing import Any

import numpy as np

INT8_SYMMETRIC_MAX = 127
"""Symmetric int8 uses -127..127, so that zero is exact and every channel's zero point is 0."""


def channel_axis(node: Any, rank: int) -> int | None:
    """The weight's channel axis as ONNX Runtime chooses it for ``node`` (Conv: output channels;
    ConvTranspose: axis 1; Gemm: 0 if B is transposed, else 1; MatMul: 1), None where that axis is
    out of the weight's rank."""
    if node.op_type == "Conv":
        axis = 0
    elif node.op_type == "Gemm":
        axis = 0 if any(a.name == "transB" and a.i for a in node.attribute) else 1
    else:
        axis = 1
    return axis if axis < rank else None


def per_channel_int8(weight: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """(int8 weight, float32 scale per channel): scale = max |w| over the channel / 127 (1.0 for an
    all-zero channel), q = clip(round(w / scale), -127, 127)."""
    moved = np.moveaxis(weight.astype(np.float32, copy=False), axis, 0)
    flat = moved.reshape(moved.shape[0], -1)
    absmax = np.abs(flat).max(axis=1) if flat.shape[1] else np.zeros(flat.shape[0], np.float32)
    scale = absmax.astype(np.float64) / INT8_SYMMETRIC_MAX
    scale = np.where(scale < np.finfo(np.float32).tiny, 1.0, scale).astype(np.float32)
    shape = [1] * weight.ndim
    shape[axis] = -1
    quantized = np.clip(np.round(weight / scale.reshape(shape)), -INT8_SYMMETRIC_MAX, INT8_SYMMETRIC_MAX)
    return quantized.astype(np.int8), scale


def weight_axes(model: Any, op_types: tuple[str, ...]) -> dict[str, int]:
    """{float32 initializer feeding input 1 (the weight) of a node of ``op_types``: its channel
    axis}; a weight without one is left out (it stays per tensor)."""
    from onnx import TensorProto

    graph = model.graph
    graph_inputs = {value.name for value in graph.input}
    initializers = {init.name: init for init in graph.initializer if init.name not in graph_inputs}
    axes: dict[str, int] = {}
    for node in graph.node:
        if node.op_type not in op_types or len(node.input) < 2 or node.input[1] in axes:
            continue
        init = initializers.get(node.input[1])
        if init is None or init.data_type != TensorProto.FLOAT:
            continue
        axis = channel_axis(node, len(init.dims))
        if axis is not None:
            axes[init.name] = axis
    return axes


def per_channel_weights(quantized: Any, float_model: Any, op_types: tuple[str, ...]) -> int:
    """Turn, in place, the per-tensor int8 weights of ``quantized`` (ONNX Runtime's QDQ output for
    ``float_model``) into per-channel ones; returns how many were turned."""
    from onnx import helper, numpy_helper

    axes = weight_axes(float_model, op_types)
    floats = {init.name: init for init in float_model.graph.initializer if init.name in axes}
    dequantizers = {node.input[0]: node for node in quantized.graph.node if node.op_type == "DequantizeLinear"}
    replaced: dict[str, Any] = {}
    for name, axis in axes.items():
        node = dequantizers.get(f"{name}_quantized")
        if node is None or list(node.input[1:]) != [f"{name}_scale", f"{name}_zero_point"]:
            continue  # not quantized by the quantizer (an op it skipped)
        weight, scale = per_channel_int8(numpy_helper.to_array(floats[name]), axis)
        replaced[f"{name}_quantized"] = numpy_helper.from_array(weight, f"{name}_quantized")
        replaced[f"{name}_scale"] = numpy_helper.from_array(scale, f"{name}_scale")
        replaced[f"{name}_zero_point"] = numpy_helper.from_array(np.zeros(scale.shape, np.int8), f"{name}_zero_point")
        kept = [a for a in node.attribute if a.name != "axis"]
        del node.attribute[:]
        node.attribute.extend([*kept, helper.make_attribute("axis", axis)])
    for init in quantized.graph.initializer:
        if init.name in replaced:
            init.CopyFrom(replaced[init.name])
    return len(replaced) // 3
