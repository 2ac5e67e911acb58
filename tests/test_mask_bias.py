"""MultiHeadAttention's key-padding mask given as an attention bias: the same outputs on ONNX
Runtime for any padding, one bias per mask, and nodes it does not fit left as they are."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from gpt_optuna.graph import mask_bias
from gpt_optuna.graph.mask_bias import masks_as_bias

HEADS, HEAD = 2, 4
HIDDEN = HEADS * HEAD


def attention_graph(keys: str = "seq", layers: int = 2, bias: bool = False) -> onnx.ModelProto:
    """``layers`` MultiHeadAttention nodes reading one int32 key-padding mask, their outputs summed."""
    inputs = [
        helper.make_tensor_value_info("q", TensorProto.FLOAT, ["batch", "seq", HIDDEN]),
        helper.make_tensor_value_info("kv", TensorProto.FLOAT, ["batch", keys, HIDDEN]),
        helper.make_tensor_value_info("mask", TensorProto.INT32, ["batch", keys]),
    ]
    extra = [helper.make_tensor_value_info("extra", TensorProto.FLOAT, ["batch", 1, "seq", keys])] if bias else []
    nodes, outputs = [], []
    for layer in range(layers):
        out = f"o{layer}"
        nodes.append(
            helper.make_node(
                "MultiHeadAttention",
                ["q", "kv", "kv", "", "mask", *(["extra"] if bias else [])],
                [out],
                domain="com.microsoft",
                num_heads=HEADS,
                mask_filter_value=-3.4e38,
                name=f"attention{layer}",
            )
        )
        outputs.append(out)
    nodes.append(helper.make_node("Sum", outputs, ["y"]))
    graph = helper.make_graph(
        nodes, "g", inputs + extra, [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", HIDDEN])]
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)], ir_version=10
    )


def run(model: onnx.ModelProto, mask: np.ndarray) -> np.ndarray:
    rng = np.random.default_rng(1)
    batch, keys = mask.shape
    feeds = {
        "q": rng.standard_normal((batch, keys, HIDDEN), np.float32),
        "kv": rng.standard_normal((batch, keys, HIDDEN), np.float32),
        "mask": mask,
    }
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def padded_masks(batch: int = 4, keys: int = 12) -> np.ndarray:
    mask = np.ones((batch, keys), np.int32)
    mask[0, 7:] = 0  # padded right
    mask[1, :3] = 0  # padded left
    mask[2, 1::3] = 0  # holes
    return mask  # the last row full


def test_each_mask_becomes_one_bias_shared_by_its_nodes_with_the_same_outputs() -> None:
    original = attention_graph()
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(original)
    assert masks_as_bias(rewritten) == (2, {})
    onnx.checker.check_model(rewritten, full_check=True)
    attention = [n for n in rewritten.graph.node if n.op_type == "MultiHeadAttention"]
    assert all(n.input[4] == "" and n.input[5] == attention[0].input[5] for n in attention)
    assert Counter(n.op_type for n in rewritten.graph.node)["Expand"] == 1
    mask = padded_masks()
    np.testing.assert_allclose(run(rewritten, mask), run(original, mask), atol=1e-5)


def test_cross_attention_and_a_node_with_a_bias_already_are_left_as_they_are() -> None:
    for model, reason in ((attention_graph(keys="keys"), "one length"), (attention_graph(bias=True), "bias")):
        before = model.SerializeToString()
        changed, skipped = masks_as_bias(model)
        assert changed == 0
        assert reason in skipped["attention0"]
        assert model.SerializeToString() == before


def test_a_bias_that_computes_something_else_is_refused_by_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    made = mask_bias._bias
    monkeypatch.setattr(mask_bias, "_bias", lambda graph, added, mask, neg, dtype: made(graph, added, mask, 0.0, dtype))
    model = attention_graph()
    before = model.SerializeToString()
    changed, skipped = masks_as_bias(model)
    assert changed == 0
    assert "something else" in skipped["attention0"]
    assert model.SerializeToString() == before


def test_a_mask_made_later_in_the_graph_gets_its_bias_after_it() -> None:
    model = attention_graph()
    second = next(n for n in model.graph.node if n.name == "attention1")
    second.input[4] = "mask_again"
    model.graph.node.insert(1, helper.make_node("Identity", ["mask"], ["mask_again"]))
    original = onnx.ModelProto()
    original.CopyFrom(model)
    assert masks_as_bias(model) == (2, {})
    onnx.checker.check_model(model, full_check=True)  # topologically sorted
    assert Counter(n.op_type for n in model.graph.node)["Expand"] == 2
    mask = padded_masks()
    np.testing.assert_allclose(run(model, mask), run(original, mask), atol=1e-5)
