"""A key-padding mask of MultiHeadAttention given as an attention bias instead.

ONNX Runtime's CUDA ``MultiHeadAttention`` runs a 2-D key-padding mask (``[batch, keys]``, 1 where
a key is valid) only in its unfused path: the scores are materialized, masked and soft-maxed by
kernels of their own. An attention bias ``[batch, 1, queries, keys]`` it runs inside its
memory-efficient (cutlass) kernel. For self-attention (queries and keys of one length) each such
mask becomes, once per mask tensor::

    bias = Expand(Unsqueeze(Where(Cast<bool>(mask), 0, mask_filter_value), [1, 2]),
                  [batch, 1, keys, keys])

fed to every node the mask fed, in place of the mask. Each node is proven before it is changed: the
node with the mask and with the bias run with ONNX Runtime on the CPU on random queries, keys and
values and on masks padded right, left and with holes, and must agree; a node that does not is
left as it is, with the reason. In fp32 a row whose keys are all masked stays uniform, as with the
mask. The filter value is kept within the graph's float type; where an fp32 graph is reduced to
fp16 afterwards, a filter value beyond fp16's range (an exporter's float minimum) is cast to -inf
at run time, and such a row is no longer uniform: the accuracy check on the model's own inputs
judges it.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from gpt_optuna.graph.onnx_graph import GraphIndex, attribute, disagreement, drop_dead, elem_type

PREFIX = "mask_bias"
KEY_PADDING_MASK, ATTENTION_BIAS = 4, 5
"""MultiHeadAttention's inputs: the key-padding mask and the attention bias."""
MASK_FILTER_VALUE = -10000.0
"""ONNX Runtime's default for the value a masked key's score gets."""
CHECK_BATCH, CHECK_KEYS = 3, 16


def masks_as_bias(model: onnx.ModelProto) -> tuple[int, dict[str, str]]:
    """Give ``model``'s MultiHeadAttention key-padding masks as attention biases, in place; return
    how many nodes changed, and why each other node with a mask was left."""
    graph = GraphIndex(model, PREFIX)
    added: list[onnx.NodeProto] = []
    biases: dict[tuple[str, float], str] = {}
    changed, skipped = 0, {}
    for node in list(graph.graph.node):
        if node.op_type != "MultiHeadAttention" or node.domain != "com.microsoft":
            continue
        inputs = list(node.input)
        if len(inputs) <= KEY_PADDING_MASK or not inputs[KEY_PADDING_MASK]:
            continue
        reason = _refusal(graph, inputs)
        if reason is None:
            neg = float(attribute(node, "mask_filter_value", MASK_FILTER_VALUE))
            key = (inputs[KEY_PADDING_MASK], neg)
            bias = biases.get(key) or _bias(graph, added, inputs[KEY_PADDING_MASK], neg, elem_type(graph, inputs[0]))
            reason = _check(graph, node, bias)
            if reason is None:
                biases[key] = bias
                inputs[KEY_PADDING_MASK] = ""
                inputs[ATTENTION_BIAS:] = [bias]
                node.ClearField("input")
                node.input.extend(inputs)
                changed += 1
        if reason is not None:
            skipped[node.name] = reason
    if changed:
        _place(graph.graph, added)
    else:  # the constants the refused biases read
        kept = [t for t in graph.graph.initializer if not t.name.startswith(f"{PREFIX}_")]
        graph.graph.ClearField("initializer")
        graph.graph.initializer.extend(kept)
    return changed, skipped


def _place(graph: onnx.GraphProto, added: list[onnx.NodeProto]) -> None:
    """Put each bias's nodes right before the first node reading that bias (after its mask is
    made); drop those no node reads."""
    made = {o: node for node in added for o in node.output}
    placed: set[int] = set()
    order: list[onnx.NodeProto] = []

    def place(name: str) -> None:
        node = made.get(name)
        if node is None or id(node) in placed:
            return
        placed.add(id(node))
        for read in node.input:
            place(read)
        order.append(node)

    for node in list(graph.node):
        for read in node.input:
            place(read)
        order.append(node)
    graph.ClearField("node")
    graph.node.extend(order)
    drop_dead(graph)


def _refusal(graph: GraphIndex, inputs: list[str]) -> str | None:
    """Why a node's mask cannot be given as a bias; None where it can."""
    if len(inputs) > ATTENTION_BIAS and any(inputs[ATTENTION_BIAS:]):
        return "it has an attention bias or a past state already"
    if len(inputs) < 3 or not inputs[1] or not inputs[2]:
        return "its keys and values are packed into the query"
    shapes = graph.shapes
    query, key, mask = (shapes.get(inputs[i]) for i in (0, 1, KEY_PADDING_MASK))
    if mask is None or len(mask) != 2:
        return "its mask is not a 2-D key-padding mask"
    if query is None or key is None or len(query) != 3 or len(key) != 3:
        return "its queries and keys are not [batch, length, hidden]"
    if query[1] is None or query[1] != key[1] or key[1] != mask[1]:
        return "queries, keys and mask are not known to be of one length (self-attention)"
    return None


def _bias(graph: GraphIndex, added: list[onnx.NodeProto], mask: str, neg: float, dtype: int) -> str:
    """The nodes computing ``mask`` as a ``[batch, 1, keys, keys]`` bias of ``dtype`` (not yet in the graph)."""
    values = helper.tensor_dtype_to_np_dtype(dtype)
    zero = graph.initializer(np.zeros((), values), "zero")
    filtered = graph.initializer(np.array(max(neg, float(np.finfo(values).min)), values), "filter")  # finite
    axes = graph.initializer(np.array([1, 2], np.int64), "axes")
    one = graph.initializer(np.array([1], np.int64), "one")
    valid, rows, wide, dims, batch, keys, size, bias = (
        graph.name(n) for n in ("valid", "rows", "wide", "dims", "batch", "keys", "size", "bias")
    )
    nodes = [
        helper.make_node("Cast", [mask], [valid], to=TensorProto.BOOL),
        helper.make_node("Where", [valid, zero, filtered], [rows]),
        helper.make_node("Unsqueeze", [rows, axes], [wide]),
        helper.make_node("Shape", [mask], [dims]),
        helper.make_node("Slice", [dims, graph.initializer(np.array([0], np.int64), "start"), one], [batch]),
        helper.make_node("Slice", [dims, one, graph.initializer(np.array([2], np.int64), "end")], [keys]),
        helper.make_node("Concat", [batch, one, keys, keys], [size], axis=0),
        helper.make_node("Expand", [wide, size], [bias]),
    ]
    graph.add(nodes)
    added.extend(nodes)
    return bias


def _check(graph: GraphIndex, node: onnx.NodeProto, bias: str) -> str | None:
    """Why ``node`` with ``bias`` in place of its mask computes something else; None where it agrees."""
    inputs = list(node.input)
    trial = helper.make_node(
        node.op_type,
        [*inputs[:KEY_PADDING_MASK], "", bias],
        [graph.name("check")],
        domain=node.domain,
    )
    trial.attribute.extend(node.attribute)
    graph.add([trial])
    feed = _feed(graph, inputs)
    if feed is None:
        return "the sizes of its queries, keys or values are not known"
    return disagreement(graph, node.output[0], trial.output[0], feed)


def _feed(graph: GraphIndex, inputs: list[str]) -> dict[str, np.ndarray] | None:
    """Random queries, keys and values, and masks padded right, left and with holes."""
    shapes = [graph.shapes.get(inputs[i]) or [] for i in range(3)]
    hidden = [shape[2] if len(shape) == 3 else None for shape in shapes]
    if not all(isinstance(h, int) for h in hidden):
        return None
    rng = np.random.default_rng(0)
    values = helper.tensor_dtype_to_np_dtype(elem_type(graph, inputs[0]))
    feed = {
        name: rng.standard_normal((CHECK_BATCH, CHECK_KEYS, size)).astype(values)
        for name, size in zip(inputs[:3], hidden, strict=True)
    }
    mask = np.ones((CHECK_BATCH, CHECK_KEYS), helper.tensor_dtype_to_np_dtype(elem_type(graph, inputs[4])))
    mask[0, 11:] = 0
    mask[1, :5] = 0
    mask[2, 3::4] = 0
    return {**feed, inputs[KEY_PADDING_MASK]: mask}
