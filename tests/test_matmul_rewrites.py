"""Patch convolutions as matrix products and layer scales folded into projections, checked with
real ONNX Runtime on the CPU."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from gpt_optuna.graph.layer_scale import fold_layer_scales
from gpt_optuna.graph.patch_convolution import rewrite_patch_convolutions


def model_of(nodes: list[onnx.NodeProto], dims: list[int | str], inits: dict[str, np.ndarray]) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * len(dims))],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def copy(model: onnx.ModelProto) -> onnx.ModelProto:
    duplicate = onnx.ModelProto()
    duplicate.CopyFrom(model)
    return duplicate


def conv_model(
    kernel: int, stride: int, pads: int = 0, group: int = 1, size: int = 16, bias: bool = True, batch: int | str = 2
) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = {"w": rng.standard_normal((6, 4 // group, kernel, kernel)).astype(np.float32)}
    if bias:
        inits["b"] = rng.standard_normal(6).astype(np.float32)
    conv = helper.make_node(
        "Conv", ["x", *inits], ["c"], kernel_shape=[kernel] * 2, strides=[stride] * 2, pads=[pads] * 4, group=group
    )
    relu = helper.make_node("Relu", ["c"], ["y"])
    return model_of([conv, relu], [batch, 4, size, size], inits)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("batch", [2, "batch"])
def test_a_patch_convolution_becomes_one_matrix_product(bias: bool, batch: int | str) -> None:
    original = conv_model(4, 4, bias=bias, batch=batch)
    model = copy(original)
    assert rewrite_patch_convolutions(model) == 1
    ops = Counter(n.op_type for n in model.graph.node)
    assert ops["Conv"] == 0 and ops["MatMul"] == 1
    onnx.checker.check_model(model)
    size = 3 if batch == "batch" else batch  # the rewrite takes any batch size a symbolic batch may have
    x = np.random.default_rng(1).standard_normal((size, 4, 16, 16)).astype(np.float32)
    np.testing.assert_allclose(run(model, x), run(original, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("kernel", "stride", "pads", "group", "size"),
    [(4, 2, 0, 1, 16), (3, 3, 1, 1, 15), (1, 1, 0, 1, 16), (2, 2, 0, 2, 16), (4, 4, 0, 1, 18)],
    ids=["overlapping", "padded", "pointwise", "grouped", "size-not-a-multiple"],
)
def test_other_convolutions_are_left_to_cudnn(kernel: int, stride: int, pads: int, group: int, size: int) -> None:
    model = conv_model(kernel, stride, pads, group, size)
    assert rewrite_patch_convolutions(model) == 0
    assert Counter(n.op_type for n in model.graph.node)["Conv"] == 1


def scaled_projection(scale_shape: tuple[int, ...], read_twice: bool = False) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = {
        "w": rng.standard_normal((8, 6)).astype(np.float32),
        "b": rng.standard_normal(6).astype(np.float32),
        "g": rng.standard_normal(scale_shape).astype(np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["a"]),
        helper.make_node("Mul", ["g", "a"], ["s"]),
        helper.make_node("Add", ["x_proj" if read_twice else "s", "s"] if read_twice else ["s", "s"], ["y"]),
    ]
    if read_twice:  # the projection's output is read by something else as well
        nodes.insert(1, helper.make_node("Relu", ["m"], ["x_proj_pre"]))
        nodes.insert(2, helper.make_node("ReduceSum", ["x_proj_pre"], ["x_proj"], keepdims=1))
    return model_of(nodes, [2, 3, 8], inits)


@pytest.mark.parametrize("scale_shape", [(1, 1, 6), (6,)])
def test_a_layer_scale_is_folded_into_the_projection(scale_shape: tuple[int, ...]) -> None:
    original = scaled_projection(scale_shape)
    model = copy(original)
    assert fold_layer_scales(model) == 1
    assert Counter(n.op_type for n in model.graph.node)["Mul"] == 0
    x = np.random.default_rng(1).standard_normal((2, 3, 8)).astype(np.float32)
    np.testing.assert_allclose(run(model, x), run(original, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("read_twice", [False, True], ids=["scale-along-another-axis", "projection-read-twice"])
def test_a_scale_that_is_not_per_output_channel_is_left(read_twice: bool) -> None:
    model = scaled_projection((3, 1) if not read_twice else (6,), read_twice=read_twice)
    assert fold_layer_scales(model) == 0
    assert Counter(n.op_type for n in model.graph.node)["Mul"] == 1
