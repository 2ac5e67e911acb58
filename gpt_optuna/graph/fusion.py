"""Graph fusions as a search dimension: maintained fusion libraries, each value one fused model.

Each value of the ``graph_fusion`` knob is the model rewritten by one fusion library into ONNX
Runtime's fused operators: ONNX Runtime's transformer optimizer with the model type that fits
(:mod:`gpt_optuna.graph.ort_fusion`; ``transformer`` is its BERT-style set, which also covers
vision transformers, ``transformer-mha`` the same with attention as MultiHeadAttention,
``transformer-gpt2`` and ``transformer-unet`` its decoder and diffusion sets) and the onnxscript
rewriter's ONNX Runtime fusions (:mod:`gpt_optuna.graph.onnxscript_fusion`). A value is offered
only where the graph has the operators its patterns start from, where it fuses something, and
where it fuses the model otherwise than a value offered before it (the same fused operators, the
same graph for the search); making the candidates stops once preparation has spent its share of
the search's time. Checking the space then loads each one with the provider that runs it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpt_optuna.core.space import Knob
from gpt_optuna.graph.model import ModelInfo, every_node
from gpt_optuna.graph.model_cache import TransformFailed, failure_path, produce
from gpt_optuna.graph.onnxscript_fusion import fuse_onnxscript
from gpt_optuna.graph.ort_fusion import fuse_transformer

FUSION_KNOB = "graph_fusion"
FUSED_VERSION = "v4"
"""In the fused models' file names: a new version is made anew, not read from the cache."""
MULTI_HEAD = "MultiHeadAttention"

FUSABLE_OPS = frozenset({"LayerNormalization", "Erf", "Gelu", "Tanh", "Softmax"})
"""Operators one of the transformer patterns starts from (layer norms, GELUs, attention's
softmax), besides a norm written out (ReduceMean with Sqrt: a layer norm or RMS norm; ReduceMean
alone is a CNN's pooling): a graph with none of them has nothing to fuse, and no fusion library (a
minute on a large model) is run on it."""


@dataclass(frozen=True)
class Fusion:
    """One value of the knob: how the fused model is made, and the graphs it may change (by their
    operator types)."""

    name: str
    make: Callable[[Path, Path], dict[str, int]]
    fits: Callable[[set[str]], bool]
    library: str
    """The module that must be importable for it (else it is left out, and the user told)."""


def _transformer_like(ops: set[str]) -> bool:
    return bool(ops & FUSABLE_OPS) or {"ReduceMean", "Sqrt"} <= ops


FUSION_VALUES = (
    Fusion("transformer", lambda s, o: fuse_transformer(s, o, "bert"), _transformer_like, "onnxruntime"),
    Fusion("onnxscript", fuse_onnxscript, _transformer_like, "onnxscript"),
    Fusion("transformer-mha", lambda s, o: fuse_transformer(s, o, "bert", True), _transformer_like, "onnxruntime"),
    Fusion(
        "transformer-gpt2",
        lambda s, o: fuse_transformer(s, o, "gpt2"),
        lambda ops: "Softmax" in ops and "Conv" not in ops,
        "onnxruntime",
    ),
    Fusion(
        "transformer-unet",
        lambda s, o: fuse_transformer(s, o, "unet"),
        lambda ops: "Conv" in ops and bool(ops & {"InstanceNormalization", "GroupNormalization"}),
        "onnxruntime",
    ),
)
"""In the order they are tried: what an earlier one fuses alike, a later one does not repeat."""
FUSIONS = ("none", *(f.name for f in FUSION_VALUES))
_BY_NAME = {f.name: f for f in FUSION_VALUES}


def fused_path(base_path: Path, base_sha256: str, fusion: str, cache_dir: Path) -> Path:
    """The model with ``fusion`` applied, produced once per model and cached by its content (a
    failure too), with the fused-op counts beside it (``.json``)."""
    if fusion == "none":
        return base_path
    if fusion not in FUSIONS:
        raise ValueError(f"unknown graph fusion {fusion!r}; known: {', '.join(FUSIONS)}")
    out = _cached_path(base_sha256, fusion, cache_dir)
    make = _BY_NAME[fusion].make
    return produce(out, lambda tmp: out.with_suffix(".json").write_text(json.dumps(make(base_path, tmp))))


def fused_within(base_path: Path, base_sha256: str, fusion: str, cache_dir: Path, seconds: float) -> Path | None:
    """:func:`fused_path`, made in a child process stopped after ``seconds`` (the fusion libraries
    cannot be interrupted, and a large model's fusion takes minutes): None where it did not end in
    time (nothing of it is left behind); a process that died of it is the graph's failure."""
    out = _cached_path(base_sha256, fusion, cache_dir)
    if out.is_file() or failure_path(out).is_file():
        return fused_path(base_path, base_sha256, fusion, cache_dir)
    command = [sys.executable, "-m", __name__, str(base_path), base_sha256, fusion, str(cache_dir)]
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _, err = child.communicate(timeout=max(seconds, 0.0))
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        for left in out.parent.glob(f"{out.stem}.{child.pid}-*.tmp{out.suffix}"):
            left.unlink(missing_ok=True)
        return None
    if child.returncode != 0 and not (out.is_file() or failure_path(out).is_file()):
        last = err.decode(errors="replace").strip().splitlines()[-1:] or [f"exit code {child.returncode}"]
        raise TransformFailed(f"the fusion's process ended: {last[0]}", err.decode(errors="replace"))
    return fused_path(base_path, base_sha256, fusion, cache_dir)


def _cached_path(base_sha256: str, fusion: str, cache_dir: Path) -> Path:
    return cache_dir / f"{fusion}-{FUSED_VERSION}-{base_sha256[:24]}.onnx"


def fused_ops(path: Path) -> dict[str, int]:
    """The fused-op counts kept beside a model :func:`fused_path` made."""
    return json.loads(path.with_suffix(".json").read_text())


def graph_ops(model: Any) -> set[str]:
    """The operator types of an ONNX model, its control-flow bodies and local functions included."""
    return {node.op_type for node in every_node(model.graph, *model.functions)}


def fusion_knobs(
    model: ModelInfo,
    fusions: tuple[str, ...],
    cache_dir: Path,
    ops: set[str],
    note: Callable[[str], None],
    budget_s: float | None = None,
    needed: frozenset[str] = frozenset(),
) -> list[Knob]:
    """A ``graph_fusion`` knob where the backend runs fused graphs (``fusions``: the values it runs)
    and a fusion changes this model (whose operator types are ``ops``): each value that fits the
    graph, fuses something in it, and fuses it otherwise than the values kept before it (``-mha``:
    where it makes MultiHeadAttention). What is left out is told to ``note``. A value whose making
    would not end within ``budget_s`` seconds of the first (by what its library's last value took;
    each library's first is tried while time is left, in a process of its own stopped at the end of
    ``budget_s``) is left out (told too), but for those ``needed`` (a configuration the search must
    run uses them).

    The fused models are made here, once, in ``cache_dir``: the candidates that use them find them
    there. A graph a library fails on keeps the value: checking the space drops it and says why.
    """
    wanted = [f for f in FUSION_VALUES if f.name in fusions]
    if not wanted:
        return []
    if not _transformer_like(ops):
        note("graph_fusion not searched: the model has no layer norm, GELU or softmax for the transformer fusions")
        return []
    started = time.monotonic()
    took: dict[str, float] = {}  # by library: what making its last value took
    kept: dict[str, dict[str, int] | None] = {}
    for fusion in wanted:
        if not fusion.fits(ops):
            continue
        if importlib.util.find_spec(fusion.library) is None:
            note(f"graph_fusion {fusion.name} not searched: {fusion.library} is not installed")
            continue
        spent = time.monotonic() - started
        if budget_s is not None and spent + took.get(fusion.library, 0.0) > budget_s and fusion.name not in needed:
            note(
                f"graph_fusion {fusion.name} not searched: no time left for it in preparation's share of --timeout"
                f" ({spent:.1f} s spent making fused models)"
            )
            continue
        late = False
        try:
            if budget_s is None or fusion.name in needed:
                made = fused_path(model.path, model.sha256, fusion.name, cache_dir)
            else:
                made = fused_within(model.path, model.sha256, fusion.name, cache_dir, budget_s - spent)
            late = made is None
            counts: dict[str, int] | None = None if made is None else fused_ops(made)
        except TransformFailed:
            counts = None  # kept: checking the space drops it and says why
        took[fusion.library] = time.monotonic() - started - spent
        if late:
            note(
                f"graph_fusion {fusion.name} not searched: not made within preparation's share of --timeout"
                f" ({budget_s:.0f} s for fused models); a longer --timeout makes it"
            )
            continue
        if counts is not None:
            why = _left_out(fusion.name, counts, kept)
            if why:
                if why != "-":
                    note(f"graph_fusion {fusion.name} not searched: {why}")
                continue
        kept[fusion.name] = counts
    return [_knob(("none", *kept))] if kept else []


def _left_out(name: str, counts: dict[str, int], kept: dict[str, dict[str, int] | None]) -> str:
    """Why a fused model is not a value of its own ("-": nothing to say), or ``""`` to keep it."""
    if not counts:
        return "it fuses nothing in this model"
    if name == "transformer-mha" and MULTI_HEAD not in counts:
        return "-"  # no attention fused as MultiHeadAttention: the same as transformer
    same = next((other for other, theirs in kept.items() if theirs == counts), None)
    return f"it fuses this model as {same} does" if same else ""


def _knob(values: tuple[str, ...]) -> Knob:
    what = (
        "maintained graph fusions into ONNX Runtime's fused operators: its transformer optimizer by model type"
        " (-mha: attention as MultiHeadAttention), the onnxscript rewriter's ONNX Runtime fusions"
    )
    return Knob(FUSION_KNOB, values, "none", what)


def fusion_of(candidate: dict[str, Any]) -> str:
    """The candidate's graph fusion ("none" where the space has no such knob)."""
    return str(candidate.get(FUSION_KNOB, "none"))


if __name__ == "__main__":  # fused_within's child: BASE_PATH BASE_SHA256 FUSION CACHE_DIR
    with contextlib.suppress(TransformFailed):  # kept in the cache: the parent reads it there
        fused_path(Path(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4]))
