"""Raising a graph's ONNX opset where a transform needs operators or attributes of a newer one."""

from __future__ import annotations

from typing import Any

PER_CHANNEL_QDQ = 13
"""QuantizeLinear/DequantizeLinear take an ``axis`` (per-channel scales) from opset 13."""
FLOAT8_QDQ = 19
"""Q/DQ take float8 types from opset 19."""
LAYER_NORMALIZATION = 17
"""LayerNormalization is an ONNX operator from opset 17."""
BFLOAT16_CONV = 22
"""Conv and most other compute operators admit bfloat16 from opset 22."""


def default_opset(model: Any) -> int:
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)


def at_least(model: Any, version: int) -> Any:
    """The model itself if its default-domain opset is ``version`` or newer, else a copy converted
    with ``onnx.version_converter`` (which raises where it cannot convert an operator)."""
    if default_opset(model) >= version:
        return model
    from onnx import version_converter

    converted = version_converter.convert_version(model, version)
    if default_opset(converted) < version:
        raise ValueError(f"onnx.version_converter left the model at opset {default_opset(converted)}")
    return converted
