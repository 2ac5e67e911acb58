"""The knobs of PyTorch's Inductor compiler (``torch.compile``) worth searching, and what each
candidate asks of torch: the compiler's options, the weights' dtype, the TF32 and attention settings.

Every knob's default is torch's own, so the space's default is ``torch.compile(program)`` as it
comes. ``torch.compile``'s modes are presets of these options (``reduce-overhead``: CUDA graphs;
``max-autotune``: CUDA graphs, kernel autotuning and coordinate descent), so the space holds every
mode and the combinations between them.
"""

from __future__ import annotations

from typing import Any

from gpt_optuna.core.space import Candidate, Condition, Knob

PRECISION = "compute_precision"
CUDAGRAPHS = "cudagraphs"
MAX_AUTOTUNE = "max_autotune"
GEMM_BACKENDS = "gemm_backends"
CONV_BACKENDS = "conv_backends"
COORDINATE_DESCENT = "coordinate_descent_tuning"
EPILOGUE_FUSION = "epilogue_fusion"
LAYOUT_OPTIMIZATION = "layout_optimization"
FREEZING = "freezing"
SDPA_BACKEND = "sdpa_backend"

GPU_PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
CPU_PRECISIONS = ("fp32", "bf16")
SDPA_BACKENDS = ("default", "flash", "efficient", "cudnn", "math")
DEFAULT_GEMM_BACKENDS = "ATEN,TRITON,CPP"
DEFAULT_CONV_BACKENDS = "ATEN,TRITON"

OPTION_OF = {
    CUDAGRAPHS: "triton.cudagraphs",
    MAX_AUTOTUNE: "max_autotune",
    GEMM_BACKENDS: "max_autotune_gemm_backends",
    CONV_BACKENDS: "max_autotune_conv_backends",
    COORDINATE_DESCENT: "coordinate_descent_tuning",
    EPILOGUE_FUSION: "epilogue_fusion",
    LAYOUT_OPTIMIZATION: "layout_optimization",
    FREEZING: "freezing",
}
"""Knob -> the ``torch._inductor.config`` option it sets (``torch.compile(options=...)``)."""


def inductor_knobs(on_gpu: bool, has_attention: bool, has_convolution: bool) -> list[Knob]:
    """The space for a program on the GPU (``on_gpu``) or the CPU; the attention backend only where
    the program calls ``scaled_dot_product_attention``, the convolution backends only where it has
    convolutions. Pure, so it is unit-tested directly."""
    autotuned = Condition(MAX_AUTOTUNE, (True,))
    precisions = GPU_PRECISIONS if on_gpu else CPU_PRECISIONS
    knobs = [
        Knob(
            PRECISION,
            precisions,
            "fp32",
            "fp32: float32 weights with torch's TF32 defaults; tf32: TF32 matmuls too; fp16/bf16: weights and"
            " floating inputs cast",
        ),
        Knob(FREEZING, (False, True), False, "fold the weights into the graph as constants"),
        Knob(EPILOGUE_FUSION, (True, False), True, "fuse pointwise work into matmul templates"),
    ]
    if on_gpu:
        knobs.insert(1, Knob(CUDAGRAPHS, (False, True), False, "replay the compiled model as a CUDA graph"))
        knobs.append(Knob(LAYOUT_OPTIMIZATION, (True, False), True, "channels-last layouts for convolutions"))
        knobs.append(Knob(COORDINATE_DESCENT, (False, True), False, "tune each Triton kernel's launch parameters"))
    knobs.append(Knob(MAX_AUTOTUNE, (False, True), False, "benchmark kernel choices for matmuls and convolutions"))
    gemm = ("ATEN,TRITON", "TRITON", "ATEN") if on_gpu else ("ATEN,CPP", "CPP", "ATEN")
    knobs.append(
        Knob(GEMM_BACKENDS, (DEFAULT_GEMM_BACKENDS, *gemm), DEFAULT_GEMM_BACKENDS, "matmul kernels", autotuned)
    )
    if on_gpu and has_convolution:
        conv = (DEFAULT_CONV_BACKENDS, "ATEN", "TRITON")
        knobs.append(Knob(CONV_BACKENDS, conv, DEFAULT_CONV_BACKENDS, "convolution kernels", autotuned))
    if on_gpu and has_attention:
        knobs.append(Knob(SDPA_BACKEND, SDPA_BACKENDS, "default", "scaled_dot_product_attention's kernel"))
    return knobs


def compile_options(candidate: Candidate) -> dict[str, Any]:
    """The ``torch.compile(options=...)`` of a candidate: the options its knobs set (an absent knob
    leaves torch's default)."""
    return {option: candidate[knob] for knob, option in OPTION_OF.items() if knob in candidate}
