"""The model's interface as a contract: the names, dtypes and ranks of its inputs and outputs.

A candidate may change how the model computes, never what it takes and returns. The one
exception is the I/O precision of a reduced-precision graph, and only where the user opted in
(``--allow-io-change``); then every reader of the study says which tensors changed.
"""

from __future__ import annotations

from typing import Any

from gpt_optuna.graph.model import ModelInfo, TensorSpec
from gpt_optuna.graph.model_cache import TransformFailed


class InterfaceChanged(TransformFailed):
    """A transformed graph takes or returns something other than the original model."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__(f"the graph changes the model's interface: {'; '.join(problems)}", "")


def _kinds(original: ModelInfo, made: ModelInfo) -> list[tuple[str, tuple[TensorSpec, ...], tuple[TensorSpec, ...]]]:
    return [("input", original.inputs, made.inputs), ("output", original.outputs, made.outputs)]


def interface_problems(original: ModelInfo, made: ModelInfo, dtypes_may_change: bool = False) -> list[str]:
    """What ``made`` takes or returns differently from ``original``: a missing or extra tensor, another
    rank, or (unless ``dtypes_may_change``) another dtype; empty where the interface is kept."""
    problems = []
    for kind, before, after in _kinds(original, made):
        now = {spec.name: spec for spec in after}
        for spec in before:
            other = now.get(spec.name)
            if other is None:
                problems.append(f"{kind} {spec.name} is gone")
            elif len(other.shape) != len(spec.shape):
                problems.append(f"{kind} {spec.name} has rank {len(other.shape)}, the model's {len(spec.shape)}")
            elif other.dtype != spec.dtype and not dtypes_may_change:
                problems.append(f"{kind} {spec.name} is {other.dtype.name}, the model's {spec.dtype.name}")
        problems += [f"{kind} {name} is new" for name in now if name not in {s.name for s in before}]
    return problems


def check_interface(original: ModelInfo, made: ModelInfo, dtypes_may_change: bool) -> None:
    """Raise :class:`InterfaceChanged` where ``made`` breaks the contract."""
    problems = interface_problems(original, made, dtypes_may_change)
    if problems:
        raise InterfaceChanged(problems)


def dtype_changes(original: ModelInfo, made: ModelInfo) -> dict[str, dict[str, list[str]]]:
    """``{"inputs": {name: [model dtype, new dtype]}, "outputs": {...}}`` of the tensors whose dtype
    ``made`` changed (empty where none did)."""
    changes: dict[str, dict[str, list[str]]] = {}
    for kind, before, after in _kinds(original, made):
        was = {spec.name: spec.dtype for spec in before}
        changed = {s.name: [was[s.name].name, s.dtype.name] for s in after if s.name in was and s.dtype != was[s.name]}
        if changed:
            changes[f"{kind}s"] = changed
    return changes


def describe_changes(changes: dict[str, dict[str, list[str]]]) -> str:
    """``takes images as float16 (the model: float32), returns logits as float16 (the model: float32)``."""
    verbs = {"inputs": "takes", "outputs": "returns"}
    return ", ".join(
        f"{verbs[kind]} " + ", ".join(f"{name} as {new} (the model: {old})" for name, (old, new) in changed.items())
        for kind, changed in changes.items()
    )


def io_record(made: ModelInfo, changes: dict[str, dict[str, list[str]]], allowed: bool) -> dict[str, Any]:
    """The interface of an exported model as its side file states it: each tensor's name, dtype
    and shape, the model's own dtype where ``changes`` (:func:`dtype_changes`) says it differs,
    and whether the study allowed that."""

    def tensors(kind: str, specs: tuple[TensorSpec, ...]) -> list[dict[str, Any]]:
        rows = []
        for spec in specs:
            row: dict[str, Any] = {"name": spec.name, "dtype": spec.dtype.name, "shape": list(spec.shape)}
            if spec.name in changes.get(kind, {}):
                row["model_dtype"] = changes[kind][spec.name][0]
            rows.append(row)
        return rows

    return {
        "inputs": tensors("inputs", made.inputs),
        "outputs": tensors("outputs", made.outputs),
        "changed": bool(changes),
        "changes": changes,
        "allow_io_change": allowed,
    }
