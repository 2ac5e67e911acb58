"""The knobs ONNX Runtime offers for a model on this machine, and where each works."""

from __future__ import annotations

import itertools
import tempfile
from collections.abc import Callable
from pathlib import Path

from gpt_optuna.backends.base import KnobLimit
from gpt_optuna.backends.onnxruntime.settings import (
    CPU,
    CUDA,
    CUDA_GRAPH,
    CUDA_OPTIONS,
    EXECUTION_MODES,
    GPU_PROVIDERS,
    GRAPH_LEVEL,
    NHWC,
    TENSORRT,
    CudaOption,
    ort_module,
    provider_options,
    session_options,
    thread_choices,
)
from gpt_optuna.core.space import Candidate, Condition, Knob, Space
from gpt_optuna.graph.model import ModelInfo

CORES = "a thread count fits the cores of the host it was measured on, and the load on them"
CORES_AND_LOAD = "running operators in parallel pays only where cores are free"
SPINNING = "spinning threads win where cores are free and lose where other work shares them"
"""Why the CPU provider's threading knobs are tuned for the host they were measured on."""


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
            Knob(
                "execution_mode", EXECUTION_MODES, EXECUTION_MODES[0], condition=on[CPU], host_sensitive=CORES_AND_LOAD
            ),
            Knob(
                "intra_op_num_threads",
                threads,
                0,
                "threads inside one operator",
                on[CPU],
                host_sensitive=CORES,
                minimum=0,
            ),
            Knob(
                "inter_op_num_threads",
                threads,
                0,
                "threads across operators",
                Condition("execution_mode", ("ORT_PARALLEL",)),
                host_sensitive=CORES,
                minimum=0,
            ),
            Knob("intra_op_spinning", (True, False), True, "spin-wait for work", on[CPU], host_sensitive=SPINNING),
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


def optimized_ops(model: ModelInfo, candidate: Candidate, caches: Path) -> frozenset[str]:
    """The operator types a session of ``model`` configured as ``candidate`` runs: the graph's own
    and those ONNX Runtime's optimizations make at session creation (``Gelu``, ``Attention``...);
    the graph's own alone where ONNX Runtime cannot write its optimized copy."""
    ort = ort_module()
    options = session_options(candidate)
    providers = [(candidate["provider"], provider_options(candidate, None, caches))]
    with tempfile.TemporaryDirectory(dir=caches) as folder:
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
        KnobLimit(o.knob, None, f"no {'/'.join(sorted(o.ops))} operator runs in this graph", by_operators=True)
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
