"""The fp16 sensitivity ranking: which nodes change the outputs most when their values are rounded to fp16."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from gpt_optuna.core.log import onnxruntime_options
from gpt_optuna.graph.model import Feeds
from gpt_optuna.graph.precision import candidate_nodes, float_tensors, named


def with_switched_fp16_rounding(model: Any, node_names: list[str], floats: set[str]) -> tuple[Any, dict[str, str]]:
    """The model with each named node's float inputs and outputs rounded through fp16 while that
    node's switch is on, and untouched while it is off; the switches are bool scalar inputs, named
    per node in the returned map. One session then measures each node alone in fp16."""
    import onnx
    from onnx import TensorProto, helper

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    switches = {name: f"fp16_switch__{index}" for index, name in enumerate(node_names)}

    def round_trip(source: str, target: str, switch: str) -> list[Any]:
        return [
            helper.make_node("Cast", [source], [target + "_h"], to=TensorProto.FLOAT16),
            helper.make_node("Cast", [target + "_h"], [target + "_r"], to=TensorProto.FLOAT),
            helper.make_node("Where", [switch, target + "_r", source], [target]),
        ]

    nodes = []
    for node in graph.node:
        switch = switches.get(node.name)
        if switch is None:
            nodes.append(node)
            continue
        before, after = [], []
        for position, name in enumerate(node.input):
            if name in floats:
                rounded = f"{name}__fp16_{node.name}"
                if rounded not in node.input:  # an input read twice (Mul(x, x)) is rounded once
                    before += round_trip(name, rounded, switch)
                node.input[position] = rounded
        for position, name in enumerate(node.output):
            if name in floats:
                node.output[position] = f"{name}__raw"
                after += round_trip(f"{name}__raw", name, switch)
        nodes += [*before, node, *after]
    graph.ClearField("node")
    graph.node.extend(nodes)
    graph.input.extend(helper.make_tensor_value_info(s, TensorProto.BOOL, []) for s in switches.values())
    return copy, switches


def ranking_session(model: Any, trial_run: tuple[list[str], Feeds] | None = None) -> Any:
    """A CPU session over ``model``; with a ``trial_run`` (output names, feeds), a GPU session where
    ONNX Runtime's CUDA provider starts here and that run fits in device memory (TF32 off, so that
    fp32 math stays fp32; many times faster on a large model), else the CPU one. The GPU session
    picks convolution algorithms by heuristics (an exhaustive search per convolution costs more
    than it saves over one run per ranked node)."""
    import onnxruntime as ort

    from gpt_optuna.backends.onnxruntime.settings import CUDA, usable_providers

    options = onnxruntime_options(ort)
    data = model.SerializeToString()
    if trial_run is not None and CUDA in usable_providers():
        try:
            cuda = {"use_tf32": "0", "cudnn_conv_algo_search": "HEURISTIC"}
            session = ort.InferenceSession(data, options, providers=[(CUDA, cuda)])
            session.run(*trial_run)
        except Exception:  # out of device memory, say: the CPU does it, slower
            pass
        else:
            if session.get_providers()[:1] == [CUDA]:
                return session
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def _relative_error(outputs: list[np.ndarray], reference: Mapping[str, np.ndarray]) -> float:
    worst = 0.0
    for out, ref in zip(outputs, reference.values(), strict=True):
        out64, ref64 = np.asarray(out, np.float64), np.asarray(ref, np.float64)
        if not np.all(np.isfinite(out64)):
            return float("inf")
        denom = float(np.linalg.norm(ref64)) or 1.0
        worst = max(worst, float(np.linalg.norm(out64 - ref64)) / denom)
    return worst


def _fp16_rounding_error(value: np.ndarray) -> float:
    """How much storing a tensor in fp16 changes it (Inf when it overflows)."""
    value = np.asarray(value, np.float64)
    with np.errstate(over="ignore"):
        rounded = value.astype(np.float16).astype(np.float64)
    if not np.all(np.isfinite(rounded)):
        return float("inf")
    return float(np.linalg.norm(rounded - value) / (np.linalg.norm(value) or 1.0))


def _local_errors(model: Any, nodes: list[Any], floats: set[str], feeds: Feeds) -> dict[str, float]:
    """Per node, the worst fp16 rounding error of its own tensors, from one run exposing them all."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    initializers = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    wanted = sorted({t for n in nodes for t in [*n.input, *n.output] if t in floats and t not in initializers})
    existing = {o.name for o in probe.graph.output}
    probe.graph.output.extend(
        helper.make_tensor_value_info(t, TensorProto.FLOAT, None) for t in wanted if t not in existing
    )
    values = dict(zip(wanted, ranking_session(probe).run(wanted, feeds), strict=True)) | initializers
    return {
        n.name: max((_fp16_rounding_error(values[t]) for t in [*n.input, *n.output] if t in values), default=0.0)
        for n in nodes
    }


def rank_sensitive_nodes(
    model_path: Path,
    feeds: Feeds,
    reference: Mapping[str, np.ndarray],
    limit: int = 48,
    progress: Callable[[int, int], None] = lambda done, total: None,
) -> list[str]:
    """Node names, most sensitive first: the model's output error when that node alone runs in fp16.

    "Alone in fp16" is simulated by rounding the node's float inputs and outputs through fp16
    (overflow becomes Inf), which is what a fp16 kernel reads and writes, in one session where a
    switch per node turns its rounding on. At most ``limit`` nodes are measured that way: those
    whose own tensors fp16 rounding changes most, from one run. ``progress`` is told (nodes ranked,
    nodes to rank) before the first and after each.
    """
    import onnx

    model = named(onnx.load(str(model_path)))
    floats = float_tensors(model)
    nodes = candidate_nodes(model, floats)
    if len(nodes) > limit:
        local = _local_errors(model, nodes, floats, feeds)
        nodes = sorted(nodes, key=lambda n: -local[n.name])[:limit]
    switched, switches = with_switched_fp16_rounding(model, [n.name for n in nodes], floats)
    session = ranking_session(switched, (list(reference), {**feeds, **{s: np.array(False) for s in switches.values()}}))
    scores = []
    progress(0, len(nodes))
    for node in nodes:
        flags = {switch: np.array(name == node.name) for name, switch in switches.items()}
        scores.append((_relative_error(session.run(list(reference), {**feeds, **flags}), reference), node.name))
        progress(len(scores), len(nodes))
    scores.sort(key=lambda s: -s[0])
    return [name for _, name in scores]
