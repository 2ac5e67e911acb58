"""A model made slower without changing its outputs: extra work whose result is multiplied by zero."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper


def slowed(model: onnx.ModelProto, channels: int, layers: int = 0) -> onnx.ModelProto:
    """``model`` with a convolution of its first input (``channels`` filters, 7x7) and ``layers``
    more (``channels`` to ``channels``, 3x3) computed, its largest value (a sum could overflow in
    fp16) multiplied by zero and added to its first output: the same outputs, more time."""
    slow = onnx.ModelProto()
    slow.CopyFrom(model)
    graph = slow.graph
    source = graph.input[0]
    depth = source.type.tensor_type.shape.dim[1].dim_value
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal((channels, depth, 7, 7)).astype(np.float32)]
    weights += [rng.standard_normal((channels, channels, 3, 3)).astype(np.float32) for _ in range(layers)]
    graph.initializer.extend(numpy_helper.from_array(w, f"extra.w{i}") for i, w in enumerate(weights))
    graph.initializer.append(numpy_helper.from_array(np.zeros((), np.float32), "extra.zero"))
    output = graph.output[0].name
    for node in graph.node:
        node.output[:] = [f"{output}.before" if o == output else o for o in node.output]
    work = source.name
    for index, weight in enumerate(weights):
        pad = weight.shape[-1] // 2
        graph.node.append(helper.make_node("Conv", [work, f"extra.w{index}"], [f"extra.{index}"], pads=[pad] * 4))
        work = f"extra.{index}"
    graph.node.extend(
        [
            helper.make_node("ReduceMax", [work], ["extra.max"], keepdims=0),
            helper.make_node("Mul", ["extra.max", "extra.zero"], ["extra.nothing"]),
            helper.make_node("Add", [f"{output}.before", "extra.nothing"], [output]),
        ]
    )
    onnx.checker.check_model(slow, full_check=True)
    return slow
