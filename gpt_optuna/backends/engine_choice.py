"""Several engines searched in one study: ``--backend onnxruntime,inductor``, or ``auto`` for every
registered engine installed and usable here.

:class:`EngineChoice` is one backend made of several: its space starts with the ``engine`` knob
(the engines in the order given; the first is the baseline's), then each engine's knobs, active
only where ``engine`` is that engine. Every call that concerns a candidate goes to the candidate's
engine, so the worker, the search and the readers keep working with one backend spec string.
:class:`EnginesDescription` is what the tuner reads of it, made of the engines' descriptions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Generic, TypeVar

from gpt_optuna.backends.base import (
    Backend,
    BuildError,
    Built,
    EngineDescription,
    KnobLimit,
    NodeTime,
    Profiling,
    Runner,
)
from gpt_optuna.backends.registry import BACKENDS, describe_engine, load_engine
from gpt_optuna.core.engine_paths import EnginePaths
from gpt_optuna.core.engine_spec import AUTO, ENGINE_KNOB, engine_specs, is_composition
from gpt_optuna.core.errors import MissingDependencyError, UserError
from gpt_optuna.core.space import Candidate, Condition, Knob, Space, Value
from gpt_optuna.graph.fusion import FUSION_KNOB
from gpt_optuna.graph.model import Feeds, ModelInfo, ShapeRange
from gpt_optuna.graph.precision import PRECISIONS, PrecisionSetting
from gpt_optuna.graph.program import is_program


def choose_engines(model: Path | None = None) -> tuple[list[str], str]:
    """``auto``: every registered engine whose library is installed, that can run here and that
    takes ``model`` (an engine of PyTorch programs takes a ``.pt2`` alone), with one line saying
    which were chosen and why each other one was left out."""
    chosen, left_out = [], []
    for name in BACKENDS:
        engine = describe_engine(name)
        why = engine.missing_library() or engine.cannot_run_here()
        if why is None and engine.takes_programs and model is not None and not is_program(model):
            why = f"it compiles PyTorch programs, and {model.name} is none (give the model as a .pt2)"
        if why is None:
            chosen.append(name)
        else:
            left_out.append(f"{name}: {why}")
    if not chosen:
        raise UserError(f"--backend auto: no engine can run here ({'; '.join(left_out)})")
    line = f"--backend auto: {', '.join(chosen)}" + (f" (left out: {'; '.join(left_out)})" if left_out else "")
    return chosen, line


def resolved_spec(spec: str, model: Path | None = None) -> tuple[str, str]:
    """The backend spec a study of ``model`` records: ``auto`` as the engines chosen here for it
    (one engine alone: its name), a comma list checked and written without spaces; with ``auto``'s
    line ("" otherwise)."""
    if spec.strip() == AUTO:
        chosen, line = choose_engines(model)
        return ",".join(chosen), line
    if not is_composition(spec):
        return spec, ""
    names = engine_specs(spec)
    unknown = next((n for n in names if n not in BACKENDS and ":" not in n), None)
    if unknown is not None:
        raise UserError(f"unknown backend {unknown!r}; choose among: {', '.join(BACKENDS)}, auto (or module:Class)")
    return ",".join(names), ""


E = TypeVar("E", bound=EngineDescription)


def labelled_engines(spec: str, load: Callable[[str], E]) -> dict[str, E]:
    """The engines ``spec`` (a comma list, or ``auto``) names, each ``load``-ed, by their labels: what
    the ``engine`` knob calls them (a registered name, else the class's ``name``)."""
    engines: dict[str, E] = {}
    for name in resolved_spec(spec)[0].split(","):
        engine = load(name)
        label = name if name in BACKENDS else engine.name or type(engine).__name__
        if label in engines:
            raise UserError(f"--backend {spec!r}: two engines are called {label}; name each engine once")
        engines[label] = engine
    return engines


def _first_value(engines: Mapping[str, EngineDescription], ask: Any) -> Any:
    return next((found for found in map(ask, engines.values()) if found is not None), None)


class EnginesDescription(EngineDescription, Generic[E]):
    """Several engines' descriptions as one: the baseline's engine reads a user's configuration."""

    def __init__(self, engines: Mapping[str, E]) -> None:
        self.engines = engines
        self.name = ",".join(engines)
        self.first = next(iter(engines))
        self.speed_values = {k: v for e in engines.values() for k, v in e.speed_values.items()}

    def engine(self, candidate: Mapping[str, Value]) -> E:
        """The candidate's engine (the first where it names none: a study of one engine's candidate)."""
        return self.engines[str(candidate.get(ENGINE_KNOB, self.first))]

    def missing_library(self) -> MissingDependencyError | None:
        return _first_value(self.engines, lambda e: e.missing_library())

    def cannot_run_here(self) -> str | None:
        return _first_value(self.engines, lambda e: e.cannot_run_here())

    def runs_on_cpu(self, space: Space) -> bool:
        return self.engine(space.default()).runs_on_cpu(space)

    @property
    def reports_device_memory(self) -> bool:  # type: ignore[override]
        return all(e.reports_device_memory for e in self.engines.values())

    def baseline_values(self, path: Path) -> dict[str, Value]:
        return self.engines[self.first].baseline_values(path)

    def fit_baseline(self, values: Mapping[str, Value], space: Space) -> dict[str, Value]:
        return self.engines[self.first].fit_baseline(values, space)


@dataclass
class EngineBuilt(Built):
    """A candidate built by one of the engines: ``inner`` is that engine's own Built."""

    label: str = ""
    inner: Built | None = None


class EngineChoice(EnginesDescription[Backend], Backend):
    """Several engines as one backend: the ``engine`` knob picks the one a candidate runs on."""

    def __init__(self, engines: Mapping[str, Backend]) -> None:
        super().__init__(engines)
        precise = [e for e in engines.values() if len(e.precisions()) > 1]
        self.weak_typing_knobs = frozenset(k for e in precise for k in e.weak_typing_knobs)

    @classmethod
    def of(cls, spec: str) -> EngineChoice:
        """The engines ``spec`` (a comma list, or ``auto``) names, loaded."""
        return cls(labelled_engines(spec, load_engine))

    def space(self, model: ModelInfo, shapes: dict[str, ShapeRange]) -> Space:
        choice = Knob(
            ENGINE_KNOB, tuple(self.engines), self.first, "the engine that runs the model", selects_engine=True
        )
        knobs, owner = [choice], {ENGINE_KNOB: "the engine choice"}
        for label, engine in self.engines.items():
            for knob in engine.space(model, shapes).knobs:
                if knob.name in owner:
                    raise UserError(
                        f"engines {owner[knob.name]} and {label} both have a knob {knob.name!r}:"
                        " one study cannot search both"
                    )
                owner[knob.name] = label
                knobs.append(replace(knob, requires=(*knob.requires, Condition(ENGINE_KNOB, (label,)))))
        return Space(knobs)

    def with_graph_knobs(self, graph: list[Knob], knobs: list[Knob]) -> Space:
        """The ``engine`` knob first, then each graph knob active only for the engines that run
        transformed graphs of its kind, then the engines' knobs."""
        fusing = tuple(label for label, e in self.engines.items() if e.fusions())
        precise = tuple(label for label, e in self.engines.items() if len(e.precisions()) > 1)
        gated = []
        for knob in graph:
            takers = fusing if knob.name == FUSION_KNOB else precise
            if len(takers) < len(self.engines):
                knob = replace(knob, requires=(*knob.requires, Condition(ENGINE_KNOB, takers)))
            gated.append(knob)
        return Space([knobs[0], *gated, *knobs[1:]])

    def build(self, model: ModelInfo, candidate: Candidate, paths: EnginePaths, shapes: dict[str, ShapeRange]) -> Built:
        engine, label = self.engine(candidate), str(candidate.get(ENGINE_KNOB, self.first))
        precision = PrecisionSetting.from_candidate(candidate).precision
        if precision not in engine.precisions():
            raise BuildError(f"the {label} engine does not run {precision} graphs")
        fusion = candidate.get(FUSION_KNOB, "none")
        if fusion != "none" and fusion not in engine.fusions():
            raise BuildError(f"the {label} engine does not run the {fusion} graph fusion")
        built = engine.build(model, candidate, paths, shapes)
        return EngineBuilt(built.engine, built.build_s, built.facts, label, built)

    def _inner(self, built: Built) -> tuple[Backend, Built]:
        assert isinstance(built, EngineBuilt) and built.inner is not None, "built by another backend"
        return self.engines[built.label], built.inner

    def open(self, built: Built, feeds: Feeds, outputs: Feeds) -> Runner:
        engine, inner = self._inner(built)
        return engine.open(inner, feeds, outputs)

    def serialize(self, built: Built) -> bytes | None:
        engine, inner = self._inner(built)
        return engine.serialize(inner)

    def load(self, model: ModelInfo, candidate: Candidate, engine: bytes) -> Built | None:
        loaded = self.engine(candidate).load(model, candidate, engine)
        label = str(candidate.get(ENGINE_KNOB, self.first))
        return None if loaded is None else EngineBuilt(loaded.engine, loaded.build_s, loaded.facts, label, loaded)

    def check_model(
        self, model: ModelInfo, space: Space, candidate: Candidate, paths: EnginePaths, shapes: dict[str, ShapeRange]
    ) -> list[KnobLimit]:
        return self.engine(candidate).check_model(model, space, candidate, paths, shapes)

    def layer_times(self, profiling: Profiling) -> list[NodeTime]:
        return self.engine(profiling.candidate).layer_times(profiling)

    def refused_run(self, error: Exception) -> str | None:
        return _first_value(self.engines, lambda e: e.refused_run(error))

    def execution_providers(self) -> list[str]:
        return list(dict.fromkeys(p for e in self.engines.values() for p in e.execution_providers()))

    def versions(self) -> dict[str, str]:
        """Every engine's versions; a library two engines report differently, named by engine."""
        found = {label: e.versions() for label, e in self.engines.items()}
        merged: dict[str, str] = {}
        for label, versions in found.items():
            for key, value in versions.items():
                clash = any(other.get(key, value) != value for other in found.values())
                merged[f"{label}:{key}" if clash else key] = value
        return merged

    def precisions(self) -> tuple[str, ...]:
        offered = {p for e in self.engines.values() for p in e.precisions()}
        return tuple(p for p in PRECISIONS if p in offered)

    def fusions(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(f for e in self.engines.values() for f in e.fusions()))


def engine_defaults(space: Space) -> list[tuple[str, Candidate]]:
    """Each engine's defaults other than the baseline's engine, where the space chooses an engine."""
    choices = space.choices(ENGINE_KNOB)
    first = space.default().get(ENGINE_KNOB)
    return [(str(label), space.default({ENGINE_KNOB: label})) for label in choices if label != first]
