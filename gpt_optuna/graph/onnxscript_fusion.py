"""The onnxscript rewriter's ONNX Runtime fusions as a graph transform.

``onnxscript.rewriter.ort_fusions`` is the fusion set maintained for graphs as torch's exporters
write them: scaled-dot-product attention into MultiHeadAttention, Attention or GroupQueryAttention
(grouped K/V heads, rotary embeddings inside), RMSNorm and skip RMSNorm, skip layer norms, GELU
and bias GELU, rotary embeddings and their cos/sin caches, after its own constant folding and
shape simplification. Like ONNX Runtime's transformer optimizer it writes ONNX Runtime's own
operators, and it matches exports that optimizer does not (a Llama-style decoder's RMSNorm and
rotary embeddings), and the other way round.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from gpt_optuna.core.errors import MissingDependencyError
from gpt_optuna.graph.ort_fusion import gained_ops, quiet


def fuse_onnxscript(source: Path, out: Path) -> dict[str, int]:
    """Write the model fused by onnxscript's ONNX Runtime fusions to ``out``; return how many of
    each fused operator it gained."""
    if importlib.util.find_spec("onnxscript") is None:
        raise MissingDependencyError("onnxscript (its ONNX Runtime fusions)", "cpu")
    import onnx
    import onnx_ir as ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    original = onnx.load(str(source))  # weights in other files read in: the fused model holds them
    with quiet("onnxscript"):
        fused, _ = optimize_for_ort(ir.from_proto(original))
    proto = ir.to_proto(fused)
    onnx.save(proto, str(out))
    return gained_ops(original, proto)
