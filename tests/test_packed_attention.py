"""The rewrite of packed-projection attention (``nn.MultiheadAttention`` as TorchScript exports it)
into ONNX Runtime's fused operators, checked with real ONNX Runtime on the CPU."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import Initializers
from onnx import TensorProto, helper

from gpt_optuna.graph.ort_fusion import fuse_transformer
from gpt_optuna.graph.packed_attention import rewrite_packed_attention

BATCH, SEQ, HEADS, HEAD = 2, 5, 3, 4
HIDDEN = HEADS * HEAD


def multihead_block(
    parts: tuple[int, int, int] = (0, 1, 2),
    scale: float | None = None,
    batch_first: bool = True,
    layer_norm: bool = False,
    dynamic: bool = False,
    seed: int = 0,
) -> onnx.ModelProto:
    """``y = x + MultiheadAttention(x)`` in TorchScript's export form (``batch_first`` adds the
    transposes around it): one packed Q/K/V projection, the scale split over Q and K; ``parts``
    gathers Q, K and V from those parts of the projection. ``dynamic``: a batch of any size, the
    reshapes' shapes and the scale computed in the graph, as TorchScript writes them then."""
    rng = np.random.default_rng(seed)
    inits = Initializers()
    const, ints = inits.const, inits.ints

    root = np.float32(np.sqrt(1 / np.sqrt(HEAD) if scale is None else scale))
    weight = (rng.standard_normal((HIDDEN, 3 * HIDDEN)) / 3).astype(np.float32)
    out_weight = (rng.standard_normal((HIDDEN, HIDDEN)) / 3).astype(np.float32)
    source = "x"
    nodes = []
    if layer_norm:
        gamma, beta = const("gamma", np.ones(HIDDEN, np.float32)), const("beta", np.zeros(HIDDEN, np.float32))
        nodes.append(helper.make_node("LayerNormalization", ["x", gamma, beta], ["ln"], axis=-1))
        source = "ln"
    if batch_first:
        nodes.append(helper.make_node("Transpose", [source], ["x_sbe"], perm=[1, 0, 2]))
    else:
        nodes.append(helper.make_node("Identity", [source], ["x_sbe"]))

    def shape(name: str, *tail: int, head: tuple[int, ...] = ()) -> str:
        """[*head, seq, batch, *tail]: constant, or (``dynamic``) read from x_sbe's shape."""
        if not dynamic:
            return ints(name, *head, SEQ, BATCH, *tail)
        parts = [ints(f"{name}_head", *head)] if head else []
        nodes.append(helper.make_node("Concat", [*parts, "seq_batch", ints(f"{name}_tail", *tail)], [name], axis=0))
        return name

    nodes.append(helper.make_node("Shape", ["x_sbe"], ["seq_batch"], start=0, end=2))
    nodes += [
        helper.make_node("MatMul", ["x_sbe", const("w_in", weight)], ["proj"]),
        helper.make_node("Add", ["proj", const("b_in", rng.standard_normal(3 * HIDDEN).astype(np.float32))], ["qkv"]),
        helper.make_node("Reshape", ["qkv", shape("unflat", 3, HIDDEN, head=(1,))], ["qkv5"]),
        helper.make_node("Transpose", ["qkv5"], ["qkv_t"], perm=[3, 1, 2, 0, 4]),
        helper.make_node("Squeeze", ["qkv_t", ints("axis3", 3)], ["packed"]),
    ]
    for name, index, perm in (
        ("q", parts[0], [1, 2, 0, 3]),
        ("k", parts[1], [1, 2, 3, 0]),
        ("v", parts[2], [1, 2, 0, 3]),
    ):
        nodes += [
            helper.make_node(
                "Gather", ["packed", const(f"i_{name}", np.array(index, np.int64))], [f"{name}_sbe"], axis=0
            ),
            helper.make_node("Reshape", [f"{name}_sbe", shape(f"heads_{name}", HEADS, HEAD)], [f"{name}4"]),
            helper.make_node("Transpose", [f"{name}4"], [f"{name}_t"], perm=perm),
        ]
    if dynamic:  # sqrt(1 / sqrt(head)) from Q's shape, computed at run time
        nodes += [
            helper.make_node("Shape", ["q_t"], ["q_shape"], start=-1),
            helper.make_node("Cast", ["q_shape"], ["head_f"], to=TensorProto.FLOAT),
            helper.make_node("Sqrt", ["head_f"], ["root_head"]),
            helper.make_node("Div", [const("one", np.array(1.0, np.float32)), "root_head"], ["inverse"]),
            helper.make_node("Sqrt", ["inverse"], ["cq"]),
            helper.make_node("Identity", ["cq"], ["ck"]),
        ]
    else:
        const("cq", np.array([root], np.float32))
        const("ck", np.array([root], np.float32))
    nodes += [
        helper.make_node("Mul", ["q_t", "cq"], ["q_s"]),
        helper.make_node("Mul", ["k_t", "ck"], ["k_s"]),
        helper.make_node("MatMul", ["q_s", "k_s"], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v_t"], ["attended"]),
        helper.make_node("Transpose", ["attended"], ["attended_s"], perm=[2, 0, 1, 3]),
        helper.make_node("Reshape", ["attended_s", ints("merge", -1 if dynamic else SEQ * BATCH, HIDDEN)], ["merged"]),
        helper.make_node(
            "Gemm",
            ["merged", const("w_out", out_weight), const("b_out", np.full(HIDDEN, 0.1, np.float32))],
            ["out2"],
            transB=1,
        ),
        helper.make_node("Reshape", ["out2", shape("back", HIDDEN)], ["out_sbe"]),
    ]
    if batch_first:
        nodes.append(helper.make_node("Transpose", ["out_sbe"], ["out"], perm=[1, 0, 2]))
    else:
        nodes.append(helper.make_node("Identity", ["out_sbe"], ["out"]))
    nodes.append(helper.make_node("Add", ["x", "out"], ["y"]))
    batch: int | str = "batch" if dynamic else BATCH
    dims = [batch, SEQ, HIDDEN] if batch_first else [SEQ, batch, HIDDEN]
    graph = helper.make_graph(
        nodes,
        "multihead",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def inputs(model: onnx.ModelProto) -> np.ndarray:
    dims = [d.dim_value or 3 for d in model.graph.input[0].type.tensor_type.shape.dim]  # a dynamic batch of 3
    return np.random.default_rng(1).standard_normal(dims).astype(np.float32)


@pytest.mark.parametrize("multi_head", [False, True])
@pytest.mark.parametrize("batch_first", [True, False])
def test_a_packed_block_becomes_one_fused_operator_that_computes_the_same(multi_head: bool, batch_first: bool) -> None:
    original = multihead_block(batch_first=batch_first)
    model = onnx.ModelProto()
    model.CopyFrom(original)
    assert rewrite_packed_attention(model, multi_head) == (1, {})
    ops = Counter(n.op_type for n in model.graph.node)
    fused = "MultiHeadAttention" if multi_head else "Attention"
    assert ops[fused] == 1 and ops["Softmax"] == 0 and ops["Gather"] == 0
    attention = next(n for n in model.graph.node if n.op_type == fused)
    assert attention.domain == "com.microsoft"
    assert {a.name: helper.get_attribute_value(a) for a in attention.attribute}["num_heads"] == HEADS
    onnx.checker.check_model(model)
    x = inputs(original)
    np.testing.assert_allclose(run(model, x), run(original, x), rtol=1e-5, atol=1e-5)


def test_a_scale_of_its_own_is_kept() -> None:
    original = multihead_block(scale=0.3)
    model = onnx.ModelProto()
    model.CopyFrom(original)
    assert rewrite_packed_attention(model)[0] == 1
    attention = next(n for n in model.graph.node if n.op_type == "Attention")
    scale = {a.name: helper.get_attribute_value(a) for a in attention.attribute}["scale"]
    assert scale == pytest.approx(0.3, rel=1e-6)
    x = inputs(original)
    np.testing.assert_allclose(run(model, x), run(original, x), rtol=1e-5, atol=1e-5)


def test_a_block_that_computes_something_else_is_left_with_the_reason() -> None:
    swapped = multihead_block(parts=(1, 0, 2))  # Q from K's columns: not the fused operator's layout
    count, skipped = rewrite_packed_attention(swapped)
    assert count == 0
    assert list(skipped.values()) == ["Q, K and V are not the packed projection's parts 0, 1 and 2"]
    assert Counter(n.op_type for n in swapped.graph.node)["Softmax"] == 1


def test_the_rewrite_is_refused_where_evaluation_disagrees(monkeypatch: pytest.MonkeyPatch) -> None:
    """The proof by evaluation is what decides: a rewrite built wrong (here: the heads' count off
    by a factor) is found out and the block left as it was."""
    import gpt_optuna.graph.packed_attention as packed

    real = packed._match

    def wrong_heads(graph: object, softmax: onnx.NodeProto) -> object:
        block = real(graph, softmax)  # type: ignore[arg-type]
        return packed._Block(**{**block.__dict__, "heads": (1,)}) if isinstance(block, packed._Block) else block

    monkeypatch.setattr(packed, "_match", wrong_heads)
    original = multihead_block()
    model = onnx.ModelProto()
    model.CopyFrom(original)
    count, skipped = rewrite_packed_attention(model)
    assert count == 0
    assert "computes something else" in next(iter(skipped.values()))
    x = inputs(original)
    np.testing.assert_array_equal(run(model, x), run(original, x))


def test_the_transformer_fusion_fuses_a_packed_encoder_block(tmp_path: Path) -> None:
    original = multihead_block(layer_norm=True)
    source = tmp_path / "block.onnx"
    onnx.save(original, str(source))
    counts = fuse_transformer(source, tmp_path / "fused.onnx", multi_head=True)
    assert counts.get("MultiHeadAttention") == 1
    fused = onnx.load(str(tmp_path / "fused.onnx"))
    x = inputs(original)
    np.testing.assert_allclose(run(fused, x), run(original, x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("multi_head", [False, True])
def test_a_dynamic_batch_block_with_shapes_and_scale_computed_at_run_time_is_rewritten(multi_head: bool) -> None:
    """The head count is read from the sizes the computed shapes name, the scale evaluated, and
    the check runs at a batch size of its own: the rewrite holds at another."""
    original = multihead_block(dynamic=True)
    model = onnx.ModelProto()
    model.CopyFrom(original)
    assert rewrite_packed_attention(model, multi_head) == (1, {})
    attention = next(n for n in model.graph.node if n.op_type in ("Attention", "MultiHeadAttention"))
    attributes = {a.name: helper.get_attribute_value(a) for a in attention.attribute}
    assert attributes["num_heads"] == HEADS and attributes["scale"] == pytest.approx(1 / np.sqrt(HEAD), rel=1e-6)
    x = inputs(original)  # batch 3
    np.testing.assert_allclose(run(model, x), run(original, x), rtol=1e-5, atol=1e-5)
