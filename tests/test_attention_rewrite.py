"""The rewrite of exported scaled-dot-product attention for ONNX Runtime's attention fusion, on a
graph in the dynamo exporter's form and on a real encoder, with real ONNX Runtime on the CPU."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import Initializers
from onnx import TensorProto, helper

from gpt_optuna.graph import model as m
from gpt_optuna.graph.attention_rewrite import rewrite_attention
from gpt_optuna.graph.fusion import fused_path
from gpt_optuna.graph.ort_fusion import fuse_transformer

HEADS, HEAD, HIDDEN = 2, 4, 8
NEG = float(np.finfo(np.float32).min)
DIMS = ["batch", "sequence"]


def sdpa_encoder_layer(scale: float | None = None, causal: bool = False, seed: int = 0) -> onnx.ModelProto:
    """One post-norm encoder layer whose attention is torch dynamo's export of
    ``F.scaled_dot_product_attention(q, k, v, attn_mask, scale=scale)`` with a boolean key-padding
    mask (and a causal term where ``causal``)."""
    rng = np.random.default_rng(seed)
    inits = Initializers()
    const, ints = inits.const, inits.ints

    root = np.sqrt(1 / np.sqrt(HEAD) if scale is None else scale).astype(np.float32)
    nodes = [
        helper.make_node(
            "LayerNormalization",
            ["x", const("g0", np.ones(HIDDEN, np.float32)), const("b0", np.zeros(HIDDEN, np.float32))],
            ["ln"],
        ),
        helper.make_node("Shape", ["ln"], ["batch"], start=0, end=1),
        helper.make_node("Shape", ["ln"], ["seq"], start=1, end=2),
        helper.make_node("Concat", ["batch", "seq", ints("minus1", -1), ints("head", HEAD)], ["view_shape"], axis=0),
    ]
    value_info = []
    for p in "qkv":
        w = rng.standard_normal((HIDDEN, HIDDEN)).astype(np.float32) / 3
        nodes += [
            helper.make_node("MatMul", ["ln", const(f"w{p}", w)], [f"mm_{p}"]),
            helper.make_node(
                "Add", [f"mm_{p}", const(f"b{p}", rng.standard_normal(HIDDEN).astype(np.float32))], [f"lin_{p}"]
            ),
            helper.make_node("Reshape", [f"lin_{p}", "view_shape"], [f"view_{p}"], allowzero=1),
            helper.make_node("Transpose", [f"view_{p}"], [f"t_{p}"], perm=[0, 2, 1, 3]),
        ]
        value_info += [
            helper.make_tensor_value_info(f"lin_{p}", TensorProto.FLOAT, [*DIMS, HIDDEN]),
            helper.make_tensor_value_info(f"view_{p}", TensorProto.FLOAT, [*DIMS, HEADS, HEAD]),
        ]
    nodes += [
        # K^T as dynamo writes it: [B*H, S, D] -> [B*H, D, S] -> [B, H, D, S], shapes from K's view
        helper.make_node("Shape", ["view_k"], ["k_shape"]),
        helper.make_node("Gather", ["k_shape", ints("i0", 0)], ["k_b"]),
        helper.make_node("Gather", ["k_shape", ints("i1", 1)], ["k_s"]),
        helper.make_node("Concat", ["minus1", "k_s", "head"], ["merged_shape"], axis=0),
        helper.make_node("Reshape", ["t_k", "merged_shape"], ["k_merged"]),
        helper.make_node("Transpose", ["k_merged"], ["k_swapped"], perm=[0, 2, 1]),
        helper.make_node("Concat", ["k_b", ints("heads", HEADS), "head", "k_s"], ["kt_shape"], axis=0),
        helper.make_node("Reshape", ["k_swapped", "kt_shape"], ["kt"]),
        helper.make_node("Mul", ["t_q", const("root_q", root)], ["q_scaled"]),
        helper.make_node("Mul", ["kt", const("root_k", root)], ["k_scaled"]),
        helper.make_node("MatMul", ["q_scaled", "k_scaled"], ["scores"]),
        # the mask: bool key-padding [B, 1, 1, S] broadcast to [B, 1, S, S]
        helper.make_node("Cast", ["attention_mask"], ["mask_bool"], to=TensorProto.BOOL),
        helper.make_node("Unsqueeze", ["mask_bool", ints("axes12", 1, 2)], ["mask4"]),
        helper.make_node("Concat", ["batch", ints("one", 1), "seq", "seq"], ["mask_shape"], axis=0),
        helper.make_node("Expand", ["mask4", "mask_shape"], ["mask_wide"]),
    ]
    keep = "mask_wide"
    if causal:
        nodes += [
            helper.make_node("Trilu", ["mask_wide"], ["mask_causal"], upper=0),
            helper.make_node("And", ["mask_wide", "mask_causal"], ["keep"]),
        ]
        keep = "keep"
    nodes += [
        helper.make_node("Where", [keep, const("zero", np.float32(0)), const("neg", np.float32(NEG))], ["bias"]),
        helper.make_node("Add", ["scores", "bias"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["p"], axis=-1),
        helper.make_node("IsNaN", ["p"], ["p_nan"]),
        helper.make_node("Where", ["p_nan", "zero", "p"], ["p_safe"]),
        helper.make_node("MatMul", ["p_safe", "t_v"], ["context"]),
        helper.make_node("Transpose", ["context"], ["context_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["context_t", ints("hidden_shape", 0, 0, HIDDEN)], ["context_2d"]),
        helper.make_node(
            "MatMul",
            ["context_2d", const("wo", rng.standard_normal((HIDDEN, HIDDEN)).astype(np.float32) / 3)],
            ["mm_o"],
        ),
        helper.make_node("Add", ["mm_o", const("bo", rng.standard_normal(HIDDEN).astype(np.float32))], ["attn"]),
        helper.make_node("Add", ["attn", "ln"], ["residual"]),
        helper.make_node("LayerNormalization", ["residual", "g0", "b0"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "sdpa",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [*DIMS, HIDDEN]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, DIMS),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [*DIMS, HIDDEN])],
        inits,
        value_info=value_info,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def masks(batch: int = 4, length: int = 9) -> dict[str, np.ndarray]:
    """Key-padding masks padded on the right, on the left, with holes; the last row fully masked."""
    right, left, holes = (np.ones((batch, length), np.int64) for _ in range(3))
    for b in range(batch):
        right[b, length - 2 * b :] = 0
        left[b, : 2 * b] = 0
        holes[b, b::3] = 0
    right[-1] = 0
    return {"right": right, "left": left, "holes": holes}


def run(model: onnx.ModelProto | Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(source, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def layer_feeds(mask: np.ndarray) -> dict[str, np.ndarray]:
    x = np.random.default_rng(1).standard_normal((*mask.shape, HIDDEN)).astype(np.float32)
    return {"x": x, "attention_mask": mask}


def test_a_dynamo_sdpa_block_is_rewritten_into_the_fusable_form_with_the_same_outputs() -> None:
    original = sdpa_encoder_layer()
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(original)
    assert rewrite_attention(rewritten) == (1, {})
    onnx.checker.check_model(rewritten, full_check=True)
    ops = Counter(n.op_type for n in rewritten.graph.node)
    assert ops["IsNaN"] == 0 and ops["Where"] == 0 and ops["Div"] == 1 and ops["Expand"] == 0
    for name, mask in masks().items():
        feeds = layer_feeds(mask)
        np.testing.assert_allclose(run(rewritten, feeds), run(original, feeds), atol=2e-6, err_msg=name)


@pytest.mark.parametrize(("fusion", "op"), [(False, "Attention"), (True, "MultiHeadAttention")])
def test_the_rewritten_block_fuses_and_keeps_outputs_for_any_padding(tmp_path: Path, fusion: bool, op: str) -> None:
    source = tmp_path / "layer.onnx"
    onnx.save(sdpa_encoder_layer(), source)
    counts = fuse_transformer(source, tmp_path / "fused.onnx", multi_head=fusion)
    assert counts[op] == 1
    fused = onnx.load(str(tmp_path / "fused.onnx"))
    assert Counter(n.op_type for n in fused.graph.node)[op] == 1
    for name, mask in masks().items():
        feeds = layer_feeds(mask)
        np.testing.assert_allclose(run(tmp_path / "fused.onnx", feeds), run(source, feeds), atol=1e-5, err_msg=name)


@pytest.mark.parametrize(
    ("layer", "reason"),
    [
        (sdpa_encoder_layer(scale=0.3), "scale"),
        (sdpa_encoder_layer(causal=True), "not a key-padding mask"),
    ],
    ids=["scale", "causal"],
)
def test_attention_that_is_not_exactly_the_pattern_is_left_as_it_is(layer: onnx.ModelProto, reason: str) -> None:
    before = layer.SerializeToString()
    rewritten, skipped = rewrite_attention(layer)
    assert rewritten == 0
    assert reason in skipped["p"]  # the Softmax, by its output where it has no name
    assert layer.SerializeToString() == before


@pytest.fixture(scope="module")
def fused_minilm(minilm_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The registry MiniLM fused both ways, once for this module."""
    info, cache = m.load_model_info(minilm_path), tmp_path_factory.mktemp("models")
    return {f: fused_path(minilm_path, info.sha256, f, cache) for f in ("transformer", "transformer-mha")}


@pytest.mark.slow
@pytest.mark.parametrize(("fusion", "op"), [("transformer", "Attention"), ("transformer-mha", "MultiHeadAttention")])
def test_a_real_dynamo_encoder_fuses_its_attention_and_keeps_outputs_for_any_padding(
    minilm_path: Path, fused_minilm: dict[str, Path], fusion: str, op: str
) -> None:
    ops = Counter(n.op_type for n in onnx.load(str(fused_minilm[fusion])).graph.node)
    assert ops[op] == 6 and ops["Softmax"] == 0
    ids = np.random.default_rng(0).integers(1000, 20000, (3, 24))
    for name, mask in masks(3, 24).items():
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        error = np.abs(run(fused_minilm[fusion], feeds) - run(minilm_path, feeds)).max()
        assert error < 1e-4, (name, error)
