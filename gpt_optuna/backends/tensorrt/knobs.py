"""TensorRT's knobs (builder flags, levels, workspace, tiling, TensorRT 11's build routes) and how a
candidate sets them on a builder configuration."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from gpt_optuna.backends.base import BuildError
from gpt_optuna.core.space import Candidate, Condition, Knob, Value

MIB = 1 << 20
BUILDER_LEVELS = (0, 1, 2, 3, 4, 5)


WORKSPACE_MIB = ("default", 256, 1024, 4096, 16384)


SPEED_FLAGS = ("TF32", "SPARSE_WEIGHTS")


WEAK_TYPING_FLAGS = ("FP16", "BF16")
WEAK_TYPING_KNOBS = frozenset({"flag.FP16", "flag.BF16", "flag.INT8"})
"""Builder flags that let a weakly typed network pick lower precisions; a strongly typed one refuses them."""


def strongly_typed(candidate: Mapping[str, Any]) -> bool:
    """Whether a candidate's network is strongly typed: it sets no weak-typing flag."""
    return not any(candidate.get(flag) for flag in WEAK_TYPING_KNOBS)


UNSHIPPED_TACTICS = ("CUBLAS", "CUBLAS_LT", "CUDNN")
"""Tactic sources of 10.x that need cuBLAS or cuDNN libraries TensorRT's Python wheels do not ship:
offered only where the library has them on by default."""


def _with_default(default: Value, others: tuple[Value, ...]) -> tuple[Value, ...]:
    return (default, *[v for v in others if v != default])


@dataclass(frozen=True)
class RouteKnob:
    """One entry of ``IBuilderConfig.all_build_routes``: a compiler knob of TensorRT 11.1+."""

    option: str
    values: tuple[str, ...]
    default: str
    open_ended: bool
    help: str = ""

    @property
    def knob_name(self) -> str:
        return "route." + self.option.lstrip("-")


def parse_build_routes(text: str) -> list[RouteKnob]:
    """Parse the ``all_build_routes`` JSON; an empty string (RTX, Windows) means no routes."""
    if not text.strip():
        return []
    knobs = []
    for entry in json.loads(text).get("tuner_options", []):
        option = entry["option"]
        allowed = re.search(r"\[([^\]]*)\]", entry.get("allowed_values", ""))
        inside = allowed.group(1) if allowed else ""
        open_ended = not inside or "..." in inside
        default = str(entry.get("default_value", "")).removeprefix(option + "=")
        values = () if open_ended else tuple(v.strip() for v in inside.split("|") if v.strip())
        knobs.append(RouteKnob(option, values, default, open_ended, entry.get("help", "")))
    return knobs


def route_string(candidate: Candidate, routes: list[RouteKnob]) -> str:
    """The ``build_route`` for a candidate: a ``-name=value`` token for each non-default knob."""
    tokens = []
    for route in routes:
        value = candidate.get(route.knob_name)
        if value is not None and str(value) != route.default:
            tokens.append(f"{route.option}={value}")
    return " ".join(tokens)


def _tokens(route: str) -> dict[str, str]:
    """A build route's ``-name=value`` tokens as a mapping, their order aside."""
    return dict(token.partition("=")[::2] for token in route.split())


_COUNTS = {"max_aux_streams": (0, 1, 2, 4), "max_num_tactics": (-1, 1, 8, 32), "avg_timing_iterations": (1, 2, 4, 8)}
"""Builder settings of a count, each with the values searched besides the fresh configuration's."""


def discover_knobs(trt: ModuleType, config: Any, *, has_qdq: bool, dynamic: bool, l2_bytes: int | None) -> list[Knob]:
    """The search space the installed library offers, with defaults read from a fresh config."""
    knobs = [Knob("builder_optimization_level", BUILDER_LEVELS, int(config.builder_optimization_level))]
    if hasattr(trt, "TilingOptimizationLevel") and hasattr(config, "tiling_optimization_level"):
        levels = tuple(trt.TilingOptimizationLevel.__members__)
        knobs.append(Knob("tiling_optimization_level", levels, config.tiling_optimization_level.name))
        if hasattr(config, "l2_limit_for_tiling"):
            default = int(config.l2_limit_for_tiling)
            fractions = tuple(l2_bytes // d for d in (1, 2, 4)) if l2_bytes else ()
            tiled = Condition("tiling_optimization_level", tuple(x for x in levels if x != "NONE"))
            knobs.append(Knob("l2_limit_for_tiling", _with_default(default, fractions), default, condition=tiled))
    for name, others in _COUNTS.items():
        if hasattr(config, name):
            default = int(getattr(config, name))
            knobs.append(Knob(name, _with_default(default, others), default))
    flags = [*SPEED_FLAGS, *WEAK_TYPING_FLAGS, *(("INT8",) if has_qdq else ())]
    for flag in flags:
        if hasattr(trt.BuilderFlag, flag):
            default = bool(config.get_flag(getattr(trt.BuilderFlag, flag)))
            knobs.append(Knob(f"flag.{flag}", (default, not default), default))
    sources = int(config.get_tactic_sources())
    for name, member in trt.TacticSource.__members__.items():
        default = bool(sources & (1 << int(member)))
        if name in UNSHIPPED_TACTICS and not default:
            continue
        knobs.append(Knob(f"tactic.{name}", (default, not default), default))
    knobs.append(Knob("workspace_mib", WORKSPACE_MIB, "default", "workspace memory-pool limit"))
    if hasattr(config, "all_build_routes"):
        for route in parse_build_routes(config.all_build_routes):
            fixed = route.open_ended
            choices = (route.default,) if fixed else _with_default(route.default, route.values)
            knobs.append(
                Knob(route.knob_name, choices, route.default, route.help, open_ended=fixed, screened=not fixed)
            )
    if hasattr(trt, "CudaGraphStrategy"):
        knobs.append(Knob("runtime.cuda_graph_strategy", tuple(trt.CudaGraphStrategy.__members__), "DISABLED"))
    else:
        knobs.append(Knob("runtime.cuda_graph", (False, True), False, "capture execute_async_v3 in a CUDA graph"))
    if dynamic and hasattr(trt, "DynamicShapesKernelSpecializationStrategy"):
        strategies = tuple(trt.DynamicShapesKernelSpecializationStrategy.__members__)
        knobs.append(Knob("runtime.dynamic_shapes_kernel_specialization", strategies, strategies[0]))
    knobs.append(Knob("runtime.aux_streams", (False, True), False, "give the context our own auxiliary streams"))
    return knobs


def configure(trt: ModuleType, config: Any, candidate: Candidate, routes: list[RouteKnob]) -> None:
    """Apply a candidate's build knobs to an ``IBuilderConfig``: a setting is written only where the
    candidate's value differs from the fresh configuration's, so TensorRT's own default (which a
    written default value can change: an L2 limit of 0, say) stays wherever the candidate keeps it.
    A build route TensorRT does not take is a BuildError, never a silent default build."""
    for name in ("builder_optimization_level", *_COUNTS, "l2_limit_for_tiling"):
        if name in candidate and int(candidate[name]) != int(getattr(config, name)):
            setattr(config, name, int(candidate[name]))
    tiling = candidate.get("tiling_optimization_level")
    if tiling is not None and str(tiling) != config.tiling_optimization_level.name:
        config.tiling_optimization_level = getattr(trt.TilingOptimizationLevel, str(tiling))
    for name, value in candidate.items():
        if name.startswith("flag."):
            flag = getattr(trt.BuilderFlag, name.removeprefix("flag."))
            if bool(value) != bool(config.get_flag(flag)):
                config.set_flag(flag) if value else config.clear_flag(flag)
    before = int(config.get_tactic_sources())
    sources = before
    for name, value in candidate.items():
        if name.startswith("tactic."):
            bit = 1 << int(getattr(trt.TacticSource, name.removeprefix("tactic.")))
            sources = sources | bit if value else sources & ~bit
    if sources != before and not config.set_tactic_sources(sources):
        raise BuildError(f"TensorRT refused tactic sources {sources:#x}")
    workspace = candidate.get("workspace_mib", "default")
    if workspace != "default":
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace) * MIB)
    route = route_string(candidate, routes)
    if route:
        config.build_route = route
        taken = str(config.build_route)
        if _tokens(taken) != _tokens(route):
            raise BuildError(
                f"TensorRT {getattr(trt, '__version__', '')} did not take the build route {route!r}"
                f" (it reads back {taken!r}): the candidate would have built the default route"
            )
