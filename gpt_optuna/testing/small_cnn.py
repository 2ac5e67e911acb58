"""Regenerate small_cnn.onnx, the demo model shipped with the package (python -m gpt_optuna.testing.small_cnn)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def small_cnn(seed: int = 0) -> onnx.ModelProto:
    """Conv-BN-ReLU x3, global pooling and a classifier: 1x3x64x64 -> 1x10."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    channels = [3, 16, 32, 64]
    current = "input"
    for i in range(3):
        cin, cout = channels[i], channels[i + 1]
        w = (rng.standard_normal((cout, cin, 3, 3)) * np.sqrt(2 / (cin * 9))).astype(np.float32)
        inits += [
            numpy_helper.from_array(w, f"conv{i}.w"),
            numpy_helper.from_array(np.zeros(cout, np.float32), f"conv{i}.b"),
            numpy_helper.from_array(rng.uniform(0.5, 1.5, cout).astype(np.float32), f"bn{i}.scale"),
            numpy_helper.from_array(rng.normal(0, 0.1, cout).astype(np.float32), f"bn{i}.bias"),
            numpy_helper.from_array(rng.normal(0, 0.1, cout).astype(np.float32), f"bn{i}.mean"),
            numpy_helper.from_array(rng.uniform(0.5, 1.5, cout).astype(np.float32), f"bn{i}.var"),
        ]
        nodes += [
            helper.make_node(
                "Conv", [current, f"conv{i}.w", f"conv{i}.b"], [f"c{i}"], pads=[1] * 4, strides=[2, 2] if i else [1, 1]
            ),
            helper.make_node(
                "BatchNormalization", [f"c{i}", f"bn{i}.scale", f"bn{i}.bias", f"bn{i}.mean", f"bn{i}.var"], [f"n{i}"]
            ),
            helper.make_node("Relu", [f"n{i}"], [f"r{i}"]),
        ]
        current = f"r{i}"
    fc = (rng.standard_normal((64, 10)) * 0.1).astype(np.float32)
    inits += [numpy_helper.from_array(fc, "fc.w"), numpy_helper.from_array(np.zeros(10, np.float32), "fc.b")]
    nodes += [
        helper.make_node("GlobalAveragePool", [current], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["flat"]),
        helper.make_node("Gemm", ["flat", "fc.w", "fc.b"], ["logits"]),
    ]
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 64, 64])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])
    graph = helper.make_graph(nodes, "small_cnn", [x], [y], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="gpt_optuna")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


if __name__ == "__main__":
    onnx.save(small_cnn(), Path(__file__).parents[1] / "data" / "small_cnn.onnx")
