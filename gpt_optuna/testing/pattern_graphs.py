"""Small graphs with the patterns that other projects' exporters write and that broke transforms.

Each builder returns a fp32 ONNX model that passes the full checker; ``PATTERNS`` names them with
the ``--shape`` flags to run them. The patterns: opset 11/12 convolutions with batch norm, Clip
bounds as inputs and a Gemm head (PaddlePaddle); an NHWC graph with ConstantOfShape + Concat +
Pad blocks (TensorFlow via tf2onnx, opset 12); Resize with scales and with sizes computed from
shapes (segmentation and line-detection heads, opset 11); an encoder block with Gemm, a
decomposed LayerNorm whose epsilon underflows fp16, Erf-GELU, a weight shared by two readers and
a Cast to float (torch, opset 12); and fused ONNX Runtime contrib operators (SkipLayerNormalization,
BiasGelu).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

_RNG = np.random.default_rng(7)


def _weight(name: str, *shape: int, scale: float = 0.2) -> onnx.TensorProto:
    return numpy_helper.from_array((_RNG.standard_normal(shape) * scale).astype(np.float32), name)


def _ints(name: str, values: list[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _floats(name: str, values: Any) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, np.float32), name)


def _constant(output: str, values: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [output], value=numpy_helper.from_array(values, output + "_value"))


def _f32(name: str, shape: list[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _model(
    name: str,
    nodes: list[onnx.NodeProto],
    inits: list[onnx.TensorProto],
    x: onnx.ValueInfoProto,
    y: onnx.ValueInfoProto,
    opset: int,
    extra: tuple[tuple[str, int], ...] = (),
) -> onnx.ModelProto:
    """A checked model of the graph ``name``: ``nodes`` from the input ``x`` to the output ``y``."""
    graph = helper.make_graph(nodes, name, [x], [y], inits)
    opsets = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, v) for d, v in extra)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="pattern-graphs")
    model.ir_version = 7
    onnx.checker.check_model(model, full_check=True)
    return model


def paddle_cnn() -> onnx.ModelProto:
    """Opset 11, input [-1, 3, ?, ?]: Conv + BatchNorm (a variance beyond fp16's range, as a
    PaddleOCR detector has) + Clip(min, max as Constant inputs) + HardSigmoid gate, global
    pooling, Reshape, Gemm(transB) head and Softmax. Weights are Constant nodes, as Paddle writes."""
    c = 8
    nodes = [
        _constant("w1", (_RNG.standard_normal((c, 3, 3, 3)) * 0.3).astype(np.float32)),
        _constant("b1", np.zeros(c, np.float32)),
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        _constant("gamma", np.ones(c, np.float32)),
        _constant("beta", np.zeros(c, np.float32)),
        _constant("mean", np.zeros(c, np.float32)),
        _constant("var", np.full(c, 1.0e5, np.float32)),
        helper.make_node("BatchNormalization", ["c1", "gamma", "beta", "mean", "var"], ["bn"], epsilon=1e-5),
        _constant("lo", np.array(0.0, np.float32)),
        _constant("hi", np.array(6.0, np.float32)),
        helper.make_node("Clip", ["bn", "lo", "hi"], ["clip"]),
        helper.make_node("HardSigmoid", ["clip"], ["gate"], alpha=0.2, beta=0.5),
        helper.make_node("Mul", ["clip", "gate"], ["act"]),
        helper.make_node("GlobalAveragePool", ["act"], ["pool"]),
        _constant("flat_shape", np.array([-1, c], np.int64)),
        helper.make_node("Reshape", ["pool", "flat_shape"], ["flat"]),
        _constant("fc_w", (_RNG.standard_normal((4, c)) * 20).astype(np.float32)),
        _constant("fc_b", np.zeros(4, np.float32)),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=1),
    ]
    return _model("paddle_cnn", nodes, [], _f32("x", [-1, 3, "?", "?"]), _f32("probs", [-1, 4]), 11)


def tf_nhwc_pad_concat() -> onnx.ModelProto:
    """Opset 12, NHWC input [1, 32, 32, 3] as tf2onnx writes it: Transpose to NCHW, Conv,
    ConstantOfShape blocks (one with an fp32 value, one with none) concatenated on the channels,
    Pad with computed pads and a constant value input, Transpose back to NHWC."""
    nodes = [
        helper.make_node("Transpose", ["x"], ["nchw"], perm=[0, 3, 1, 2]),
        helper.make_node("Conv", ["nchw", "w", "b"], ["conv"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv"], ["relu"]),
        helper.make_node("Shape", ["relu"], ["shape"]),
        helper.make_node("Slice", ["shape", "zero", "one", "zero"], ["batch"]),
        helper.make_node("Concat", ["batch", "extra_channels", "hw"], ["block_shape"], axis=0),
        helper.make_node("ConstantOfShape", ["block_shape"], ["ones"], value=_floats("v", [1.0])),
        helper.make_node("ConstantOfShape", ["block_shape"], ["zeros"]),
        helper.make_node("Concat", ["relu", "ones", "zeros"], ["stacked"], axis=1),
        helper.make_node("Concat", ["pads_head", "pads_tail"], ["pads"], axis=0),
        helper.make_node("Pad", ["stacked", "pads", "pad_value"], ["padded"], mode="constant"),
        helper.make_node("Transpose", ["padded"], ["y"], perm=[0, 2, 3, 1]),
    ]
    inits = [
        _weight("w", 6, 3, 3, 3),
        _weight("b", 6),
        _ints("zero", [0]),
        _ints("one", [1]),
        _ints("extra_channels", [1]),
        _ints("hw", [32, 32]),
        _ints("pads_head", [0, 0, 1, 1]),
        _ints("pads_tail", [0, 0, 1, 1]),
        _floats("pad_value", 0.5),
    ]
    return _model("tf_nhwc", nodes, inits, _f32("x", [1, 32, 32, 3]), _f32("y", [1, 34, 34, 8]), 12)


def resize_head() -> onnx.ModelProto:
    """Opset 11, input [1, 4, 16, 16]: Resize by constant scales (empty roi), a convolution, and
    Resize to sizes computed from another tensor's shape; scales computed from shapes in float
    arithmetic feed a third Resize, as segmentation and line-detection heads do."""
    nodes = [
        helper.make_node("Resize", ["x", "roi", "scales"], ["up"], mode="nearest"),
        helper.make_node("Conv", ["up", "w", "b"], ["conv"], pads=[1, 1, 1, 1]),
        helper.make_node("Shape", ["x"], ["x_shape"]),
        helper.make_node("Slice", ["x_shape", "two", "four", "zero"], ["x_hw"]),
        helper.make_node("Concat", ["nc", "x_hw"], ["sizes"], axis=0),
        helper.make_node("Resize", ["conv", "roi", "no_scales", "sizes"], ["down"], mode="linear"),
        helper.make_node("Shape", ["conv"], ["conv_shape"]),
        helper.make_node("Cast", ["conv_shape"], ["conv_shape_f"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["x_shape"], ["x_shape_f"], to=TensorProto.FLOAT),
        helper.make_node("Div", ["x_shape_f", "conv_shape_f"], ["ratio"]),
        helper.make_node("Resize", ["conv", "roi", "ratio"], ["down2"], mode="linear"),
        helper.make_node("Add", ["down", "down2"], ["sum"]),
        helper.make_node("Add", ["sum", "x"], ["y"]),
    ]
    inits = [
        _floats("roi", []),
        _floats("scales", [1, 1, 2, 2]),
        _floats("no_scales", []),
        _weight("w", 4, 4, 3, 3),
        _weight("b", 4),
        _ints("zero", [0]),
        _ints("two", [2]),
        _ints("four", [4]),
        _ints("nc", [1, 4]),
    ]
    return _model("resize_head", nodes, inits, _f32("x", [1, 4, 16, 16]), _f32("y", [1, 4, 16, 16]), 11)


def torch_encoder_block() -> onnx.ModelProto:
    """Opset 12, int64 ids [batch, sequence]: Gather embedding, a Cast of the ids to float (a
    mask), Gemm on a flattened view, a decomposed LayerNorm whose epsilon (1e-12) underflows fp16,
    Erf-GELU, and one weight read by two MatMuls (the second also through an Identity)."""
    hidden = 16
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["emb"]),
        helper.make_node("Cast", ["ids"], ["ids_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["ids_f"], ["ids_f3"], axes=[2]),
        helper.make_node("Mul", ["ids_f3", "mask_scale"], ["bias"]),
        helper.make_node("Add", ["emb", "bias"], ["h0"]),
        helper.make_node("Shape", ["h0"], ["h_shape"]),
        helper.make_node("Reshape", ["h0", "flat_shape"], ["flat"]),
        helper.make_node("Gemm", ["flat", "gemm_w", "gemm_b"], ["g"], transB=1),
        helper.make_node("Reshape", ["g", "h_shape"], ["h1"]),
        helper.make_node("ReduceMean", ["h1"], ["mu"], axes=[-1]),
        helper.make_node("Sub", ["h1", "mu"], ["centered"]),
        helper.make_node("Pow", ["centered", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1]),
        helper.make_node("Add", ["var", "eps"], ["var_eps"]),
        helper.make_node("Sqrt", ["var_eps"], ["std"]),
        helper.make_node("Div", ["centered", "std"], ["normed"]),
        helper.make_node("MatMul", ["normed", "shared"], ["m1"]),
        helper.make_node("Div", ["m1", "sqrt2"], ["m1_scaled"]),
        helper.make_node("Erf", ["m1_scaled"], ["erf"]),
        helper.make_node("Add", ["erf", "one"], ["erf1"]),
        helper.make_node("Mul", ["m1", "erf1"], ["gelu2"]),
        helper.make_node("Mul", ["gelu2", "half"], ["gelu"]),
        helper.make_node("Identity", ["shared"], ["shared_copy"]),
        helper.make_node("MatMul", ["gelu", "shared_copy"], ["m2"]),
        helper.make_node("Add", ["m2", "h1"], ["out"]),
    ]
    inits = [
        _weight("table", 4, hidden, scale=1.0),
        _floats("mask_scale", [0.1]),
        _ints("flat_shape", [-1, hidden]),
        _weight("gemm_w", hidden, hidden),
        _weight("gemm_b", hidden),
        _floats("two", 2.0),
        _floats("eps", 1e-12),
        _weight("shared", hidden, hidden),
        _floats("sqrt2", 1.4142135),
        _floats("one", 1.0),
        _floats("half", 0.5),
    ]
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "sequence"])
    return _model("torch_encoder_block", nodes, inits, ids, _f32("out", ["batch", "sequence", hidden]), 12)


def fused_contrib() -> onnx.ModelProto:
    """Opset 17 with ONNX Runtime's fused operators, as its transformer optimizer writes them:
    MatMul, SkipLayerNormalization (with bias) and BiasGelu (com.microsoft)."""
    hidden = 16
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["proj"]),
        helper.make_node(
            "SkipLayerNormalization",
            ["proj", "x", "gamma", "beta", "bias"],
            ["normed"],
            domain="com.microsoft",
            epsilon=1e-5,
        ),
        helper.make_node("MatMul", ["normed", "w2"], ["up"]),
        helper.make_node("BiasGelu", ["up", "gelu_bias"], ["y"], domain="com.microsoft"),
    ]
    inits = [
        _weight("w", hidden, hidden),
        _floats("gamma", np.ones(hidden)),
        _floats("beta", np.zeros(hidden)),
        _weight("bias", hidden),
        _weight("w2", hidden, 2 * hidden),
        _weight("gelu_bias", 2 * hidden),
    ]
    x, y = _f32("x", [2, 8, hidden]), _f32("y", [2, 8, 2 * hidden])
    return _model("fused_contrib", nodes, inits, x, y, 17, (("com.microsoft", 1),))


PATTERNS = {
    "paddle_cnn": (paddle_cnn, ["x:2x3x24x40"]),
    "tf_nhwc_pad_concat": (tf_nhwc_pad_concat, []),
    "resize_head": (resize_head, []),
    "torch_encoder_block": (torch_encoder_block, ["ids:2x8"]),
    "fused_contrib": (fused_contrib, []),
}
"""name -> (builder, --shape flags)."""
