"""ONNX Runtime's transformer fusions as an ONNX graph transform.

ONNX Runtime's own graph optimizer leaves most of a transformer as small kernels; its transformer
optimizer rewrites the decomposed patterns into fused contrib operators (SkipLayerNormalization,
BiasGelu, Attention, ...), which cut the kernel count and run well in fp16. The fused graph uses
``com.microsoft`` operators, so only ONNX Runtime can run it. Constants are folded first (ONNX
Runtime's basic level, on the CPU), so weights stored compressed and expanded in the graph become
plain initializers the fusion patterns recognise, and attention as torch's dynamo exporter writes
it is rewritten into the form the attention fusion matches (:mod:`gpt_optuna.graph.attention_rewrite`);
attention with one packed Q/K/V projection (``torch.nn.MultiheadAttention``, vision transformers)
is fused directly (:mod:`gpt_optuna.graph.packed_attention`), patch convolutions become matrix
products (:mod:`gpt_optuna.graph.patch_convolution`) and per-channel layer scales are folded into
the projection before them (:mod:`gpt_optuna.graph.layer_scale`).
Auto-detects head count and hidden size. ``transformer-mha`` fuses attention into
MultiHeadAttention instead of Attention (the operator the CUDA provider runs with its flash,
memory-efficient and cuDNN kernels), a key-padding mask given to it as an attention bias, which its
memory-efficient kernel takes (:mod:`gpt_optuna.graph.mask_bias`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gpt_optuna.core.errors import MissingDependencyError
from gpt_optuna.core.space import Knob
from gpt_optuna.graph import opset
from gpt_optuna.graph.attention_rewrite import rewrite_attention
from gpt_optuna.graph.layer_scale import fold_layer_scales
from gpt_optuna.graph.mask_bias import masks_as_bias
from gpt_optuna.graph.model import ModelInfo, every_node
from gpt_optuna.graph.model_cache import TransformFailed, produce
from gpt_optuna.graph.packed_attention import rewrite_packed_attention
from gpt_optuna.graph.patch_convolution import rewrite_patch_convolutions

FUSIONS = ("none", "transformer", "transformer-mha")
WITHOUT_MULTI_HEAD = FUSIONS[:2]
"""The values where attention is not, or cannot be, fused into MultiHeadAttention."""
FUSION_KNOB = "graph_fusion"
FUSED_VERSION = "v4"
"""In the fused models' file names: a new version is made anew, not read from the cache."""
MULTI_HEAD = "MultiHeadAttention"

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The optimizer logs and warns per pattern it tries; keep that out of the tuner's output."""
    logger = logging.getLogger("onnxruntime.transformers")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def fold_constants(source: Path, out: Path) -> None:
    """Save the model after ONNX Runtime's basic, provider-independent rewrites (constant folding),
    projections left as MatMul + Add: the transformer fusion's patterns (bias GELU, skip layer
    norm with bias) read them so, not as the Gemm the basic level would make of them."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(out)
    ort.InferenceSession(
        str(source), options, providers=["CPUExecutionProvider"], disabled_optimizers=["MatMulAddFusion"]
    )


def fuse_transformer(source: Path, out: Path, multi_head: bool = False) -> dict[str, int]:
    """Write the transformer-fused model to ``out``, attention fused into MultiHeadAttention where
    ``multi_head``; return how many of each fused op it gained (the optimizer's statistics also
    count those the model had already, e.g. LayerNormalization)."""
    if importlib.util.find_spec("sympy") is None:  # the optimizer's shape inference needs it
        raise MissingDependencyError("sympy (ONNX Runtime's transformer optimizer)", "cpu")
    import onnx
    from onnxruntime.transformers import optimizer
    from onnxruntime.transformers.fusion_options import FusionOptions

    raised, folded = (out.with_name(f"{out.stem}.{step}.onnx") for step in ("raised", "folded"))
    original = onnx.load(str(source))
    try:
        # the optimizer writes ONNX's LayerNormalization, an operator of opset 17
        onnx.save(opset.at_least(original, opset.LAYER_NORMALIZATION), str(raised))
        fold_constants(raised, folded)
        model = onnx.load(str(folded))
    finally:
        raised.unlink(missing_ok=True)
        folded.unlink(missing_ok=True)
    rewritten, skipped = rewrite_attention(model)
    logger.debug("attention blocks rewritten: %d; left: %s", rewritten, skipped)
    rewritten, skipped = rewrite_packed_attention(model, multi_head)
    logger.debug("packed attention blocks rewritten: %d; left: %s", rewritten, skipped)
    logger.debug("patch convolutions rewritten: %d", rewrite_patch_convolutions(model))
    logger.debug("layer scales folded: %d", fold_layer_scales(model))
    options = FusionOptions("bert")
    options.use_raw_attention_mask(True)  # a mask index (sequence lengths) would assume right padding
    options.use_multi_head_attention = multi_head
    with _quiet():
        fused = optimizer.optimize_model(
            model, model_type="bert", opt_level=0, use_gpu=True, optimization_options=options
        )
    if multi_head:
        rewritten, skipped = masks_as_bias(fused.model)
        logger.debug("key-padding masks given as attention biases: %d; left: %s", rewritten, skipped)
    fused.save_model_to_file(str(out))
    onnx.checker.check_model(str(out), full_check=True)
    had = Counter(node.op_type for node in original.graph.node)
    return {op: n - had[op] for op, n in fused.get_fused_operator_statistics().items() if n > had[op]}


def fused_path(base_path: Path, base_sha256: str, fusion: str, cache_dir: Path) -> Path:
    """The model with ``fusion`` applied, produced once per model and cached by its content (a
    failure too), with the fused-op counts beside it (``.json``)."""
    if fusion == "none":
        return base_path
    if fusion not in FUSIONS:
        raise ValueError(f"unknown graph fusion {fusion!r}; known: {', '.join(FUSIONS)}")
    out = cache_dir / f"{fusion}-{FUSED_VERSION}-{base_sha256[:24]}.onnx"
    multi_head = fusion == "transformer-mha"
    return produce(
        out, lambda tmp: out.with_suffix(".json").write_text(json.dumps(fuse_transformer(base_path, tmp, multi_head)))
    )


def fused_ops(path: Path) -> dict[str, int]:
    """The fused-op counts kept beside a model :func:`fused_path` made."""
    return json.loads(path.with_suffix(".json").read_text())


FUSABLE_OPS = frozenset({"LayerNormalization", "ReduceMean", "Erf", "Gelu", "Tanh", "Softmax"})
"""Operators one of the optimizer's patterns starts from (layer norms, GELUs, attention's softmax):
a graph with none of them has nothing to fuse, and the optimizer (a minute on a large model) is
not run on it."""


def graph_ops(model: Any) -> set[str]:
    """The operator types of an ONNX model, its control-flow bodies and local functions included."""
    return {node.op_type for node in every_node(model.graph, *model.functions)}


def fusion_knobs(
    model: ModelInfo, fusions: tuple[str, ...], cache_dir: Path, ops: set[str], note: Callable[[str], None]
) -> list[Knob]:
    """A ``graph_fusion`` knob where the backend runs fused graphs and the fusion changes this model
    (whose operator types are ``ops``): ``transformer`` where it fuses anything, ``transformer-mha``
    too where that fuses attention into MultiHeadAttention (only then does it differ). A fusion that
    would change nothing is told to ``note``; it is not even tried where ``ops`` holds none of
    :data:`FUSABLE_OPS`.

    The fused models are made here, once, in ``cache_dir``: the candidates that use them find them
    there. A graph the optimizer fails on keeps the value: checking the space drops it and says why.
    """
    if "transformer" not in fusions:
        return []
    if not ops & FUSABLE_OPS:
        note("graph_fusion not searched: the model has no layer norm, GELU or softmax for the transformer fusion")
        return []
    try:
        counts = fused_ops(fused_path(model.path, model.sha256, "transformer", cache_dir))
    except TransformFailed:
        return [_knob(WITHOUT_MULTI_HEAD)]
    if not counts:
        note("graph_fusion not searched: the transformer fusion fuses nothing in this model")
        return []
    if "transformer-mha" not in fusions or "Attention" not in counts:
        return [_knob(WITHOUT_MULTI_HEAD)]
    try:
        multi_head = MULTI_HEAD in fused_ops(fused_path(model.path, model.sha256, "transformer-mha", cache_dir))
    except TransformFailed:
        multi_head = True
    return [_knob(FUSIONS if multi_head else WITHOUT_MULTI_HEAD)]


def _knob(values: tuple[str, ...]) -> Knob:
    what = (
        "ONNX Runtime transformer fusions (SkipLayerNorm, Gelu, Attention; -mha: attention as MultiHeadAttention), "
        "patch convolutions as matrix products, layer scales folded"
    )
    return Knob(FUSION_KNOB, values, "none", what)


def fusion_of(candidate: dict[str, Any]) -> str:
    """The candidate's graph fusion ("none" where the space has no such knob)."""
    return str(candidate.get(FUSION_KNOB, "none"))
