"""Rewrite exported scaled-dot-product attention into the form ONNX Runtime's attention fusion recognises.

torch's dynamo exporter writes ``F.scaled_dot_product_attention`` with a key-padding mask as::

    q = Transpose[0,2,1,3](Reshape(x_q))                        x_q: [batch, seq, heads * head]
    k = Reshape(Transpose[0,2,1](Reshape(Transpose[0,2,1,3](k4))))    k4 = Reshape(x_k)
    p = Softmax(Add(MatMul(Mul(q, c), Mul(k, c)), Where(key_is_valid, 0, NEG)))
    o = MatMul(Where(IsNaN(p), 0, p), Transpose[0,2,1,3](Reshape(x_v)))

which ONNX Runtime's ``fusion_attention`` does not match. Each such block becomes the classic
BERT form it does match::

    s = Div(MatMul(q, Transpose[0,2,3,1](k4)), 1 / c**2)
    p = Softmax(Add(s, Mul(Sub(1, Cast(Unsqueeze(Unsqueeze(Cast<bool>(mask_input), 1), 2))), NEG)))
    o = MatMul(p, Transpose[0,2,1,3](Reshape(x_v)))

with the Q/K/V Reshape shapes made the constant ``[0, 0, heads, head]`` the fusion reads the head
count from. The function stays the same for finite inputs: NEG is the exported value (a fully
masked row stays uniform), the old mask is checked with ONNX Runtime to be exactly that
key-padding mask of one graph input, the reshapes are proven by shape inference (K's chain by
evaluating it), and a scale other than the fused operator's 1/sqrt(head) is refused. A block that
does not match exactly is left as it is, with the reason.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

from gpt_optuna.graph.onnx_graph import GraphIndex, attribute, drop_dead, elem_type, evaluate, subgraph, value_sources

PREFIX = "sdpa_rewrite"


@dataclass(frozen=True)
class _Block:
    """One matched attention block."""

    add: onnx.NodeProto  # Add(scores, mask) before the Softmax
    mask: str
    neg: np.ndarray  # the exported mask value, a scalar of the scores' type
    q: str  # [batch, heads, seq, head]
    k4: str  # [batch, seq, heads, head]
    reshapes: tuple[onnx.NodeProto, ...]  # Q, K, V projections to [batch, seq, heads, head]
    heads: int
    head: int
    scale: float
    p_consumer: onnx.NodeProto | None  # MatMul(p, v) reading the NaN guard, or None without one
    p: str


def rewrite_attention(model: onnx.ModelProto) -> tuple[int, dict[str, str]]:
    """Rewrite ``model``'s attention blocks in place; return how many, and why each other Softmax was left."""
    graph = GraphIndex(model, PREFIX)
    blocks: list[_Block] = []
    skipped: dict[str, str] = {}
    masks: dict[str, str | None] = {}  # mask tensor -> its key-padding graph input, or None
    for softmax in [n for n in graph.graph.node if n.op_type == "Softmax"]:
        block = _match(graph, softmax)
        if isinstance(block, _Block) and block.mask not in masks:
            masks[block.mask] = _key_padding_input(graph, block.mask, block.neg)
        if isinstance(block, _Block) and masks[block.mask] is None:
            block = f"the mask {block.mask} is not a key-padding mask of one graph input"
        if isinstance(block, str):
            skipped[softmax.name or softmax.output[0]] = block
        else:
            blocks.append(block)
    if blocks:
        _apply(graph, blocks, {mask: name for mask, name in masks.items() if name is not None})
    return len(blocks), skipped


def _match(graph: GraphIndex, softmax: onnx.NodeProto) -> _Block | str:
    """The attention block around ``softmax``, or why it is not one."""
    if attribute(softmax, "axis", -1) not in (-1, 3):
        return "softmax is not over the last axis"
    p, guard = softmax.output[0], None
    users = graph.consumers[p]
    if sorted(u.op_type for u in users) == ["IsNaN", "Where"]:  # Where(IsNaN(p), 0, p)
        isnan, where = sorted(users, key=lambda u: u.op_type)
        if where.input[0] != isnan.output[0] or where.input[2] != p or graph.scalar(where.input[1]) != 0.0:
            return "unexpected NaN guard"
        guard = where.output[0]
        users = graph.consumers[guard]
    if len(users) != 1 or users[0].op_type != "MatMul" or users[0].input[0] != (guard or p):
        return "softmax output is not read by one MatMul(p, v)"
    matmul_v = users[0]
    add = graph.parent(softmax.input[0], "Add")
    if add is None:
        return "softmax input is not Add(scores, mask)"
    matmul_qk = next((graph.parent(i, "MatMul") for i in add.input if graph.parent(i, "MatMul")), None)
    if matmul_qk is None:
        return "softmax input is not Add(MatMul(q, k), mask)"
    mask = add.input[1] if add.input[0] == matmul_qk.output[0] else add.input[0]
    neg = _mask_value(graph, mask)
    if neg is None:
        return "mask is not Where(cond, 0, NEG)"
    q, q_scale = _unscaled(graph, matmul_qk.input[0])
    k, k_scale = _unscaled(graph, matmul_qk.input[1])
    q_transpose = graph.parent(q, "Transpose", [0, 2, 1, 3])
    v_transpose = graph.parent(matmul_v.input[1], "Transpose", [0, 2, 1, 3])
    if q_transpose is None or v_transpose is None:
        return "Q or V is not Transpose[0,2,1,3] of [batch, seq, heads, head]"
    k4 = _k_source(graph, k)
    if k4 is None:
        return "K is not [batch, seq, heads, head] permuted to [batch, heads, head, seq]"
    found = [graph.parent(name, "Reshape") for name in (q_transpose.input[0], k4, v_transpose.input[0])]
    reshapes = tuple(r for r in found if r is not None)
    geometry = {_heads(graph, r) for r in reshapes}
    if len(reshapes) != 3 or len(geometry) != 1 or None in geometry:
        return "Q/K/V are not proven reshapes of [batch, seq, hidden] to one [batch, seq, heads, head]"
    ((heads, head),) = geometry
    if k4 != k and not _evaluates_to_permutation(graph, k4, k, (2, 3, heads, head)):
        return "K's reshape chain is not proven a [0,2,3,1] permutation"
    scale = q_scale * k_scale
    if not np.isclose(scale, 1 / np.sqrt(head), rtol=1e-6, atol=0):
        return f"scale {scale:g} is not the fused operator's 1/sqrt({head})"
    consumer = matmul_v if guard is not None else None
    return _Block(add, mask, neg, q_transpose.output[0], k4, reshapes, heads, head, scale, consumer, p)


def _mask_value(graph: GraphIndex, mask: str) -> np.ndarray | None:
    """NEG of ``mask = Where(cond, 0, NEG)``, a finite negative scalar."""
    where = graph.parent(mask, "Where")
    if where is None or graph.scalar(where.input[1]) != 0.0:
        return None
    neg = graph.constant(where.input[2])
    if neg is None or neg.size != 1 or neg.dtype.kind != "f" or not (np.isfinite(neg) & (neg < 0)).all():
        return None
    return neg.reshape(())


def _unscaled(graph: GraphIndex, name: str) -> tuple[str, float]:
    """``x`` and ``c`` where ``name`` is Mul(x, c) or Div(x, 1/c) of a constant scalar, else (name, 1)."""
    node = graph.producer.get(name)
    if node is not None and node.op_type == "Mul":
        for x, c in (node.input, reversed(node.input)):
            value = graph.scalar(c)
            if value is not None:
                return x, value
    if node is not None and node.op_type == "Div":
        value = graph.scalar(node.input[1])
        if value:
            return node.input[0], 1 / value
    return name, 1.0


def _k_source(graph: GraphIndex, k: str) -> str | None:
    """The [batch, seq, heads, head] tensor that ``k`` permutes by [0,2,3,1]: one Transpose, two,
    or dynamo's Reshape(Transpose[0,2,1](Reshape(Transpose[0,2,1,3](k4)))) (checked by the caller)."""
    if (t := graph.parent(k, "Transpose", [0, 2, 3, 1])) is not None:
        return t.input[0]
    if (t := graph.parent(k, "Transpose", [0, 1, 3, 2])) is not None:
        inner = graph.parent(t.input[0], "Transpose", [0, 2, 1, 3])
        return None if inner is None else inner.input[0]
    outer = graph.parent(k, "Reshape")
    swap = outer and graph.parent(outer.input[0], "Transpose", [0, 2, 1])
    merge = swap and graph.parent(swap.input[0], "Reshape")
    heads_first = merge and graph.parent(merge.input[0], "Transpose", [0, 2, 1, 3])
    return heads_first.input[0] if heads_first else None


def _heads(graph: GraphIndex, reshape: onnx.NodeProto) -> tuple[int, int] | None:
    """(heads, head) where shape inference proves ``reshape`` maps [b, s, heads*head] to [b, s, heads, head]."""
    source, result = graph.shapes.get(reshape.input[0]), graph.shapes.get(reshape.output[0])
    if source is None or result is None or len(source) != 3 or len(result) != 4 or None in result:
        return None
    b, s, hidden = source
    heads, head = result[2:]
    if result[:2] != [b, s] or not isinstance(heads, int) or not isinstance(head, int) or hidden != heads * head:
        return None
    return heads, head


def _evaluates_to_permutation(graph: GraphIndex, k4: str, k: str, shape: tuple[int, ...]) -> bool:
    """Whether ``k`` computed from ``k4`` alone is ``k4`` transposed by [0,2,3,1] (checked on one tensor)."""
    dtype = helper.tensor_dtype_to_np_dtype(elem_type(graph, k4))
    source = np.arange(np.prod(shape)).reshape(shape).astype(dtype)
    got = evaluate(graph, k, {k4: source})
    return got is not None and np.array_equal(got, source.transpose(0, 2, 3, 1))


def _key_padding_input(graph: GraphIndex, mask: str, neg: np.ndarray) -> str | None:
    """The graph input ``mask`` is ``where(input[:, None, None, :] != 0, 0, neg)`` of, checked with
    ONNX Runtime on masks padded right, left, with holes, full and empty; None if it is not."""
    sources = value_sources(graph, mask)
    if len(sources) != 1:
        return None
    (name,) = sources
    tensor = graph.inputs[name].type.tensor_type
    if len(tensor.shape.dim) != 2 or helper.tensor_dtype_to_np_dtype(tensor.elem_type).kind not in "biu":
        return None
    sizes = [d.dim_value or default for d, default in zip(tensor.shape.dim, (4, 7), strict=True)]
    rows = _mask_rows(sizes[1])
    for start in range(0, len(rows), sizes[0]):
        batch = np.ones(sizes, helper.tensor_dtype_to_np_dtype(tensor.elem_type))
        chunk = rows[start : start + sizes[0]]
        batch[: len(chunk)] = chunk
        got = evaluate(graph, mask, _feeds(graph, mask, name, batch))
        want = np.where(batch[:, None, None, :] != 0, np.zeros((), neg.dtype), neg)
        if got is None or got.dtype != want.dtype or got.ndim > 4:
            return None
        try:
            common = np.broadcast_shapes(got.shape, want.shape)
        except ValueError:
            return None
        if not np.array_equal(np.broadcast_to(got, common), np.broadcast_to(want, common)):
            return None
    return name


def _mask_rows(length: int) -> np.ndarray:
    """Key-padding masks of one length: full, padded right, padded left, with holes, empty."""
    position = np.arange(length)
    half = max(length // 2, 1)
    return np.stack([position >= 0, position < half, position >= length - half, position % 3 != 1, position < 0])


def _feeds(graph: GraphIndex, target: str, mask_input: str, mask: np.ndarray) -> dict[str, np.ndarray]:
    """``mask`` for the mask input, and plausible values (ones, zeros) of consistent sizes for the
    other graph inputs ``target`` needs (the caller made sure only their shapes matter)."""
    named = {
        d.dim_param: size
        for d, size in zip(graph.inputs[mask_input].type.tensor_type.shape.dim, mask.shape, strict=True)
    }
    feeds = {mask_input: mask}
    for name in subgraph(graph, target, set())[2] - {mask_input}:
        tensor = graph.inputs[name].type.tensor_type
        sizes = [
            d.dim_value or named.get(d.dim_param) or (mask.shape[i] if i < 2 else 1)
            for i, d in enumerate(tensor.shape.dim)
        ]
        dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        feeds[name] = (np.zeros if dtype.kind == "f" else np.ones)(sizes, dtype)
    return feeds


def _apply(graph: GraphIndex, blocks: list[_Block], mask_inputs: dict[str, str]) -> None:
    """Rewrite ``blocks``: new nodes go right before the Add they feed; what they replace is left
    to :func:`drop_dead`."""
    before: dict[int, list[onnx.NodeProto]] = defaultdict(list)
    new_masks: dict[str, str] = {}
    for block in blocks:
        added = before[id(block.add)]
        if block.mask not in new_masks:
            new_masks[block.mask] = _add_mask(graph, mask_inputs[block.mask], block.neg, added)
        shape = graph.initializer(np.array([0, 0, block.heads, block.head], np.int64), "qkv_shape")
        for reshape in block.reshapes:
            reshape.input[1] = shape
            for allowzero in [a for a in reshape.attribute if a.name == "allowzero"]:
                reshape.attribute.remove(allowzero)
        k, scores, scaled = graph.name("k"), graph.name("scores"), graph.name("scaled")
        inverse = graph.initializer(np.array(1 / block.scale, block.neg.dtype), "inverse_scale")
        added += [
            helper.make_node("Transpose", [block.k4], [k], name=k, perm=[0, 2, 3, 1]),
            helper.make_node("MatMul", [block.q, k], [scores], name=scores),
            # Div, not Mul: the fusion's mask matcher takes the Add's first Mul parent
            helper.make_node("Div", [scores, inverse], [scaled], name=scaled),
        ]
        block.add.input[0], block.add.input[1] = scaled, new_masks[block.mask]
        if block.p_consumer is not None:
            block.p_consumer.input[0] = block.p  # the NaN guard never fires with a finite mask
    nodes = [new for node in graph.graph.node for new in (*before.get(id(node), ()), node)]
    graph.graph.ClearField("node")
    graph.graph.node.extend(nodes)
    drop_dead(graph.graph)


def _add_mask(graph: GraphIndex, mask_input: str, neg: np.ndarray, nodes: list[onnx.NodeProto]) -> str:
    """Append the BERT-form additive mask ``(1 - float(bool(mask_input)))[:, None, None, :] * neg``."""
    names = [graph.name(step) for step in ("mask_bool", "mask_unsqueeze", "mask_unsqueeze", "mask_cast", "mask_sub")]
    out = graph.name("mask")
    axis1 = graph.initializer(np.array([1], np.int64), "axis")
    axis2 = graph.initializer(np.array([2], np.int64), "axis")
    one = graph.initializer(np.array(1, neg.dtype), "one")
    to = helper.np_dtype_to_tensor_dtype(neg.dtype)
    nodes += [
        helper.make_node("Cast", [mask_input], [names[0]], name=names[0], to=TensorProto.BOOL),
        helper.make_node("Unsqueeze", [names[0], axis1], [names[1]], name=names[1]),
        helper.make_node("Unsqueeze", [names[1], axis2], [names[2]], name=names[2]),
        helper.make_node("Cast", [names[2]], [names[3]], name=names[3], to=to),
        helper.make_node("Sub", [one, names[3]], [names[4]], name=names[4]),
        helper.make_node("Mul", [names[4], graph.initializer(neg.copy(), "mask_value")], [out], name=out),
    ]
    return out
