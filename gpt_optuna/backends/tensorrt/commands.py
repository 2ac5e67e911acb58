"""The ``trtexec`` and ``polygraphy convert`` command lines that build a TensorRT trial's engine.

Each builder knob maps to the tools' documented flag where one exists (trtexec's from
``samples/common/sampleOptions.cpp``, Polygraphy's from its ``CreateConfig`` arguments); a knob
at its default adds nothing. Settings without a flag are returned by name, so that the export
says which part of the trial the command does not reproduce. Runtime knobs are not build flags:
trtexec's ``--useCudaGraph`` is the one that exists for inference.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpt_optuna.backends.base import ExportedTrial
from gpt_optuna.backends.tensorrt.knobs import strongly_typed

TILING_LEVELS = {"NONE": 0, "FAST": 1, "MODERATE": 2, "FULL": 3}
"""trtexec takes ``--tilingOptimizationLevel`` as the enum's integer."""
NUMBER_FLAGS = {
    "builder_optimization_level": "--builderOptimizationLevel",
    "l2_limit_for_tiling": "--l2LimitForTiling",
    "max_aux_streams": "--maxAuxStreams",
    "max_num_tactics": "--maxTactics",
    "avg_timing_iterations": "--avgTiming",
}
"""The knobs trtexec takes as a number, by their flags."""
SWITCH_FLAGS = {
    ("flag.FP16", True): "--fp16",
    ("flag.BF16", True): "--bf16",
    ("flag.INT8", True): "--int8",
    ("flag.TF32", False): "--noTF32",
    ("flag.SPARSE_WEIGHTS", True): "--sparsity=enable",
    ("flag.SPARSE_WEIGHTS", False): "--sparsity=disable",
}
"""The builder flags trtexec sets by a flag of its own, by knob and value (TF32 is on unless ``--noTF32``)."""


@dataclass
class CommandLine:
    """One tool's arguments for a trial, and the trial's settings it has no flag for."""

    tool: str
    arguments: list[str] = field(default_factory=list)
    no_flag: list[str] = field(default_factory=list)

    def text(self) -> str:
        return shlex.join([self.tool, *self.arguments])


def _shape_text(dims: list[int], joiner: str) -> str:
    return joiner.join(str(d) for d in dims)


GRAPH_BY_DEFAULT_SINCE = 11
"""trtexec's major version from which CUDA graphs (and spin-waits, and timing without data
transfers) are its defaults: ``--noCudaGraph`` turns the graph off there."""


def trtexec_major(versions: Mapping[str, str]) -> int | None:
    """TensorRT's major version among a study's library versions (None: unknown, or TensorRT-RTX,
    whose tool is not trtexec)."""
    for module in ("tensorrt", "tensorrt_bindings"):
        head = str(versions.get(module, "")).split(".")[0]
        if head.isdigit():
            return int(head)
    return None


def trtexec(
    onnx_path: str,
    engine_path: str,
    params: Mapping[str, Any],
    defaults: Mapping[str, Any],
    shapes: dict[str, Any],
    major: int | None = None,
) -> CommandLine:
    """``trtexec --onnx=... --saveEngine=...`` with the trial's non-default builder settings, and
    its CUDA-graph setting as trtexec ``major`` reads it (graphs are trtexec 11's default)."""
    line = CommandLine("trtexec", [f"--onnx={onnx_path}", f"--saveEngine={engine_path}"])
    for flag, index in (("--minShapes", 0), ("--optShapes", 1), ("--maxShapes", 2)):
        if shapes:
            line.arguments.append(flag + "=" + ",".join(f"{n}:{_shape_text(r[index], 'x')}" for n, r in shapes.items()))
    changed = {n: v for n, v in params.items() if v != defaults.get(n)}
    sources = [("+" if v else "-") + n.removeprefix("tactic.") for n, v in changed.items() if n.startswith("tactic.")]
    if sources:
        line.arguments.append("--tacticSources=" + ",".join(sorted(sources)))
    routes = [f"-{n.removeprefix('route.')}={v}" for n, v in changed.items() if n.startswith("route.")]
    if routes:
        line.arguments.append("--setBuildRoute=" + " ".join(routes))
    graphs_by_default = major is not None and major >= GRAPH_BY_DEFAULT_SINCE
    for name, value in changed.items():
        if not name.startswith(("tactic.", "route.")) and not (graphs_by_default and name in GRAPH_KNOBS):
            _add(line, name, value, _trtexec_argument(name, value))
    if graphs_by_default and not captures(params):
        line.arguments.append("--noCudaGraph")
    if major == WEAKLY_TYPED_BY_DEFAULT and strongly_typed(params):
        line.arguments.append("--stronglyTyped")
    return line


WEAKLY_TYPED_BY_DEFAULT = 10
"""trtexec's major version that builds weakly typed networks unless ``--stronglyTyped`` (from 11
every network is strongly typed)."""


GRAPH_KNOBS = ("runtime.cuda_graph", "runtime.cuda_graph_strategy")


def captures(params: Mapping[str, Any]) -> bool:
    """Whether the trial ran its engine as a CUDA graph."""
    return bool(params.get("runtime.cuda_graph")) or params.get("runtime.cuda_graph_strategy", "DISABLED") != "DISABLED"


def _add(line: CommandLine, name: str, value: Any, argument: list[str] | str | None) -> None:
    if argument is None:
        line.no_flag.append(f"{name}={value}")
    elif isinstance(argument, str):
        line.arguments.append(argument)
    else:
        line.arguments += argument


def _trtexec_argument(name: str, value: Any) -> str | None:
    if name in NUMBER_FLAGS:
        return f"{NUMBER_FLAGS[name]}={value}"
    if name == "tiling_optimization_level":
        return f"--tilingOptimizationLevel={TILING_LEVELS[str(value)]}"
    if name == "workspace_mib":
        return f"--memPoolSize=workspace:{value}M"
    if name in GRAPH_KNOBS:
        return "--useCudaGraph" if captures({name: value}) else None
    return SWITCH_FLAGS.get((name, bool(value)))


def polygraphy(
    onnx_path: str, engine_path: str, params: Mapping[str, Any], defaults: Mapping[str, Any], shapes: dict[str, Any]
) -> CommandLine:
    """``polygraphy convert ... --convert-to trt`` with the trial's builder settings. Polygraphy
    clears TF32 unless ``--tf32`` is given, so it is given whenever the trial had TF32 on."""
    line = CommandLine("polygraphy", ["convert", onnx_path, "--convert-to", "trt", "-o", engine_path])
    for flag, index in (("--trt-min-shapes", 0), ("--trt-opt-shapes", 1), ("--trt-max-shapes", 2)):
        if shapes:
            line.arguments += [flag, *(f"{n}:[{_shape_text(r[index], ',')}]" for n, r in shapes.items())]
    if params.get("flag.TF32", True):
        line.arguments.append("--tf32")
    changed = {n: v for n, v in params.items() if v != defaults.get(n)}
    if any(n.startswith("tactic.") for n in changed):
        line.arguments += [
            "--tactic-sources",
            *(n[7:].lower() for n, v in params.items() if n.startswith("tactic.") and v),
        ]
    for name, value in changed.items():
        if not name.startswith("tactic.") and name != "flag.TF32":
            _add(line, name, value, _polygraphy_argument(name, value))
    return line


def _polygraphy_argument(name: str, value: Any) -> list[str] | None:
    if name == "builder_optimization_level":
        return ["--builder-optimization-level", str(value)]
    if name == "tiling_optimization_level":
        return ["--tiling-optimization-level", str(value).lower()]
    if name == "max_aux_streams":
        return ["--max-aux-streams", str(value)]
    if name == "workspace_mib":
        return ["--pool-limit", f"workspace:{int(value) << 20}"]
    if name in ("flag.SPARSE_WEIGHTS", "flag.FP16", "flag.BF16", "flag.INT8") and value:
        return ["--sparse-weights" if name == "flag.SPARSE_WEIGHTS" else f"--{name[5:].lower()}"]
    return None


def build_commands(trial: ExportedTrial) -> dict[str, Any]:
    """``trtexec`` and ``polygraphy convert`` lines that build the trial's engine from the ONNX
    model TensorRT parsed (written beside the engine as ``ENGINE.onnx``), and the settings that
    have no flag in each."""
    from gpt_optuna.graph.constant_folding import folded
    from gpt_optuna.graph.model import load_model_info
    from gpt_optuna.graph.model_copy import copy_model

    parsed = trial.out.with_name(trial.out.name + ".onnx")
    copy_model(folded(load_model_info(trial.model), trial.paths.models).path, parsed)
    params, defaults, shapes = dict(trial.params), dict(trial.defaults), dict(trial.shapes)
    lines = [
        trtexec(parsed.name, trial.out.name, params, defaults, shapes, trtexec_major(trial.versions)),
        polygraphy(parsed.name, trial.out.name, params, defaults, shapes),
    ]
    return {line.tool: line.text() for line in lines} | {f"{line.tool}_no_flag": line.no_flag for line in lines}


def side_file(trial: ExportedTrial) -> dict[str, Any]:
    """The command lines that build the exported engine again, for the export's side file."""
    return {"commands": build_commands(trial)}
