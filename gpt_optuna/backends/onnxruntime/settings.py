"""ONNX Runtime's providers, options and the session settings a candidate maps to."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpt_optuna.backends.base import ExportedTrial
from gpt_optuna.core.errors import MissingDependencyError, UserError
from gpt_optuna.core.log import onnxruntime_severity
from gpt_optuna.core.space import Candidate, Value
from gpt_optuna.graph.model import one_line

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"
GPU_PROVIDERS = (CUDA, TENSORRT)

CUDA_GRAPH = "cuda.enable_cuda_graph"
NHWC = "cuda.prefer_nhwc"
FUSE_CONV_BIAS = "cuda.fuse_conv_bias"
GRAPH_LEVEL = "graph_optimization_level"

OPTIONAL_GRAPH_LEVELS = ("ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_LAYOUT")
"""The graph levels below ``ORT_ENABLE_ALL`` (offered where the installed version has them), in the
order of their numbers in a user's configuration."""
EXECUTION_MODES = ("ORT_SEQUENTIAL", "ORT_PARALLEL")
"""The CPU provider's execution modes, in the order of their numbers."""


@dataclass(frozen=True)
class ProviderOption:
    """A provider option every version has, set by a knob: read and written by this row alone (the
    candidate's options, a user's configuration read back, Triton's accelerator). ``triton``: the
    name Triton's ONNX Runtime backend takes it under (None: Triton has no field for it, and an
    export to Triton says so); ``absent``: its value where a space lacks the knob (None: every
    space of the provider has it)."""

    provider: str
    option: str
    knob: str
    triton: str | None
    absent: Value | None = None


PROVIDER_OPTIONS = (
    ProviderOption(CUDA, "cudnn_conv_algo_search", "cuda.cudnn_conv_algo_search", "cudnn_conv_algo_search"),
    ProviderOption(CUDA, "use_tf32", "cuda.use_tf32", "use_tf32"),
    ProviderOption(CUDA, "prefer_nhwc", NHWC, "prefer_nhwc"),
    ProviderOption(CUDA, "enable_cuda_graph", CUDA_GRAPH, "enable_cuda_graph", absent=False),
    ProviderOption(
        CUDA, "cudnn_conv_use_max_workspace", "cuda.cudnn_conv_use_max_workspace", "cudnn_conv_use_max_workspace"
    ),
    ProviderOption(
        TENSORRT, "trt_builder_optimization_level", "trt.builder_optimization_level", "trt_builder_optimization_level"
    ),
    ProviderOption(TENSORRT, "trt_fp16_enable", "trt.fp16", "precision_mode"),  # FP16 where on
    ProviderOption(TENSORRT, "trt_cuda_graph_enable", "trt.cuda_graph", "trt_cuda_graph_enable"),
    ProviderOption(TENSORRT, "trt_auxiliary_streams", "trt.auxiliary_streams", "trt_auxiliary_streams"),
)
"""The provider options every version has, in the order a session is given them."""


def option_text(value: Value) -> str:
    """A knob's value as a provider option string (a flag: 1 or 0)."""
    return ("1" if value else "0") if isinstance(value, bool) else str(value)


@dataclass(frozen=True)
class CudaOption:
    """A setting of sessions on the CUDA provider beyond the five every version has: provider
    options (``keys``, searched where the installed provider has them all) or a session config
    entry (``entry``, searched from ONNX Runtime version ``since``), offered where the model has an
    operator it acts on (``ops``; None: every model), or one that fusions make those from
    (``precursors``): checking the space then keeps it for the graphs that run such an operator
    after ONNX Runtime's own optimizations. A boolean knob sets each key to 1 or 0."""

    knob: str
    keys: tuple[str, ...]
    choices: tuple[Value, ...]
    default: Value
    help: str
    ops: frozenset[str] | None = None
    entry: str | None = None
    since: tuple[int, int] = (0, 0)
    precursors: frozenset[str] = frozenset()


_ATTENTION = frozenset(
    {"Attention", "MultiHeadAttention", "GroupQueryAttention", "PackedAttention", "PackedMultiHeadAttention"}
)


_GEMM = frozenset({"MatMul", "Gemm", "FusedMatMul"})


CUDA_OPTIONS = (
    CudaOption(
        FUSE_CONV_BIAS, ("fuse_conv_bias",), (False, True), False,
        "convolution and bias as one cuDNN-frontend kernel", frozenset({"Conv", "FusedConv"}),
    ),
    CudaOption(
        "cuda.conv1d_pad_to_nc1d", ("cudnn_conv1d_pad_to_nc1d",), (False, True), False,
        "1-D convolutions run as [N, C, 1, D] rather than [N, C, D, 1]", frozenset({"Conv1D"}),
    ),
    CudaOption(
        "cuda.sdpa_kernel", ("sdpa_kernel",), (0, 1, 2, 4, 8, 16), 0,
        "attention kernel: 0 ONNX Runtime's choice, 1 flash, 2 memory-efficient, 4 TensorRT fused, 8 cuDNN flash,"
        " 16 unfused (the others fall back to it where they do not apply)", _ATTENTION,
        precursors=frozenset({"Softmax"}),
    ),
    CudaOption(
        "cuda.skip_layer_norm_strict", ("enable_skip_layer_norm_strict_mode",), (False, True), False,
        "SkipLayerNormalization through the plain LayerNorm kernel (slower, more accurate in fp16)",
        frozenset({"LayerNormalization", "SkipLayerNormalization", "SkipSimplifiedLayerNormalization"}),
    ),
    CudaOption(
        "cuda.unified_stream", ("use_ep_level_unified_stream",), (False, True), False,
        "one CUDA stream for every run rather than one per run",
    ),
    CudaOption(
        "cuda.gemm_auto_tune", (), (False, True), False,
        "time cuBLAS against GEMV kernels for fp16/bf16 GEMMs with few rows, keep the fastest", _GEMM,
        entry="ep.cuda.enable_gemm_auto_tune", since=(1, 31),
    ),
    CudaOption(
        "cuda.gelu_approximation", (), (False, True), False,
        "Gelu by its tanh approximation (slightly different results)", frozenset({"Erf", "Gelu", "BiasGelu"}),
        entry="optimization.enable_gelu_approximation",
    ),
)  # fmt: skip
"""Options of the CUDA provider that can change latency, beyond the five every version has."""


def ort_module() -> Any:
    """``onnxruntime``, imported; one line where it is not installed, or is but fails to import (a
    broken install: a shared library missing, a version clash)."""
    try:
        import onnxruntime
    except (ImportError, OSError) as exc:
        if isinstance(exc, ModuleNotFoundError) and exc.name == "onnxruntime":
            raise MissingDependencyError("ONNX Runtime", "cpu") from exc
        raise UserError(f"ONNX Runtime is installed but fails to import: {one_line(exc)}") from exc
    return onnxruntime


def thread_choices(cores: int) -> tuple[int, ...]:
    """0 (the library's own choice), then powers of two up to the core count, and the count."""
    counts = {0, cores}
    n = 1
    while n < cores:
        counts.add(n)
        n *= 2
    return tuple(sorted(counts))


def _probe_session(ort: Any, provider: str) -> Any:
    """A session of a one-node model on ``provider`` alone, logging nothing; raises where none starts."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "probe", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.log_severity_level = 4
    return ort.InferenceSession(model.SerializeToString(), options, providers=[provider])


def usable_providers() -> list[str]:
    """Providers, in order of preference, that really create a session on this machine."""
    ort = ort_module()
    listed = ort.get_available_providers()
    if any(p in listed for p in GPU_PROVIDERS) and hasattr(ort, "preload_dlls"):
        with contextlib.suppress(Exception):  # a missing CUDA library shows up in the probe below
            ort.preload_dlls()
    usable = []
    for provider in (*GPU_PROVIDERS, CPU):
        if provider not in listed:
            continue
        try:
            session = _probe_session(ort, provider)
        except Exception:
            continue
        if session.get_providers()[:1] == [provider]:
            usable.append(provider)
    return usable


def cuda_option_keys() -> frozenset[str]:
    """The CUDA provider's option names in the installed ONNX Runtime (none where it cannot start)."""
    try:
        session = _probe_session(ort_module(), CUDA)
    except Exception:
        return frozenset()
    return frozenset(session.get_provider_options().get(CUDA, {}))


def ort_version() -> tuple[int, int]:
    major, minor, *_ = ort_module().__version__.split(".")
    return int(major), int(minor)


def session_settings(candidate: Candidate) -> dict[str, Any]:
    """A candidate's session-level knobs in ONNX Runtime's own names: ``SessionOptions``
    attributes (enum members by name) and session config entries (``add_session_config_entry``)."""
    attributes: dict[str, Any] = {
        "graph_optimization_level": str(candidate[GRAPH_LEVEL]),
        "enable_mem_pattern": bool(candidate["mem_pattern"]),
    }
    entries: dict[str, str] = {}
    if candidate["provider"] == CPU:
        attributes |= {
            "execution_mode": str(candidate["execution_mode"]),
            "intra_op_num_threads": int(candidate["intra_op_num_threads"]),
            "inter_op_num_threads": int(candidate.get("inter_op_num_threads", 0)),
            "enable_cpu_mem_arena": bool(candidate["cpu_mem_arena"]),
        }
        entries = {
            "session.intra_op.allow_spinning": "1" if candidate["intra_op_spinning"] else "0",
            "session.set_denormal_as_zero": "1" if candidate["denormal_as_zero"] else "0",
        }
    for option in CUDA_OPTIONS:  # the CUDA session entries the space has
        if option.entry is not None and option.knob in candidate:
            entries[option.entry] = "1" if candidate[option.knob] else "0"
    return {"session_options": attributes, "session_config_entries": entries}


_ENUMS = {"graph_optimization_level": "GraphOptimizationLevel", "execution_mode": "ExecutionMode"}


def options_from_settings(settings: dict[str, Any]) -> Any:
    """``onnxruntime.SessionOptions`` from :func:`session_settings`' description."""
    ort = ort_module()
    options = ort.SessionOptions()
    for name, value in settings["session_options"].items():
        setattr(options, name, getattr(getattr(ort, _ENUMS[name]), value) if name in _ENUMS else value)
    for key, value in settings["session_config_entries"].items():
        options.add_session_config_entry(key, value)
    return options


def session_options(candidate: Candidate) -> Any:
    """Map a candidate's session-level knobs onto ``onnxruntime.SessionOptions``."""
    options = options_from_settings(session_settings(candidate))
    options.log_severity_level = onnxruntime_severity()
    return options


def provider_options(candidate: Candidate, stream_ptr: int | None, caches: Path) -> dict[str, str]:
    """Map a candidate's provider knobs onto the provider's option strings."""
    provider = candidate["provider"]
    if provider not in GPU_PROVIDERS:
        return {}
    options = {"device_id": "0"}
    for row in PROVIDER_OPTIONS:
        if row.provider == provider:
            value = candidate[row.knob] if row.absent is None else candidate.get(row.knob, row.absent)
            options[row.option] = option_text(value)
    if provider == CUDA:
        for option in CUDA_OPTIONS:  # the provider options the space has
            if option.keys and option.knob in candidate:
                options |= dict.fromkeys(option.keys, option_text(candidate[option.knob]))
    else:
        options |= {"trt_timing_cache_enable": "1", "trt_timing_cache_path": str(caches)}
    if stream_ptr is not None:
        options["has_user_compute_stream"] = "1"
        options["user_compute_stream"] = str(stream_ptr)
    return options


def side_file(trial: ExportedTrial) -> dict[str, Any]:
    """How ONNX Runtime must open the exported model to run it as the trial did, in its own names
    (``gpt_optuna.open_session`` applies it); a TensorRT-provider timing cache goes beside the model."""
    candidate = dict(trial.defaults) | dict(trial.params)
    options = provider_options(candidate, None, trial.out.parent.resolve())
    return {"onnxruntime": session_settings(candidate) | {"providers": [[candidate["provider"], options]]}}
