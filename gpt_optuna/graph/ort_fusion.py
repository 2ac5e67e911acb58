"""ONNX Runtime's transformer optimizer as a graph transform, with the model type that fits.

ONNX Runtime's own graph optimizer leaves most of a transformer as small kernels; its transformer
optimizer rewrites the decomposed patterns into fused contrib operators (SkipLayerNormalization,
BiasGelu, Attention, ...), which cut the kernel count and run well in fp16. The fused graph uses
ONNX Runtime's own operators, so only ONNX Runtime can run it. Constants are folded first (ONNX
Runtime's basic level, on the CPU), so weights stored compressed and expanded in the graph become
plain initializers the fusion patterns recognise, and attention as torch's dynamo exporter writes
it is rewritten into the form the attention fusion matches (:mod:`gpt_optuna.graph.attention_rewrite`);
attention with one packed Q/K/V projection (``torch.nn.MultiheadAttention``, vision transformers)
is fused directly (:mod:`gpt_optuna.graph.packed_attention`), patch convolutions become matrix
products (:mod:`gpt_optuna.graph.patch_convolution`) and per-channel layer scales are folded into
the projection before them (:mod:`gpt_optuna.graph.layer_scale`). The optimizer's model type
decides which of its fusions run (``gpt2``: GPT-2's attention and FastGelu; ``unet``: group norms,
NHWC convolutions, split GELU, packed K/V; ``clip``: CLIP's attention); head count and hidden size
are found in the graph. ``multi_head`` fuses attention into MultiHeadAttention instead of Attention
(the operator the CUDA provider runs with its flash, memory-efficient and cuDNN kernels), a
key-padding mask given to it as an attention bias, which its memory-efficient kernel takes
(:mod:`gpt_optuna.graph.mask_bias`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpt_optuna.core.errors import MissingDependencyError
from gpt_optuna.core.log import onnxruntime_options
from gpt_optuna.graph import opset
from gpt_optuna.graph.attention_rewrite import rewrite_attention
from gpt_optuna.graph.layer_scale import fold_layer_scales
from gpt_optuna.graph.mask_bias import masks_as_bias
from gpt_optuna.graph.model import ONNXRUNTIME_DEFAULT_DOMAIN_OPS
from gpt_optuna.graph.packed_attention import rewrite_packed_attention
from gpt_optuna.graph.patch_convolution import rewrite_patch_convolutions

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def quiet(library: str) -> Iterator[None]:
    """A fusion library logs and warns per pattern it tries (the optimizer) or constant it cannot
    fold (onnxscript); keep that out of the tuner's output."""
    logger = logging.getLogger(library)
    level = logger.level
    logger.setLevel(logging.CRITICAL)
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

    options = onnxruntime_options(ort)
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(out)
    ort.InferenceSession(
        str(source), options, providers=["CPUExecutionProvider"], disabled_optimizers=["MatMulAddFusion"]
    )


def fuse_transformer(source: Path, out: Path, model_type: str = "bert", multi_head: bool = False) -> dict[str, int]:
    """Write the model fused by ONNX Runtime's optimizer as ``model_type`` to ``out``, attention
    fused into MultiHeadAttention where ``multi_head``; return how many of each fused op it gained
    (:func:`gained_ops`: those the model had already, e.g. LayerNormalization, do not count)."""
    if importlib.util.find_spec("sympy") is None:  # the optimizer's shape inference needs it
        raise MissingDependencyError("sympy (ONNX Runtime's transformer optimizer)", "cpu")
    import onnx
    from onnxruntime.transformers import optimizer
    from onnxruntime.transformers.fusion_options import FusionOptions

    raised, folded = (out.with_name(f"{out.stem}.{step}.onnx") for step in ("raised", "folded"))
    original = onnx.load(str(source))
    try:
        # the optimizer writes ONNX's LayerNormalization, an operator of opset 17 (a copy only where
        # the model is older: writing a large model takes seconds)
        at_17 = opset.at_least(original, opset.LAYER_NORMALIZATION)
        if at_17 is not original:
            onnx.save(at_17, str(raised))
        fold_constants(raised if at_17 is not original else source, folded)
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
    options = FusionOptions(model_type)
    options.use_raw_attention_mask(True)  # a mask index (sequence lengths) would assume right padding
    options.use_multi_head_attention = multi_head
    with quiet("onnxruntime.transformers"):
        fused = optimizer.optimize_model(
            model, model_type=model_type, opt_level=0, use_gpu=True, optimization_options=options
        )
    if multi_head:
        rewritten, skipped = masks_as_bias(fused.model)
        logger.debug("key-padding masks given as attention biases: %d; left: %s", rewritten, skipped)
    # ONNX's checker knows not ONNX Runtime's operators of the default domain (SimplifiedLayerNormalization):
    # that the graph loads is what checking the space proves, with the provider that runs it
    fused.save_model_to_file(str(out))
    return gained_ops(original, fused.model)


FUSED_DEFAULT_DOMAIN = frozenset({"LayerNormalization", "RMSNormalization", *ONNXRUNTIME_DEFAULT_DOMAIN_OPS})
"""Fused operators of the default domain (ONNX's, and ONNX Runtime's own registered there); the
others fusions make are in ONNX Runtime's ``com.microsoft`` domain."""


def gained_ops(original: Any, fused: Any) -> dict[str, int]:
    """How many of each fused operator the ``fused`` ONNX model has beyond the ``original``'s."""

    def fused_counts(model: Any) -> Counter[str]:
        return Counter(
            node.op_type
            for node in model.graph.node
            if node.domain == "com.microsoft"
            or (node.domain in ("", "ai.onnx") and node.op_type in FUSED_DEFAULT_DOMAIN)
        )

    had = fused_counts(original)
    return {op: n - had[op] for op, n in fused_counts(fused).items() if n > had[op]}
