"""A model whose size is its weights: x[1, n] @ W[n, n] -> Relu, with W as large as asked, for
faults that need a large file (a kill during its export, its external weights moved)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def wide_matmul(megabytes: float) -> onnx.ModelProto:
    """The model with a float32 weight of about ``megabytes`` MB (seeded)."""
    n = max(8, int((megabytes * 1e6 / 4) ** 0.5))
    weight = (np.random.default_rng(0).standard_normal((n, n)) / np.sqrt(n)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "wide_matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
        [numpy_helper.from_array(weight, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def save_wide_matmul(path: Path, megabytes: float, weights: str | None = None) -> Path:
    """:func:`wide_matmul` at ``path``; its weight in the file ``weights`` beside it where given."""
    onnx.save(wide_matmul(megabytes), str(path), save_as_external_data=weights is not None, location=weights)
    return path
