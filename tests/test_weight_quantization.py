"""Per-channel int8 weights made here equal ONNX Runtime's own per-channel quantization, node for
node and byte for byte, on every op type and axis the transform quantizes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

from gpt_optuna.weight_quantization import per_channel_int8, per_channel_weights

OPS = ("MatMul", "Gemm", "Conv", "ConvTranspose")


def weighted_model() -> onnx.ModelProto:
    """MatMul, Gemm with and without transB, Conv and ConvTranspose, one weight read twice, one
    output channel all zeros, one weight far below 1."""
    rng = np.random.default_rng(0)
    matmul = rng.standard_normal((16, 32)).astype(np.float32)
    matmul[:, 3] = 0.0
    weights = {
        "W": matmul,
        "Gt": (rng.standard_normal((32, 32)) * 1e-3).astype(np.float32),
        "G": rng.standard_normal((32, 32)).astype(np.float32),
        "C": rng.standard_normal((4, 2, 3, 3)).astype(np.float32),
        "T": rng.standard_normal((4, 3, 2, 2)).astype(np.float32),
        "shape": np.array([2, 2, 4, 4], np.int64),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"]),
        helper.make_node("Gemm", ["h", "Gt"], ["g1"], transB=1),
        helper.make_node("Gemm", ["g1", "G"], ["g2"]),
        helper.make_node("Gemm", ["g2", "G"], ["g3"]),
        helper.make_node("Reshape", ["g3", "shape"], ["r"]),
        helper.make_node("Conv", ["r", "C"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("ConvTranspose", ["c", "T"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "weighted",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(array, name) for name, array in weights.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


class _Samples:
    def __init__(self) -> None:
        rng = np.random.default_rng(1)
        self._it = iter([{"x": rng.standard_normal((2, 16)).astype(np.float32)} for _ in range(3)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)


def _quantized(source: Path, out: Path, per_channel: bool) -> onnx.ModelProto:
    quantize_static(
        str(source),
        str(out),
        _Samples(),
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


def test_per_channel_weights_are_onnx_runtimes_own(tmp_path: Path) -> None:
    source = tmp_path / "model.onnx"
    onnx.save(weighted_model(), str(source))
    theirs = _quantized(source, tmp_path / "theirs.onnx", per_channel=True)
    ours = _quantized(source, tmp_path / "ours.onnx", per_channel=False)
    assert per_channel_weights(ours, onnx.load(str(source)), OPS) == 5  # W, Gt, G (read twice), C, T
    assert _nodes(ours) == _nodes(theirs)
    expected = {i.name: numpy_helper.to_array(i) for i in theirs.graph.initializer}
    made = {i.name: numpy_helper.to_array(i) for i in ours.graph.initializer}
    assert made.keys() == expected.keys()
    for name, array in expected.items():
        assert made[name].dtype == array.dtype and np.array_equal(made[name], array), name


def test_a_zero_channel_gets_scale_one_and_every_value_fits_symmetric_int8() -> None:
    weight = np.array([[0.0, 2.54, -1.0], [0.0, -0.5, 0.25]], np.float32)
    quantized, scale = per_channel_int8(weight, 1)
    assert scale.tolist() == [1.0, np.float32(2.54 / 127), np.float32(1.0 / 127)]
    assert quantized[:, 0].tolist() == [0, 0] and quantized[0, 1] == 127 and quantized.min() >= -127
