"""ONNX Runtime under another name, with its knobs renamed: a second real engine for studies of
several engines (``--backend onnxruntime,twin_backend:TwinBackend``; the tests folder is on the path).

Every knob of ONNX Runtime's space is called ``twin.<knob>`` here and given back its own name
before ONNX Runtime builds the candidate; the sessions and runs are ONNX Runtime's own.
"""

from __future__ import annotations

from dataclasses import replace

from gpt_optuna.backends import Built, KnobLimit
from gpt_optuna.backends.onnxruntime.backend import OnnxRuntimeBackend
from gpt_optuna.core.engine_paths import EnginePaths
from gpt_optuna.core.space import Candidate, Condition, Space
from gpt_optuna.graph.model import ModelInfo, ShapeRange

PREFIX = "twin."


def _renamed(condition: Condition) -> Condition:
    parent = condition.parent
    return replace(condition, parent=PREFIX + parent if isinstance(parent, str) else tuple(PREFIX + p for p in parent))


def _own(candidate: Candidate) -> Candidate:
    return {k.removeprefix(PREFIX): v for k, v in candidate.items() if k.startswith(PREFIX)}


class TwinBackend(OnnxRuntimeBackend):
    name = "twin"

    def __init__(self) -> None:
        super().__init__()
        self.speed_values = {PREFIX + k: v for k, v in OnnxRuntimeBackend.speed_values.items()}

    def space(self, model: ModelInfo, shapes: dict[str, ShapeRange]) -> Space:
        knobs = super().space(model, shapes).knobs
        return Space(
            [
                replace(
                    k,
                    name=PREFIX + k.name,
                    condition=None if k.condition is None else _renamed(k.condition),
                    requires=tuple(map(_renamed, k.requires)),
                )
                for k in knobs
            ]
        )

    def precisions(self) -> tuple[str, ...]:
        return ("fp32",)

    def fusions(self) -> tuple[str, ...]:
        return ()

    def build(self, model: ModelInfo, candidate: Candidate, paths: EnginePaths, shapes: dict[str, ShapeRange]) -> Built:
        return super().build(model, _own(candidate), paths, shapes)

    def check_model(
        self, model: ModelInfo, space: Space, candidate: Candidate, paths: EnginePaths, shapes: dict[str, ShapeRange]
    ) -> list[KnobLimit]:
        self.build(model, candidate, paths, shapes)
        return []
