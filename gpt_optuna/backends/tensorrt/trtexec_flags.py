"""A user's own TensorRT build (``--baseline-config``) as trtexec flags, in the space's knob names.

The file holds the flags the user builds with (``--fp16 --builderOptimizationLevel=5
--useCudaGraph``), on one line or several, ``#`` comments allowed: :func:`commands.trtexec`'s
mapping read backwards. Flags that name files or shapes (``--onnx``, ``--saveEngine``,
``--minShapes``...) or only change what trtexec prints are left to the study, which has its own;
any other flag no knob sets is refused in one line.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from gpt_optuna.backends.tensorrt.commands import GRAPH_BY_DEFAULT_SINCE, NUMBER_FLAGS, SWITCH_FLAGS, TILING_LEVELS
from gpt_optuna.core.errors import UserError
from gpt_optuna.core.space import Value

_NUMBERS = {flag: knob for knob, flag in NUMBER_FLAGS.items()}
_SWITCHES = {flag: setting for setting, flag in SWITCH_FLAGS.items()} | {
    "--useCudaGraph": ("runtime.cuda_graph", True),
    "--noCudaGraph": ("runtime.cuda_graph", False),
}
_THE_STUDYS = frozenset(
    {
        "--onnx", "--saveEngine", "--loadEngine", "--minShapes", "--optShapes", "--maxShapes", "--shapes",
        "--timingCacheFile", "--verbose", "--dumpProfile", "--dumpLayerInfo", "--exportProfile",
        "--exportLayerInfo", "--profilingVerbosity", "--separateProfileRun", "--iterations", "--duration",
        "--warmUp", "--avgRuns", "--skipInference", "--device", "--noDataTransfers", "--useSpinWait",
        "--stronglyTyped",
    }
)  # fmt: skip
"""Flags of files, shapes, devices and trtexec's own timing and output: the study sets its own
(networks are strongly typed unless a weak-typing flag is given, so ``--stronglyTyped`` is too)."""


def read_flags(path: Path) -> list[str]:
    """The flags of a file, comments dropped."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise UserError(f"--baseline-config {path}: {exc.strerror or exc}") from None
    try:
        return [flag for line in lines for flag in shlex.split(line, comments=True)]
    except ValueError as exc:
        raise UserError(f"--baseline-config {path}: {exc}") from None


def knob_values(flags: list[str], where: str, major: int | None = None) -> dict[str, Value]:
    """The knobs (name -> value) that set what trtexec ``flags`` ask for, read as trtexec ``major``
    reads them (from 11 on, a CUDA graph unless ``--noCudaGraph``); a UserError naming the first
    flag no knob sets."""
    values: dict[str, Value] = {}
    if major is not None and major >= GRAPH_BY_DEFAULT_SINCE:
        values["runtime.cuda_graph"] = True
    for flag in flags:
        name, _, text = flag.partition("=")
        if name in _THE_STUDYS:
            continue
        switch = f"{name}={text}" if text else name
        if switch in _SWITCHES:
            knob, value = _SWITCHES[switch]
            values[knob] = value
        elif name in _NUMBERS:
            values[_NUMBERS[name]] = _number(flag, text, where)
        elif name == "--tilingOptimizationLevel":
            level = _number(flag, text, where)
            names = {v: k for k, v in TILING_LEVELS.items()}
            if level not in names:
                raise UserError(f"{where}: {flag}: give a level of 0 to {len(names) - 1}")
            values["tiling_optimization_level"] = names[level]
        elif name == "--memPoolSize":
            values["workspace_mib"] = _workspace(flag, text, where)
        elif name == "--tacticSources":
            for source in filter(None, text.split(",")):
                if source[:1] not in "+-" or len(source) < 2:
                    raise UserError(f"{where}: {flag}: name each source with + or -, e.g. -CUDNN")
                values[f"tactic.{source[1:].upper()}"] = source[0] == "+"
        elif name == "--setBuildRoute":
            for token in text.split():
                option, _, value = token.partition("=")
                values[f"route.{option.lstrip('-')}"] = value
        else:
            raise UserError(f"{where}: {flag!r} is not a flag the tuner can set")
    return values


def fitted_to(values: dict[str, Value], knobs: set[str]) -> dict[str, Value]:
    """``values`` for a space of ``knobs``: where CUDA graphs are captured by TensorRT 11's
    strategy knob, ``--useCudaGraph`` is its whole-graph capture."""
    if "runtime.cuda_graph" in values and "runtime.cuda_graph" not in knobs and "runtime.cuda_graph_strategy" in knobs:
        values = dict(values)
        capture = values.pop("runtime.cuda_graph")
        values["runtime.cuda_graph_strategy"] = "WHOLE_GRAPH_CAPTURE" if capture else "DISABLED"
    return values


def _number(flag: str, text: str, where: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise UserError(f"{where}: {flag}: give a whole number") from None


def _workspace(flag: str, text: str, where: str) -> int:
    """``workspace:1024M`` (trtexec's unit suffixes K, M, G; MiB by default) in MiB."""
    pools = dict(part.partition(":")[::2] for part in text.split(","))
    size = pools.get("workspace", "").strip()
    scale = {"K": 1 / 1024, "M": 1, "G": 1024}.get(size[-1:].upper())
    try:
        mib = float(size[:-1]) * scale if scale is not None else float(size)
    except ValueError:
        mib = -1
    if mib <= 0 or set(pools) != {"workspace"}:
        raise UserError(f"{where}: {flag}: give the workspace pool alone, e.g. --memPoolSize=workspace:1024M")
    return int(mib)
