"""ONNX Runtime: CPU, CUDA and TensorRT execution providers.

Only providers that can actually create a session here are offered: ONNX Runtime lists
providers it cannot start (TensorRT without libnvinfer) and silently falls back to CPU, so each
one is probed with a real session on a one-node model.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpt_optuna.backends.base import CANNOT_RUN, Backend, BuildError, Built, KnobLimit, Runner, import_cupy
from gpt_optuna.errors import MissingDependencyError
from gpt_optuna.model import Feeds, ModelInfo, ShapeRange, synthetic_feeds
from gpt_optuna.space import Candidate, Condition, Knob, Space, Value

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"
GPU_PROVIDERS = (CUDA, TENSORRT)
CUDA_GRAPH = "cuda.enable_cuda_graph"
NHWC = "cuda.prefer_nhwc"
FUSE_CONV_BIAS = "cuda.fuse_conv_bias"
GRAPH_LEVEL = "graph_optimization_level"

_OPTIONAL_GRAPH_LEVELS = ("ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_LAYOUT")


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


def _ort() -> Any:
    try:
        import onnxruntime
    except ImportError as exc:
        raise MissingDependencyError("ONNX Runtime", "cpu") from exc
    return onnxruntime


def thread_choices(cores: int) -> tuple[int, ...]:
    """0 (the library's own choice), then powers of two up to the core count, and the count."""
    counts = {0, cores}
    n = 1
    while n < cores:
        counts.add(n)
        n *= 2
    return tuple(sorted(counts))


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _probe_model_bytes() -> bytes:
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "probe", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString()


def usable_providers() -> list[str]:
    """Providers, in order of preference, that really create a session on this machine."""
    ort = _ort()
    listed = ort.get_available_providers()
    if any(p in listed for p in GPU_PROVIDERS) and hasattr(ort, "preload_dlls"):
        with contextlib.suppress(Exception):  # a missing CUDA library shows up in the probe below
            ort.preload_dlls()
    usable = []
    probe = _probe_model_bytes()
    options = ort.SessionOptions()
    options.log_severity_level = 4
    for provider in (*GPU_PROVIDERS, CPU):
        if provider not in listed:
            continue
        try:
            session = ort.InferenceSession(probe, options, providers=[provider])
        except Exception:
            continue
        if session.get_providers()[:1] == [provider]:
            usable.append(provider)
    return usable


def discover_knobs(
    providers: list[str], graph_levels: list[str], cores: int, cuda_options: tuple[CudaOption, ...] = ()
) -> list[Knob]:
    """The ONNX Runtime search space for the usable providers, with ``cuda_options`` (those that
    apply here: :func:`applicable_cuda_options`); pure, so it is unit-tested directly.

    Where a GPU provider works, only GPU providers are searched: a CPU run of a model sized for a
    GPU wastes minutes per trial. Every usable provider's knobs are still described, so
    ``[space] provider = "CPUExecutionProvider"`` tunes the CPU on a GPU machine.
    """
    searched = tuple(p for p in providers if p in GPU_PROVIDERS) or (CPU,)
    knobs = [
        Knob("provider", searched, searched[0], "execution provider", selects_engine=True),
        Knob(GRAPH_LEVEL, tuple(graph_levels), "ORT_ENABLE_ALL", "graph rewrites before running"),
        Knob("mem_pattern", (True, False), True, "plan memory from the first run's allocation pattern"),
    ]
    on = {p: Condition("provider", (p,)) for p in providers}
    threads = thread_choices(cores)
    if CPU in providers:
        knobs += [
            Knob("execution_mode", ("ORT_SEQUENTIAL", "ORT_PARALLEL"), "ORT_SEQUENTIAL", condition=on[CPU]),
            Knob("intra_op_num_threads", threads, 0, "threads inside one operator", on[CPU]),
            Knob(
                "inter_op_num_threads",
                threads,
                0,
                "threads across operators",
                Condition("execution_mode", ("ORT_PARALLEL",)),
            ),
            Knob("intra_op_spinning", (True, False), True, "spin-wait for work", on[CPU]),
            Knob("cpu_mem_arena", (True, False), True, "arena allocator for CPU memory", on[CPU]),
            Knob("denormal_as_zero", (False, True), False, "flush denormals to zero", on[CPU]),
        ]
    if CUDA in providers:
        knobs += [
            Knob(
                "cuda.cudnn_conv_algo_search", ("EXHAUSTIVE", "HEURISTIC", "DEFAULT"), "EXHAUSTIVE", condition=on[CUDA]
            ),
            Knob("cuda.use_tf32", (True, False), True, "TF32 math in convolutions and GEMMs", on[CUDA]),
            Knob(NHWC, (False, True), False, "NHWC layout for convolutions", on[CUDA]),
            Knob(CUDA_GRAPH, (False, True), False, "replay the run as one CUDA graph", on[CUDA]),
            Knob("cuda.cudnn_conv_use_max_workspace", (True, False), True, "largest cuDNN workspace", on[CUDA]),
            *(Knob(o.knob, o.choices, o.default, o.help, on[CUDA]) for o in cuda_options),
        ]
    if TENSORRT in providers:
        knobs += [
            Knob("trt.builder_optimization_level", (3, 0, 1, 2, 4, 5), 3, "TensorRT builder effort", on[TENSORRT]),
            Knob("trt.fp16", (False, True), False, "allow fp16 kernels", on[TENSORRT]),
            Knob("trt.cuda_graph", (False, True), False, "replay the run as one CUDA graph", on[TENSORRT]),
            Knob("trt.auxiliary_streams", (-1, 0, 1, 2), -1, "auxiliary streams (-1: heuristic)", on[TENSORRT]),
        ]
    return knobs


def cuda_option_keys() -> frozenset[str]:
    """The CUDA provider's option names in the installed ONNX Runtime (none where it cannot start)."""
    ort = _ort()
    options = ort.SessionOptions()
    options.log_severity_level = 4
    try:
        session = ort.InferenceSession(_probe_model_bytes(), options, providers=[CUDA])
    except Exception:
        return frozenset()
    return frozenset(session.get_provider_options().get(CUDA, {}))


def model_ops(path: Path) -> frozenset[str]:
    """The operator types of a model, with ``Conv1D`` for a convolution over one spatial axis."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    ranks = {t.name: len(t.dims) for t in graph.initializer}
    ops = {node.op_type for node in graph.node}
    if any(node.op_type == "Conv" and ranks.get(node.input[1]) == 3 for node in graph.node if len(node.input) > 1):
        ops.add("Conv1D")
    return frozenset(ops)


def applicable_cuda_options(
    keys: frozenset[str], version: tuple[int, int], ops: frozenset[str]
) -> tuple[CudaOption, ...]:
    """The extra CUDA settings the installed version has (provider option ``keys``, ``version``)
    that act on the model (``ops``)."""
    return tuple(
        o
        for o in CUDA_OPTIONS
        if set(o.keys) <= keys and version >= o.since and (o.ops is None or (o.ops | o.precursors) & ops)
    )


def optimized_ops(model: ModelInfo, candidate: Candidate, workdir: Path) -> frozenset[str]:
    """The operator types a session of ``model`` configured as ``candidate`` runs: the graph's own
    and those ONNX Runtime's optimizations make at session creation (``Gelu``, ``Attention``...);
    the graph's own alone where ONNX Runtime cannot write its optimized copy."""
    ort = _ort()
    options = session_options(candidate)
    providers = [(candidate["provider"], provider_options(candidate, None, workdir))]
    with tempfile.TemporaryDirectory(dir=workdir) as folder:
        optimized = Path(folder) / "optimized.onnx"
        options.optimized_model_filepath = str(optimized)
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name", "weights.bin")
        options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        try:
            ort.InferenceSession(str(model.path), options, providers=providers)
            return model_ops(model.path) | model_ops(optimized)
        except Exception:  # the session itself was made before: only the copy failed
            return model_ops(model.path)


def operator_limits(space: Space, ops: frozenset[str]) -> list[KnobLimit]:
    """The CUDA settings of ``space`` that act on operators none of ``ops`` is: not for this graph."""
    names = {k.name for k in space.knobs}
    return [
        KnobLimit(o.knob, None, f"no {'/'.join(sorted(o.ops))} operator runs in this graph")
        for o in CUDA_OPTIONS
        if o.knob in names and o.ops is not None and not o.ops & ops
    ]


def where_it_works(
    knob: str, axes: tuple[str, ...], knobs: dict[str, Knob], works: Callable[[Candidate], str | None]
) -> KnobLimit | None:
    """``knob``'s limit from trying it at every setting of ``axes`` (``works`` says why not, or
    None where it works): None where it works everywhere."""
    settings = tuple(itertools.product(*(knobs[name].choices for name in axes)))
    refused = {s: why for s in settings if (why := works(dict(zip(axes, s, strict=True)))) is not None}
    if not refused:
        return None
    working = tuple(s for s in settings if s not in refused)
    first = next(iter(refused.values()))
    if not working:
        return KnobLimit(knob, None, f"with any {'/'.join(axes)}: {first}" if axes else first)
    where = "; ".join(", ".join(f"{a}={v}" for a, v in zip(axes, s, strict=True)) for s in refused)
    return KnobLimit(knob, Condition(axes, working), f"{where}: {first}")


def ort_version() -> tuple[int, int]:
    major, minor, *_ = _ort().__version__.split(".")
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
    ort = _ort()
    options = ort.SessionOptions()
    for name, value in settings["session_options"].items():
        setattr(options, name, getattr(getattr(ort, _ENUMS[name]), value) if name in _ENUMS else value)
    for key, value in settings["session_config_entries"].items():
        options.add_session_config_entry(key, value)
    return options


def session_options(candidate: Candidate) -> Any:
    """Map a candidate's session-level knobs onto ``onnxruntime.SessionOptions``."""
    options = options_from_settings(session_settings(candidate))
    options.log_severity_level = 3
    return options


def provider_options(candidate: Candidate, stream_ptr: int | None, workdir: Path) -> dict[str, str]:
    """Map a candidate's provider knobs onto the provider's option strings."""
    provider = candidate["provider"]

    def flag(value: Value) -> str:
        return "1" if value else "0"

    if provider == CUDA:
        options = {
            "device_id": "0",
            "cudnn_conv_algo_search": str(candidate["cuda.cudnn_conv_algo_search"]),
            "use_tf32": flag(candidate["cuda.use_tf32"]),
            "prefer_nhwc": flag(candidate[NHWC]),
            "enable_cuda_graph": flag(candidate.get(CUDA_GRAPH, False)),
            "cudnn_conv_use_max_workspace": flag(candidate["cuda.cudnn_conv_use_max_workspace"]),
        }
        for option in CUDA_OPTIONS:  # the provider options the space has
            if option.keys and option.knob in candidate:
                value = candidate[option.knob]
                options |= {key: flag(value) if isinstance(value, bool) else str(value) for key in option.keys}
    elif provider == TENSORRT:
        options = {
            "device_id": "0",
            "trt_builder_optimization_level": str(candidate["trt.builder_optimization_level"]),
            "trt_fp16_enable": flag(candidate["trt.fp16"]),
            "trt_cuda_graph_enable": flag(candidate["trt.cuda_graph"]),
            "trt_auxiliary_streams": str(candidate["trt.auxiliary_streams"]),
            "trt_timing_cache_enable": "1",
            "trt_timing_cache_path": str(workdir),
        }
    else:
        return {}
    if stream_ptr is not None:
        options["has_user_compute_stream"] = "1"
        options["user_compute_stream"] = str(stream_ptr)
    return options


OPERATOR_FAILED = "Non-zero status code returned while running"
"""How ONNX Runtime words an operator's kernel failing on its inputs."""
MACHINE_TROUBLE = ("out of memory", "failed to allocate", "alloc_failed", "cuda failure", "cuda error")
"""Words of an operator failure that may be the machine's (memory, a CUDA fault), not the candidate's."""


def refusal(error: Exception) -> str | None:
    """The operator failure ``error`` reports, where it is the candidate's: the same graph and
    settings fail the same way on every try (an operator the settings cannot run). None otherwise."""
    message = str(error)
    if OPERATOR_FAILED not in message or any(word in message.lower() for word in MACHINE_TROUBLE):
        return None
    return message[message.index(OPERATOR_FAILED) :].splitlines()[0]


class OnnxRuntimeBackend(Backend):
    """ONNX Runtime with whichever of the CPU, CUDA and TensorRT providers work here."""

    name = "onnxruntime"

    def missing_library(self) -> MissingDependencyError | None:
        import importlib.util

        return None if importlib.util.find_spec("onnxruntime") else MissingDependencyError("ONNX Runtime", "cpu")

    def refused_run(self, error: Exception) -> str | None:
        return refusal(error)

    def space(self, model: ModelInfo, shapes: dict[str, ShapeRange]) -> Space:
        ort = _ort()
        levels = [
            lvl for lvl in (*_OPTIONAL_GRAPH_LEVELS, "ORT_ENABLE_ALL") if hasattr(ort.GraphOptimizationLevel, lvl)
        ]
        providers = usable_providers()
        keys = cuda_option_keys() if CUDA in providers else frozenset()
        extras = applicable_cuda_options(keys, ort_version(), model_ops(model.path)) if keys else ()
        return Space(discover_knobs(providers, levels, usable_cores(), extras))

    def build(self, model: ModelInfo, candidate: Candidate, workdir: Path, shapes: dict[str, ShapeRange]) -> Built:
        ort = _ort()
        provider = str(candidate["provider"])
        stream = import_cupy().cuda.Stream(non_blocking=True) if provider in GPU_PROVIDERS else None
        options = session_options(candidate)
        providers = [(provider, provider_options(candidate, stream.ptr if stream else None, workdir))]
        start = time.perf_counter()
        try:
            session = ort.InferenceSession(str(model.path), options, providers=providers)
        except Exception as exc:
            raise BuildError(f"ONNX Runtime could not create the session: {exc}", str(exc)) from exc
        build_s = time.perf_counter() - start
        session.disable_fallback()  # a provider failing at a run fails the run: no silent retry on the CPU
        if session.get_providers()[:1] != [provider]:
            raise BuildError(
                f"{provider} could not take the model; ONNX Runtime fell back to {session.get_providers()[0]}"
            )
        return Built((session, stream), build_s)

    def check_model(
        self, model: ModelInfo, space: Space, candidate: Candidate, workdir: Path, shapes: dict[str, ShapeRange]
    ) -> list[KnobLimit]:
        """Create the default session; keep the CUDA settings that act on particular operators for
        the graphs that run one (after ONNX Runtime's optimizations); where the space offers CUDA
        graphs, find the graph levels and layouts (NHWC places some nodes on the CPU) at which a
        session can capture one: every node on the CUDA provider; where it offers cuDNN's conv-bias
        fusion for a graph with convolutions, find the layouts at which one inference runs with it
        (cuDNN's frontend finds no plan for some convolutions, and says so only when they run)."""
        self.build(model, candidate, workdir, shapes)
        knobs = {k.name: k for k in space.knobs}
        if candidate.get("provider") != CUDA:
            return []
        limits = operator_limits(space, optimized_ops(model, candidate, workdir))
        limited = {limit.knob for limit in limits}
        base = {**candidate, CUDA_GRAPH: False} if CUDA_GRAPH in candidate else candidate

        def captures(setting: Candidate) -> str | None:
            try:
                self.build(model, {**base, **setting, CUDA_GRAPH: True}, workdir, shapes)
            except BuildError as exc:
                return str(exc).splitlines()[0]
            return None

        def runs_fused(setting: Candidate) -> str | None:
            try:
                session, _ = self.build(model, {**base, **setting, FUSE_CONV_BIAS: True}, workdir, shapes).engine
                session.run(None, synthetic_feeds(model, shapes))
            except BuildError as exc:
                return str(exc).splitlines()[0]
            except Exception as exc:  # a refusal, or a fault that keeps the knob out where it came
                reason = refusal(exc)
                return (f"{CANNOT_RUN}: {reason}" if reason else f"{type(exc).__name__}: {exc}")[:300]
            return None

        for knob, axes, works in ((CUDA_GRAPH, (GRAPH_LEVEL, NHWC), captures), (FUSE_CONV_BIAS, (NHWC,), runs_fused)):
            if knob in knobs and len(knobs[knob].choices) > 1 and knob not in limited:
                limit = where_it_works(knob, tuple(a for a in axes if a in knobs), knobs, works)
                limits += [limit] if limit else []
        return limits

    def open(self, built: Built, feeds: Feeds, outputs: Feeds) -> Runner:
        session, stream = built.engine
        if stream is None:
            return _HostRunner(session, feeds)
        return _DeviceRunner(session, stream, feeds, outputs)

    def versions(self) -> dict[str, str]:
        return {"onnxruntime": _ort().__version__}

    def precisions(self) -> tuple[str, ...]:
        """fp16 and int8 Q/DQ graphs run on every provider; bf16 and fp8 kernels are missing."""
        return ("fp32", "fp16", "int8")

    def fusions(self) -> tuple[str, ...]:
        """The transformer fusions emit ONNX Runtime's own contrib operators."""
        return ("transformer", "transformer-mha")


class _HostRunner(Runner):
    def __init__(self, session: Any, feeds: Feeds) -> None:
        self._session = session
        self._feeds = feeds
        self._names = [o.name for o in session.get_outputs()]

    def infer(self) -> dict[str, np.ndarray]:
        return dict(zip(self._names, self._session.run(self._names, self._feeds), strict=True))

    def launch(self) -> None:
        self._session.run(self._names, self._feeds)

    def set_inputs(self, feeds: Feeds) -> None:
        self._feeds = feeds


class _DeviceRunner(Runner):
    """Inputs and outputs in CuPy buffers bound once; the session runs on the CuPy stream."""

    def __init__(self, session: Any, stream: Any, feeds: Feeds, outputs: Feeds) -> None:
        cp = import_cupy()
        self.stream = stream
        self._session = session
        self._binding = session.io_binding()
        with stream:
            self._inputs = {n: cp.asarray(a) for n, a in feeds.items()}
            self._outputs = {n: cp.empty(a.shape, a.dtype) for n, a in outputs.items()}
        stream.synchronize()
        for name, buf in self._inputs.items():
            self._binding.bind_input(name, "cuda", 0, buf.dtype, buf.shape, buf.data.ptr)
        for name, buf in self._outputs.items():
            self._binding.bind_output(name, "cuda", 0, buf.dtype, buf.shape, buf.data.ptr)

    def infer(self) -> dict[str, np.ndarray]:
        self.launch()
        self.synchronize()
        return {name: buf.get(stream=self.stream) for name, buf in self._outputs.items()}

    def launch(self) -> None:
        self._session.run_with_iobinding(self._binding)

    def set_inputs(self, feeds: Feeds) -> None:
        for name, buffer in self._inputs.items():  # the bound addresses stay: a CUDA graph replays them
            buffer.set(feeds[name], stream=self.stream)
        self.stream.synchronize()

    def close(self) -> None:
        self._inputs.clear()
        self._outputs.clear()
