"""What a model is made of, to judge how much a study of another model says about this one: its
compute operators by type and its parameter count, and a similarity of two such profiles."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpt_optuna.graph.model import every_node

STRUCTURAL_OPS = frozenset(
    {
        "Cast",
        "Concat",
        "Constant",
        "ConstantOfShape",
        "Dropout",
        "Equal",
        "Expand",
        "Flatten",
        "Gather",
        "Identity",
        "Range",
        "Reshape",
        "Shape",
        "Slice",
        "Split",
        "Squeeze",
        "Transpose",
        "Unsqueeze",
        "Where",
    }
)
"""Operators that move, shape or select data: an exporter's style more than the model's work."""
GROUPED_CONV = "Conv(grouped)"
"""Grouped (e.g. depthwise) convolutions, counted apart: other kernels, another layout question."""
SIZE_EXPONENT = 0.25
"""How much a difference in size counts: 10x the parameters keeps 0.56 of the similarity."""


@dataclass(frozen=True)
class ModelProfile:
    """A model's compute operators by type (structural ones left out, grouped convolutions apart),
    subgraphs included, and its parameter count (initializers and constant tensors)."""

    ops: Mapping[str, int]
    parameters: int

    def to_record(self) -> dict[str, Any]:
        return {"ops": dict(sorted(self.ops.items())), "parameters": self.parameters}

    @classmethod
    def from_record(cls, record: Mapping[str, Any] | None) -> ModelProfile | None:
        if not record:
            return None
        return cls({str(k): int(v) for k, v in record["ops"].items()}, int(record["parameters"]))


def profile_of(path: Path) -> ModelProfile:
    """The profile of the ONNX file at ``path`` (external weights are counted, not read)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    ops: Counter[str] = Counter()
    parameters = sum(math.prod(t.dims) for t in model.graph.initializer)
    for node in every_node(model.graph):
        if node.op_type == "Constant":
            parameters += sum(math.prod(a.t.dims) for a in node.attribute if a.name == "value")
        if node.op_type not in STRUCTURAL_OPS:
            grouped = node.op_type == "Conv" and any(a.name == "group" and a.i > 1 for a in node.attribute)
            ops[GROUPED_CONV if grouped else node.op_type] += 1
    return ModelProfile(dict(ops), parameters)


def similarity(a: ModelProfile, b: ModelProfile) -> float:
    """From 0 (nothing in common) to 1 (the same mix and size): the cosine of the two operator
    mixes (square roots of the counts, so that a few kinds repeated many times do not decide alone)
    times the ratio of the smaller parameter count to the larger, to the :data:`SIZE_EXPONENT`."""
    kinds = sorted(set(a.ops) | set(b.ops))
    x = [math.sqrt(a.ops.get(k, 0)) for k in kinds]
    y = [math.sqrt(b.ops.get(k, 0)) for k in kinds]
    norms = math.hypot(*x) * math.hypot(*y)
    mix = sum(p * q for p, q in zip(x, y, strict=True)) / norms if norms else float(x == y)
    small, large = sorted((a.parameters, b.parameters))
    size = (small / large) ** SIZE_EXPONENT if large else 1.0
    return mix * size
