"""Rewrite patch convolutions (kernel == stride, no padding) as one matrix product.

Vision transformers embed their patches, and ConvNeXt-style networks their stem and downsampling,
with a convolution whose windows do not overlap. cuDNN runs it as an implicit GEMM over a
kernel-sized window, often with a generic kernel; the same result is a reshape of the input into
patches and one matrix product, which runs on the tensor cores' best GEMM::

    Conv(x, W, b)  ->  Transpose[0,3,1,2](Reshape(Transpose[0,2,4,1,3,5](Reshape(x, [N, C, H/k, k, W/k, l])),
                                                   [N, H/k, W/l, C*k*l]) @ W' + b)

Convolutions of a 1x1 kernel are left to cuDNN (no window to gather). Each rewrite is proven by
evaluation: the convolution and its rewrite run with ONNX Runtime (CPU) on the same random input
and must agree, else the convolution is left as it is.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from gpt_optuna.graph.onnx_graph import Dim, GraphIndex, attribute, disagreement, drop_dead, elem_type

PREFIX = "patch_conv"


def rewrite_patch_convolutions(model: onnx.ModelProto) -> int:
    """Rewrite ``model``'s patch convolutions in place; return how many."""
    graph = GraphIndex(model, PREFIX)
    rewritten = attempted = 0
    for conv in [n for n in graph.graph.node if n.op_type == "Conv"]:
        nodes = _patches(graph, conv)
        if nodes is None:
            continue
        attempted += 1
        if _agrees(graph, conv, nodes):
            nodes[-1].output[0] = conv.output[0]  # the convolution's output, graph output or not
            position = list(graph.graph.node).index(conv)
            graph.graph.node.remove(conv)
            for offset, node in enumerate(nodes):
                graph.graph.node.insert(position + offset, node)
            rewritten += 1
    if attempted:
        drop_dead(graph.graph)
    return rewritten


def _patches(graph: GraphIndex, conv: onnx.NodeProto) -> list[onnx.NodeProto] | None:
    """The nodes computing ``conv``'s output as a matrix product, or None where it is no patch convolution."""
    weight = graph.constant(conv.input[1])
    bias = graph.constant(conv.input[2]) if len(conv.input) > 2 and conv.input[2] else None
    dims = graph.shapes.get(conv.input[0])
    if weight is None or weight.ndim != 4 or (len(conv.input) > 2 and conv.input[2] and bias is None):
        return None
    out_channels, channels, kh, kw = weight.shape
    if not _tiles_its_input(conv, weight.shape, dims):
        return None
    rows, cols = dims[2] // kh, dims[3] // kw  # type: ignore[operator]
    dtype = helper.tensor_dtype_to_np_dtype(elem_type(graph, conv.input[0]))
    matrix = weight.reshape(out_channels, channels * kh * kw).T.astype(dtype)
    names = [graph.name(step) for step in ("windows", "patches", "rows", "product", "biased")]
    nodes = [
        helper.make_node(
            "Reshape", [conv.input[0], _shape(graph, [0, channels, rows, kh, cols, kw])], [names[0]], name=names[0]
        ),
        helper.make_node("Transpose", [names[0]], [names[1]], name=names[1], perm=[0, 2, 4, 1, 3, 5]),
        helper.make_node(
            "Reshape", [names[1], _shape(graph, [0, rows, cols, channels * kh * kw])], [names[2]], name=names[2]
        ),
        helper.make_node("MatMul", [names[2], graph.initializer(matrix, "weight")], [names[3]], name=names[3]),
    ]
    last = names[3]
    if bias is not None:
        shift = graph.initializer(bias.astype(dtype), "bias")
        nodes.append(helper.make_node("Add", [last, shift], [names[4]], name=names[4]))
        last = names[4]
    out = graph.name("nchw")
    nodes.append(helper.make_node("Transpose", [last], [out], name=out, perm=[0, 3, 1, 2]))
    return nodes


def _tiles_its_input(conv: onnx.NodeProto, weight_shape: tuple[int, ...], dims: list[Dim] | None) -> bool:
    """Whether ``conv`` (weights of ``weight_shape``) cuts its input (of ``dims``) into whole
    non-overlapping patches of more than one pixel: strides equal to the kernel, no padding,
    dilation or groups, and a static input the kernel divides."""
    _, channels, kh, kw = weight_shape
    return not (
        kh * kw == 1
        or attribute(conv, "strides") != [kh, kw]
        or any(attribute(conv, "pads", [0] * 4))
        or any(d != 1 for d in attribute(conv, "dilations", [1, 1]))
        or attribute(conv, "group", 1) != 1
        or attribute(conv, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET")
        or not dims
        or len(dims) != 4
        or not all(isinstance(d, int) for d in dims[1:])
        or dims[1] != channels
        or dims[2] % kh  # type: ignore[operator]
        or dims[3] % kw  # type: ignore[operator]
    )


def _shape(graph: GraphIndex, dims: list[int]) -> str:
    return graph.initializer(np.array(dims, np.int64), "shape")


def _agrees(graph: GraphIndex, conv: onnx.NodeProto, nodes: list[onnx.NodeProto]) -> bool:
    """Whether ``nodes`` compute ``conv``'s output, checked on one random input."""
    dims = graph.shapes[conv.input[0]]
    batch = dims[0] if isinstance(dims[0], int) else 1
    dtype = helper.tensor_dtype_to_np_dtype(elem_type(graph, conv.input[0]))
    feed = {conv.input[0]: np.random.default_rng(0).standard_normal([batch, *dims[1:]]).astype(dtype)}  # type: ignore[misc]
    graph.add(nodes)
    return disagreement(graph, conv.output[0], nodes[-1].output[0], feed) is None
