"""ONNX Runtime: CPU, CUDA and TensorRT execution providers.

Only providers that can actually create a session here are offered: ONNX Runtime lists
providers it cannot start (TensorRT without libnvinfer) and silently falls back to CPU, so each
one is probed with a real session on a one-node model.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from gpt_optuna.backends.base import (
    CANNOT_RUN,
    Backend,
    BuildError,
    Built,
    KnobLimit,
    NodeTime,
    Profiling,
    Runner,
    import_cupy,
    where_offered,
)
from gpt_optuna.backends.onnxruntime.description import OnnxRuntimeDescription
from gpt_optuna.backends.onnxruntime.knobs import (
    applicable_cuda_options,
    discover_knobs,
    model_ops,
    operator_limits,
    optimized_ops,
    where_it_works,
)
from gpt_optuna.backends.onnxruntime.profiling import profiled_nodes
from gpt_optuna.backends.onnxruntime.settings import (
    CUDA,
    CUDA_GRAPH,
    FUSE_CONV_BIAS,
    GPU_PROVIDERS,
    GRAPH_LEVEL,
    NHWC,
    OPTIONAL_GRAPH_LEVELS,
    cuda_option_keys,
    ort_module,
    ort_version,
    provider_options,
    session_options,
    usable_providers,
)
from gpt_optuna.core.engine_paths import EnginePaths
from gpt_optuna.core.host import usable_cores
from gpt_optuna.core.space import Candidate, Space
from gpt_optuna.graph.feeds import synthetic_feeds
from gpt_optuna.graph.fusion import FUSIONS
from gpt_optuna.graph.model import Feeds, ModelInfo, ShapeRange

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


class OnnxRuntimeBackend(OnnxRuntimeDescription, Backend):
    """ONNX Runtime's sessions, built and run in a worker."""

    def refused_run(self, error: Exception) -> str | None:
        return refusal(error)

    def execution_providers(self) -> list[str]:
        return usable_providers()

    def layer_times(self, profiling: Profiling) -> list[NodeTime]:
        return profiled_nodes(profiling)

    def space(self, model: ModelInfo, shapes: dict[str, ShapeRange]) -> Space:
        ort = ort_module()
        levels = [lvl for lvl in (*OPTIONAL_GRAPH_LEVELS, "ORT_ENABLE_ALL") if hasattr(ort.GraphOptimizationLevel, lvl)]
        providers = usable_providers()
        keys = cuda_option_keys() if CUDA in providers else frozenset()
        extras = applicable_cuda_options(keys, ort_version(), model_ops(model.path)) if keys else ()
        return Space(discover_knobs(providers, levels, usable_cores(), extras))

    def build(self, model: ModelInfo, candidate: Candidate, paths: EnginePaths, shapes: dict[str, ShapeRange]) -> Built:
        ort = ort_module()
        provider = str(candidate["provider"])
        stream = import_cupy().cuda.Stream(non_blocking=True) if provider in GPU_PROVIDERS else None
        options = session_options(candidate)
        providers = [(provider, provider_options(candidate, stream.ptr if stream else None, paths.caches))]
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
        self, model: ModelInfo, space: Space, candidate: Candidate, paths: EnginePaths, shapes: dict[str, ShapeRange]
    ) -> list[KnobLimit]:
        """Create the default session; keep the CUDA settings that act on particular operators for
        the graphs that run one (after ONNX Runtime's optimizations); where the space offers CUDA
        graphs, find the graph levels and layouts (NHWC places some nodes on the CPU) at which a
        session can capture one: every node on the CUDA provider; where it offers cuDNN's conv-bias
        fusion for a graph with convolutions, find the layouts at which one inference runs with it
        (cuDNN's frontend finds no plan for some convolutions, and says so only when they run)."""
        self.build(model, candidate, paths, shapes)
        knobs = {k.name: k for k in space.knobs}
        if candidate.get("provider") != CUDA:
            return []
        limits = operator_limits(space, optimized_ops(model, candidate, paths.caches))
        limited = {limit.knob for limit in limits}
        base = where_offered(candidate, {CUDA_GRAPH: False})

        def captures(setting: Candidate) -> str | None:
            try:
                self.build(model, {**base, **setting, CUDA_GRAPH: True}, paths, shapes)
            except BuildError as exc:
                return str(exc).splitlines()[0]
            return None

        def runs_fused(setting: Candidate) -> str | None:
            try:
                session, _ = self.build(model, {**base, **setting, FUSE_CONV_BIAS: True}, paths, shapes).engine
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
        return {"onnxruntime": ort_module().__version__}

    def precisions(self) -> tuple[str, ...]:
        """fp16 and int8 Q/DQ graphs run on every provider; bf16 and fp8 kernels are missing."""
        return ("fp32", "fp16", "int8")

    def fusions(self) -> tuple[str, ...]:
        """Every graph fusion writes ONNX Runtime's own operators."""
        return FUSIONS[1:]


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
