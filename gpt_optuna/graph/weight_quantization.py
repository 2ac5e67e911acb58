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
    """(int8 weight, scale per channel in the weight's dtype): scale = max |w| over the channel / 127
    (1.0 where that is below the dtype's smallest scale), q = clip(round(w / scale), -127, 127), in
    ONNX Runtime's arithmetic (the scale in float64, stored in the weight's dtype, divided in float32)."""
    moved = np.moveaxis(weight, axis, 0)
    flat = moved.reshape(moved.shape[0], -1)
    absmax = np.abs(flat).max(axis=1) if flat.shape[1] else np.zeros(flat.shape[0], weight.dtype)
    scale = absmax.astype(np.float64) / INT8_SYMMETRIC_MAX
    info = np.finfo(weight.dtype)
    smallest = info.smallest_subnormal if weight.dtype == np.float16 else info.tiny
    too_small = (scale.astype(weight.dtype) if weight.dtype == np.float16 else scale) < smallest
    scale = np.where(too_small, 1.0, scale).astype(weight.dtype)
    shape = [1] * weight.ndim
    shape[axis] = -1
    divided = weight.astype(np.float32) / scale.astype(np.float32).reshape(shape)
    return np.clip(np.round(divided), -INT8_SYMMETRIC_MAX, INT8_SYMMETRIC_MAX).astype(np.int8), scale


def weight_axes(model: Any, op_types: tuple[str, ...]) -> dict[str, int]:
    """{float32 or float16 initializer a node of ``op_types`` reads as a weight: its channel axis}.
    As in ONNX Runtime: a MatMul's weight is any initializer input, another op's its input 1; where
    several nodes read one weight, the last whose axis is within the weight's rank decides; a weight
    without one is left out (it stays per tensor)."""
    from onnx import TensorProto

    floats = (TensorProto.FLOAT, TensorProto.FLOAT16)
    initializers = {init.name: init for init in model.graph.initializer if init.data_type in floats}
    axes: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type not in op_types:
            continue
        for name in node.input if node.op_type == "MatMul" else node.input[1:2]:
            init = initializers.get(name)
            axis = None if init is None else channel_axis(node, len(init.dims))
            if axis is not None:
                axes[name] = axis
    return axes


def per_channel_weights(quantized: Any, float_model: Any, op_types: tuple[str, ...]) -> int:
    """Turn, in place, the per-tensor int8 weights of ``quantized`` (ONNX Runtime's QDQ output for
    ``float_model``) into per-channel ones; returns how many were turned. A weight the quantizer
    left in float (an op it did not quantize) stays; one it quantized under other names than its
    own (``W_quantized``, ``W_scale``, ``W_zero_point``) is an error, not silently per tensor."""
    from onnx import helper, numpy_helper

    axes = weight_axes(float_model, op_types)
    floats = {init.name: init for init in float_model.graph.initializer if init.name in axes}
    dequantizers = {node.input[0]: node for node in quantized.graph.node if node.op_type == "DequantizeLinear"}
    left_in_float = {init.name for init in quantized.graph.initializer}
    replaced: dict[str, Any] = {}
    for name, axis in axes.items():
        node = dequantizers.get(f"{name}_quantized")
        if node is None or list(node.input[1:]) != [f"{name}_scale", f"{name}_zero_point"]:
            if name in left_in_float:
                continue
            raise RuntimeError(f"the quantizer replaced weight {name!r} under names not known here")
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
