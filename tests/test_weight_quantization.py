"""Per-channel int8 weights made here equal ONNX Runtime's own per-channel quantization, node for
node and byte for byte, on every op type, axis and sharing of weights the transform meets."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

from gpt_optuna.graph.weight_quantization import per_channel_int8, per_channel_weights

OPS = ("MatMul", "Gemm", "Conv", "ConvTranspose")
RNG = np.random.default_rng(0)


def _weights(*shapes: tuple[int, ...]) -> list[np.ndarray]:
    return [RNG.standard_normal(shape).astype(np.float32) for shape in shapes]


def _model(
    nodes: list[onnx.NodeProto],
    weights: dict[str, np.ndarray],
    x: tuple[int, ...],
    dtype: int = TensorProto.FLOAT,
    weights_as_inputs: bool = False,
) -> onnx.ModelProto:
    inputs = [helper.make_tensor_value_info("x", dtype, list(x))]
    if weights_as_inputs:  # as old exporters wrote them (IR version 3)
        inputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(a.shape)) for n, a in weights.items()]
    graph = helper.make_graph(
        nodes,
        "weighted",
        inputs,
        [helper.make_tensor_value_info(nodes[-1].output[0], dtype, None)],
        [numpy_helper.from_array(array, name) for name, array in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    if weights_as_inputs:
        model.ir_version = 3
    return model


def _cases() -> dict[str, tuple[onnx.ModelProto, tuple[int, ...], int]]:
    """{case: (model, input shape, weights turned per channel)}"""
    matmul, gemm_t, gemm, conv, convt = _weights((16, 32), (32, 32), (32, 32), (4, 2, 3, 3), (4, 3, 2, 2))
    matmul[:, 3] = 0.0  # an all-zero output channel
    gemm_t *= 1e-3
    square, one_by_one = _weights((8, 8), (4, 4, 1, 1))
    chain = _model(
        [
            helper.make_node("MatMul", ["x", "W"], ["h"]),
            helper.make_node("Gemm", ["h", "Gt"], ["g1"], transB=1),
            helper.make_node("Gemm", ["g1", "G"], ["g2"]),
            helper.make_node("Gemm", ["g2", "G"], ["g3"]),  # G read twice, on one axis
            helper.make_node("Reshape", ["g3", "shape"], ["r"]),
            helper.make_node("Conv", ["r", "C"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("ConvTranspose", ["c", "T"], ["y"], group=2),
        ],
        {"W": matmul, "Gt": gemm_t, "G": gemm, "C": conv, "T": convt, "shape": np.array([2, 2, 4, 4], np.int64)},
        (2, 16),
    )
    return {
        "MatMul, Gemm with and without transB, Conv, grouped ConvTranspose": (chain, (2, 16), 5),
        "one weight read by Gemm(transB) then MatMul: the last reader's axis": (
            _model(
                [helper.make_node("Gemm", ["x", "S"], ["h"], transB=1), helper.make_node("MatMul", ["h", "S"], ["y"])],
                {"S": square},
                (2, 8),
            ),
            (2, 8),
            1,
        ),
        "one weight read by Conv then ConvTranspose": (
            _model(
                [helper.make_node("Conv", ["x", "K"], ["h"]), helper.make_node("ConvTranspose", ["h", "K"], ["y"])],
                {"K": one_by_one},
                (1, 4, 3, 3),
            ),
            (1, 4, 3, 3),
            1,
        ),
        "a constant first input of MatMul": (
            _model([helper.make_node("MatMul", ["S", "x"], ["y"])], {"S": square}, (8, 4)),
            (8, 4),
            1,
        ),
        "a 1-D MatMul weight stays per tensor": (
            _model([helper.make_node("MatMul", ["x", "v"], ["y"])], {"v": _weights((8,))[0]}, (2, 8)),
            (2, 8),
            0,
        ),
        "weights listed as graph inputs too": (
            _model([helper.make_node("MatMul", ["x", "S"], ["y"])], {"S": square}, (2, 8), weights_as_inputs=True),
            (2, 8),
            1,
        ),
        "fp16 weights": (
            _model(
                [helper.make_node("MatMul", ["x", "S"], ["y"])],
                {"S": square.astype(np.float16)},
                (2, 8),
                dtype=TensorProto.FLOAT16,
            ),
            (2, 8),
            1,
        ),
    }


class _Samples:
    def __init__(self, shape: tuple[int, ...], dtype: type) -> None:
        rng = np.random.default_rng(1)
        self._it = iter([{"x": rng.standard_normal(shape).astype(dtype)} for _ in range(3)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)


def _quantized(source: Path, out: Path, per_channel: bool, shape: tuple[int, ...], dtype: type) -> onnx.ModelProto:
    quantize_static(
        str(source),
        str(out),
        _Samples(shape, dtype),
        quant_format=QuantFormat.QDQ,
        op_types_to_quantize=list(OPS),
        per_channel=per_channel,
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
        calibrate_method=CalibrationMethod.MinMax,
        extra_options={"ActivationSymmetric": True, "WeightSymmetric": True, "QuantizeBias": False},
    )
    return onnx.load(str(out))


def _nodes(model: onnx.ModelProto) -> list[tuple]:
    return [
        (n.name, n.op_type, list(n.input), list(n.output), [helper.get_attribute_value(a) for a in n.attribute])
        for n in model.graph.node
    ]


@pytest.mark.parametrize("case", list(_cases()))
def test_per_channel_weights_are_onnx_runtimes_own(case: str, tmp_path: Path) -> None:
    model, shape, turned = _cases()[case]
    dtype = np.float16 if model.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT16 else np.float32
    source = tmp_path / "model.onnx"
    onnx.save(model, str(source))
    theirs = _quantized(source, tmp_path / "theirs.onnx", True, shape, dtype)
    ours = _quantized(source, tmp_path / "ours.onnx", False, shape, dtype)
    assert per_channel_weights(ours, onnx.load(str(source)), OPS) == turned
    assert _nodes(ours) == _nodes(theirs)
    expected = {i.name: numpy_helper.to_array(i) for i in theirs.graph.initializer}
    made = {i.name: numpy_helper.to_array(i) for i in ours.graph.initializer}
    assert made.keys() == expected.keys()
    for name, array in expected.items():
        assert made[name].dtype == array.dtype and np.array_equal(made[name], array), name


def test_a_weight_quantized_under_unknown_names_is_an_error_not_left_per_tensor(tmp_path: Path) -> None:
    square = _weights((8, 8))[0]
    source = tmp_path / "model.onnx"
    onnx.save(_model([helper.make_node("MatMul", ["x", "S"], ["y"])], {"S": square}, (2, 8)), str(source))
    ours = _quantized(source, tmp_path / "ours.onnx", False, (2, 8), np.float32)
    for init in ours.graph.initializer:
        init.name = init.name.replace("S_quantized", "S_q")
    for node in ours.graph.node:
        node.input[:] = [name.replace("S_quantized", "S_q") for name in node.input]
    with pytest.raises(RuntimeError, match="'S' under names not known here"):
        per_channel_weights(ours, onnx.load(str(source)), OPS)


def test_a_zero_channel_gets_scale_one_and_every_value_fits_symmetric_int8() -> None:
    weight = np.array([[0.0, 2.54, -1.0], [0.0, -0.5, 0.25]], np.float32)
    quantized, scale = per_channel_int8(weight, 1)
    assert scale.tolist() == [1.0, np.float32(2.54 / 127), np.float32(1.0 / 127)]
    assert quantized[:, 0].tolist() == [0, 0] and quantized[0, 1] == 127 and quantized.min() >= -127
