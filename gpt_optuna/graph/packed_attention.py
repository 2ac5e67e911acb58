"""Rewrite attention with one packed input projection into ONNX Runtime's fused attention operator.

``torch.nn.MultiheadAttention`` (vision transformers, torchvision's ViT among them) projects Q, K
and V with one ``[hidden, 3 * hidden]`` matrix and works sequence-first; TorchScript exports it as::

    x2 = Reshape(Transpose[1,0,2](x))                  x: [batch, seq, hidden]
    q, k, v = Gather(0|1|2, Squeeze(Transpose(Reshape(x2 @ W + b))))      each [seq, batch, hidden]
    p = Softmax(MatMul(Mul(Transpose[1,2,0,3](Reshape(q)), c), Mul(Transpose[1,2,3,0](Reshape(k)), c)))
    o = Reshape(Transpose[2,0,1,3](MatMul(p, Transpose[1,2,0,3](Reshape(v)))))
    y = Transpose[1,0,2](Reshape(o @ Wo + bo))                                   [batch, seq, hidden]

(with a dynamic batch, the head split goes through ``[seq, batch * heads, head]`` and the shapes
and the scale are computed in the graph), which ONNX Runtime's attention fusion does not match, so
each head's scores, softmax and layout changes run as kernels of their own. Each such block
becomes ``Attention(x, W, b)`` (or, for ``multi_head``, the projection split into Q, K and V for
``MultiHeadAttention`` with the bias), batch-first, then the output projection
``MatMul(o, Wo) + bo`` where it can be taken in. The match reads the structure loosely (Q, K and
V are layout changes of the projection's three parts; the head count is one of the sizes their
reshapes name); every block is then proven by evaluation: the rewritten block and the original
are run with ONNX Runtime (CPU) on the same random input (a dynamic dim at sizes 2 and 3) and must agree,
at the first head count that does, else the block is left as it is, with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from gpt_optuna.graph.onnx_graph import (
    SHAPE_ONLY,
    GraphIndex,
    attribute,
    disagreement,
    drop_dead,
    elem_type,
    evaluate,
    value_sources,
)

PREFIX = "packed_attention"
MICROSOFT = "com.microsoft"
CHECKED_SIZES = (2, 3)
"""The sizes a dynamic dim of a block's input takes in the checks of its rewrite (the scale too
must come out the same at both)."""
_PASS_THROUGH = ("Squeeze", "Unsqueeze", "Transpose", "Reshape")
"""Layout operators between the packed projection and the Q/K/V gathers."""


@dataclass(frozen=True)
class _Block:
    """One matched attention block: its input, projections, and the tensor the rewrite replaces."""

    x: str  # [batch, seq, hidden_in], or [seq, batch, hidden_in] where ``sequence_first``
    sequence_first: bool
    weight: np.ndarray  # [hidden_in, 3 * hidden], columns Q | K | V
    bias: np.ndarray  # [3 * hidden]
    heads: tuple[int, ...]  # head counts to try, most likely first
    scale: tuple[tuple[str, int], ...]  # the scores' scale: tensors (scalars) and their exponents
    target: str  # what the rewrite computes anew
    output_weight: np.ndarray | None  # [hidden, hidden_out] where the output projection is taken in
    output_bias: np.ndarray | None
    target_shape: str | None  # the Reshape shape of ``target`` where the projection is left


def rewrite_packed_attention(model: onnx.ModelProto, multi_head: bool = False) -> tuple[int, dict[str, str]]:
    """Rewrite ``model``'s packed-projection attention blocks in place; return how many, and why
    each other Softmax was left."""
    graph = GraphIndex(model, PREFIX)
    skipped: dict[str, str] = {}
    rewritten = attempted = 0
    for softmax in [n for n in graph.graph.node if n.op_type == "Softmax"]:
        block = _match(graph, softmax)
        if isinstance(block, _Block):
            attempted += 1
            block = _apply(graph, block, multi_head)
        if isinstance(block, str):
            skipped[softmax.name or softmax.output[0]] = block
        else:
            rewritten += 1
    if attempted:  # what the rewritten blocks replaced, and what a refused rewrite added
        drop_dead(graph.graph)
    return rewritten, skipped


def _match(graph: GraphIndex, softmax: onnx.NodeProto) -> _Block | str:
    """The packed attention block around ``softmax``, or why it is not one."""
    if attribute(softmax, "axis", -1) not in (-1, 3):
        return "softmax is not over the last axis"
    users = graph.consumers[softmax.output[0]]
    if len(users) != 1 or users[0].op_type != "MatMul" or users[0].input[0] != softmax.output[0]:
        return "softmax output is not read by one MatMul(p, v)"
    matmul_v = users[0]
    scores, scale = _unscaled(graph, softmax.input[0])
    matmul_qk = graph.parent(scores, "MatMul")
    if matmul_qk is None:
        return "softmax input is not a scaled MatMul(q, k)"
    q, q_scale = _unscaled(graph, matmul_qk.input[0])
    k, k_scale = _unscaled(graph, matmul_qk.input[1])
    paths = [_head_path(graph, name) for name in (q, k, matmul_v.input[1])]
    if any(path is None for path in paths):
        return "Q, K or V is not a layout change (Transpose, Reshape) of one part of a packed projection"
    gathers = [path[0] for path in paths if path is not None]
    if len({g.input[0] for g in gathers}) != 1:
        return "Q, K and V are not gathered from one packed projection"
    if [graph.scalar(g.input[1]) for g in gathers] != [0, 1, 2]:
        return "Q, K and V are not the packed projection's parts 0, 1 and 2"
    projection = _packed_projection(graph, gathers[0].input[0])
    if isinstance(projection, str):
        return projection
    x, sequence_first, weight, bias = projection
    tail = _tail(graph, matmul_v.output[0])
    if isinstance(tail, str):
        return tail
    hidden = weight.shape[1] // 3
    sizes = {size for path in paths if path is not None for size in path[1]}
    divisors = (h for h in sizes if 1 < h < hidden and hidden % h == 0)
    heads = sorted(divisors, key=lambda h: (hidden // h not in sizes, h))  # head size named too: likelier
    if not heads:
        return "no head count found in the Q/K/V reshapes"
    factors = (*scale, *q_scale, *k_scale)
    return _Block(x, sequence_first, weight, bias, tuple(heads), factors, *tail)


def _unscaled(graph: GraphIndex, name: str) -> tuple[str, tuple[tuple[str, int], ...]]:
    """``name`` without the multiplications (or divisions) by scalars that made it (constants, or
    computed from constants and shapes alone), and those scalars with their exponents."""
    factors: list[tuple[str, int]] = []
    while (node := graph.producer.get(name)) is not None and node.op_type in ("Mul", "Div"):
        first, second = (_is_scalar(graph, i) for i in node.input)
        if node.op_type == "Mul" and first:
            factors.append((node.input[0], 1))
            name = node.input[1]
        elif second:
            factors.append((node.input[1], 1 if node.op_type == "Mul" else -1))
            name = node.input[0]
        else:
            break
    return name, tuple(factors)


def _is_scalar(graph: GraphIndex, name: str) -> bool:
    """Whether ``name`` is one value that depends on no input's values (a constant, or computed
    from constants and shapes)."""
    value = graph.constant(name)
    if value is not None:
        return value.size == 1
    dims = graph.shapes.get(name)
    return dims is not None and all(d == 1 for d in dims) and not value_sources(graph, name)


def _head_path(graph: GraphIndex, name: str) -> tuple[onnx.NodeProto, set[int]] | None:
    """The Gather ``name`` is a layout change of (through Transpose and Reshape nodes), and the
    sizes the reshapes on the way name (constants, or constants their computed shapes are made of)."""
    sizes: set[int] = set()
    node = graph.producer.get(name)
    while node is not None and node.op_type in ("Transpose", "Reshape"):
        if node.op_type == "Reshape":
            sizes |= _sizes(graph, node.input[1])
        node = graph.producer.get(node.input[0])
    return (node, sizes) if node is not None and node.op_type == "Gather" else None


def _sizes(graph: GraphIndex, shape: str, depth: int = 6) -> set[int]:
    """The integer constants a shape tensor is made of, up to ``depth`` nodes back (not through
    the tensors whose shapes it reads)."""
    value = graph.constant(shape)
    if value is not None:
        return {int(v) for v in value.reshape(-1)} if value.dtype.kind in "iu" and value.size <= 8 else set()
    node = graph.producer.get(shape)
    if node is None or depth == 0 or node.op_type in SHAPE_ONLY:
        return set()
    return {size for i in node.input for size in _sizes(graph, i, depth - 1)}


def _packed_projection(graph: GraphIndex, packed: str) -> tuple[str, bool, np.ndarray, np.ndarray] | str:
    """The input ``packed`` is projected from, whether it is sequence-first, and the projection's
    weight [in, 3 * hidden] and bias, through the layout operators between them."""
    node = graph.producer.get(packed)
    while node is not None and node.op_type in _PASS_THROUGH:
        node = graph.producer.get(node.input[0])
    linear = _linear(graph, node)
    if linear is None:
        return "the packed Q/K/V is not one projection x @ W + b by constants"
    source, weight, bias = linear
    if weight.ndim != 2 or weight.shape[1] % 3 or bias.shape != (weight.shape[1],):
        return "the projection's weight is not [in, 3 * hidden] with a bias of 3 * hidden"
    reshape = graph.parent(source, "Reshape")
    if reshape is not None:
        source = reshape.input[0]
    transpose = graph.parent(source, "Transpose", [1, 0, 2])
    return (transpose.input[0], False, weight, bias) if transpose is not None else (source, True, weight, bias)


def _linear(graph: GraphIndex, node: onnx.NodeProto | None) -> tuple[str, np.ndarray, np.ndarray] | None:
    """(input, weight [in, out], bias [out]) of ``Gemm(input, W, b)`` or ``MatMul(input, W) + b`` by constants."""
    if node is not None and node.op_type == "Gemm" and len(node.input) == 3:
        if attribute(node, "transA", 0) or attribute(node, "alpha", 1.0) != 1 or attribute(node, "beta", 1.0) != 1:
            return None
        weight, bias = graph.constant(node.input[1]), graph.constant(node.input[2])
        if weight is None or bias is None:
            return None
        return node.input[0], weight.T if attribute(node, "transB", 0) else weight, bias.reshape(-1)
    if node is not None and node.op_type == "Add":
        matmul = next((graph.parent(i, "MatMul") for i in node.input if graph.parent(i, "MatMul")), None)
        bias = next((graph.constant(i) for i in node.input if graph.constant(i) is not None), None)
        weight = graph.constant(matmul.input[1]) if matmul is not None else None
        if matmul is not None and weight is not None and bias is not None:
            return matmul.input[0], weight, bias.reshape(-1)
    return None


def _tail(graph: GraphIndex, attended: str) -> tuple[str, np.ndarray | None, np.ndarray | None, str | None] | str:
    """What the rewrite replaces after ``attended`` ([batch, heads, seq, head]): the batch-first
    output of the output projection where it is there to take in, else the sequence-first
    [seq * batch, hidden] (or [seq, batch, hidden]) reshape of the heads."""
    transpose = _only_user(graph, attended, "Transpose")
    if transpose is None or attribute(transpose, "perm") != [2, 0, 1, 3]:
        return "the attention output is not permuted back to sequence-first"
    reshape = _only_user(graph, transpose.output[0], "Reshape")
    if reshape is None:
        return "the attention output is not reshaped to [seq, batch, hidden]"
    merged = reshape.output[0]
    node = _only_user(graph, merged, "Gemm") or _only_user(graph, merged, "MatMul")
    if node is not None and node.op_type == "MatMul":
        node = _only_user(graph, node.output[0], "Add")
    linear = _linear(graph, node)
    if node is not None and linear is not None and linear[0] == merged:
        end = node.output[0]
        back = _only_user(graph, end, "Reshape")
        end = back.output[0] if back is not None else end
        batch_first = _only_user(graph, end, "Transpose")
        if batch_first is not None and attribute(batch_first, "perm") == [1, 0, 2]:
            return batch_first.output[0], linear[1], linear[2], None
    return merged, None, None, reshape.input[1]


def _only_user(graph: GraphIndex, name: str, op_type: str) -> onnx.NodeProto | None:
    """The one node reading ``name``, if it is an ``op_type``."""
    users = graph.consumers[name]
    return users[0] if len(users) == 1 and users[0].op_type == op_type else None


def _apply(graph: GraphIndex, block: _Block, multi_head: bool) -> _Block | str:
    """Put the rewritten block in the graph with the first head count at which it computes what
    the original does; else why not."""
    if any(block.target == o.name for o in graph.graph.output):
        return "the block's output is a graph output"
    dtype = helper.tensor_dtype_to_np_dtype(elem_type(graph, block.x))
    feeds = _feeds(graph, block, dtype)
    scales = {_scale(graph, block, feed) for feed in feeds}
    if not feeds or len(scales) != 1 or None in scales:
        return "the block's scale or input is not known well enough to check a rewrite with"
    (scale,) = scales
    assert scale is not None
    reason = ""
    for heads in block.heads:
        reason = _apply_with(graph, block, heads, scale, multi_head, feeds)
        if not reason:
            return block
    return reason


def _apply_with(
    graph: GraphIndex,
    block: _Block,
    heads: int,
    scale: float,
    multi_head: bool,
    feeds: list[dict[str, np.ndarray]],
) -> str:
    """Put the block rewritten with ``heads`` heads in the graph if it computes what the original
    does from each of ``feeds``; else why not."""
    hidden = block.weight.shape[1] // 3
    dtype = feeds[0][block.x].dtype
    nodes: list[onnx.NodeProto] = []
    x = block.x
    if block.sequence_first:
        x = _node(graph, nodes, "Transpose", [x], perm=[1, 0, 2])
    weight = graph.initializer(block.weight.astype(dtype), "qkv_weight")
    bias = graph.initializer(block.bias.astype(dtype), "qkv_bias")
    options = {"domain": MICROSOFT, "num_heads": heads, "scale": scale}
    if multi_head:
        qkv = _node(graph, nodes, "MatMul", [x, weight])
        split = graph.initializer(np.array([hidden] * 3, np.int64), "split")
        names = [graph.name(part) for part in "qkv"]
        nodes.append(helper.make_node("Split", [qkv, split], names, name=graph.name("Split"), axis=-1))
        attended = _node(graph, nodes, "MultiHeadAttention", [*names, bias], **options)
    else:
        attended = _node(graph, nodes, "Attention", [x, weight, bias], **options)
    if block.output_weight is not None and block.output_bias is not None:
        projected = _node(graph, nodes, "MatMul", [attended, graph.initializer(block.output_weight.astype(dtype), "w")])
        out = _node(graph, nodes, "Add", [projected, graph.initializer(block.output_bias.astype(dtype), "b")])
        if block.sequence_first:
            out = _node(graph, nodes, "Transpose", [out], perm=[1, 0, 2])
    else:
        assert block.target_shape is not None
        out = _node(graph, nodes, "Transpose", [attended], perm=[1, 0, 2])
        out = _node(graph, nodes, "Reshape", [out, block.target_shape])
    if not any(o.domain == MICROSOFT for o in graph.model.opset_import):
        graph.model.opset_import.append(helper.make_opsetid(MICROSOFT, 1))
    graph.add(nodes)
    reason = next((r for feed in feeds if (r := disagreement(graph, block.target, out, feed))), None)
    if reason:
        return reason
    position = next(i for i, n in enumerate(graph.graph.node) if block.target in n.output)
    for offset, node in enumerate(nodes):
        graph.graph.node.insert(position + offset, node)
    for user in graph.consumers[block.target]:
        for i, name in enumerate(user.input):
            if name == block.target:
                user.input[i] = out
    return ""


def _node(graph: GraphIndex, nodes: list[onnx.NodeProto], op_type: str, inputs: list[str], **attributes: object) -> str:
    """Append an ``op_type`` node to ``nodes``; return its output's name."""
    domain = str(attributes.pop("domain", ""))
    out = graph.name(op_type)
    nodes.append(helper.make_node(op_type, inputs, [out], name=out, domain=domain, **attributes))
    return out


def _feeds(graph: GraphIndex, block: _Block, dtype: np.dtype) -> list[dict[str, np.ndarray]]:
    """Random inputs of the block: one, or where a dim is dynamic one per size of
    :data:`CHECKED_SIZES`; none without a known rank."""
    dims = graph.shapes.get(block.x)
    if not dims:
        return []
    sizes = CHECKED_SIZES if not all(isinstance(d, int) for d in dims) else CHECKED_SIZES[:1]
    rng = np.random.default_rng(0)
    return [
        {block.x: rng.standard_normal([d if isinstance(d, int) else size for d in dims]).astype(dtype)}
        for size in sizes
    ]


def _scale(graph: GraphIndex, block: _Block, feed: dict[str, np.ndarray]) -> float | None:
    """The product of the block's scale factors, evaluated with ``feed`` (it only reads shapes)."""
    scale = 1.0
    for name, exponent in block.scale:
        value = graph.constant(name)
        value = evaluate(graph, name, feed) if value is None else value
        if value is None or value.size != 1 or not np.isfinite(value).all() or float(value.reshape(())) == 0:
            return None
        scale *= float(value.reshape(())) ** exponent
    return scale
