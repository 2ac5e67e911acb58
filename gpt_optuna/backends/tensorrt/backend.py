"""TensorRT 10.x, 11.x and TensorRT-RTX: one implementation over their shared Python API.

Every knob is feature-detected on the installed module (``hasattr``, enum membership) and never
by version number; trial parameters hold enum *names*, since enum integers changed between 10.x
and 11.x. The functions taking ``trt`` (the imported module) are pure mappings so they can be
checked against the API names of every version, without the library.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from gpt_optuna.backends.base import (
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
from gpt_optuna.backends.tensorrt.description import TensorRTDescription, TensorRTRTXDescription
from gpt_optuna.backends.tensorrt.io_dtypes import ENGINE_DTYPES, device_dtype, engine_dtype, on_device
from gpt_optuna.backends.tensorrt.knobs import (
    WEAK_TYPING_KNOBS,
    configure,
    discover_knobs,
    parse_build_routes,
    route_string,
    strongly_typed,
)
from gpt_optuna.core.engine_facts import BuildFacts, RunFacts
from gpt_optuna.core.engine_paths import EnginePaths
from gpt_optuna.core.files import atomic_write, locked
from gpt_optuna.core.space import Candidate, Space
from gpt_optuna.graph.constant_folding import folded
from gpt_optuna.graph.model import Feeds, ModelInfo, ShapeRange

_LOGGED = ("INTERNAL_ERROR", "ERROR", "WARNING")
_TENSORRT_LOG = logging.getLogger(__name__)


def optimization_profile(builder: Any, model: ModelInfo, shapes: dict[str, ShapeRange]) -> Any | None:
    """One profile covering every input with a dynamic dimension, or None for a static model."""
    dynamic = [spec.name for spec in model.inputs if not spec.is_static]
    if not dynamic:
        return None
    profile = builder.create_optimization_profile()
    for name in dynamic:
        r = shapes[name]
        profile.set_shape(name, r.min, r.opt, r.max)
    return profile


_LOGGERS: dict[int, Any] = {}


def _capturing_logger(trt: ModuleType) -> Any:
    """The process's one logger for ``trt`` (TensorRT warns when builders and runtimes are given
    several), its kept messages emptied: each build or load reads what it caused."""
    logger = _LOGGERS.get(id(trt))
    if logger is None:

        class CapturingLogger(trt.ILogger):  # type: ignore[name-defined, misc]
            """Keeps TensorRT's warnings and errors, for the trial's log; passes every message on as
            debug detail (``-v``: the worker log has it)."""

            def __init__(self) -> None:
                trt.ILogger.__init__(self)
                self.messages: list[str] = []

            def log(self, severity: Any, msg: str) -> None:
                _TENSORRT_LOG.debug("[%s] %s", getattr(severity, "name", severity), msg)
                if getattr(severity, "name", "") in _LOGGED:
                    self.messages.append(f"[{severity.name}] {msg}")

        logger = _LOGGERS[id(trt)] = CapturingLogger()
    logger.messages = []
    return logger


def network_flags(trt: ModuleType, candidate: Candidate) -> int:
    """``create_network``'s flags: strongly typed wherever the library offers it and the candidate
    sets no weak-typing flag, so that the graph's own types (an fp16 graph, Q/DQ) are what the
    engine runs, not hints a 10.x builder may build in FP32."""
    strongly = trt.NetworkDefinitionCreationFlag.__members__.get("STRONGLY_TYPED")
    if strongly is None or not strongly_typed(candidate):
        return 0
    return 1 << int(strongly)


def _has_qdq(model: ModelInfo) -> bool:
    import onnx

    graph = onnx.load(str(model.path), load_external_data=False).graph
    return any(node.op_type in ("QuantizeLinear", "DequantizeLinear") for node in graph.node)


def _device_l2_bytes() -> int | None:
    try:
        import cupy

        return int(cupy.cuda.Device().attributes["L2CacheSize"])
    except Exception:  # no CuPy or no GPU: tiling's L2 limit is left at its default
        return None


@dataclass
class _Engine:
    plan: bytes
    candidate: Candidate


class TensorRTBackend(TensorRTDescription, Backend):
    """TensorRT's engines, built, loaded and run in a worker."""

    timing_cache = True
    weak_typing_knobs = WEAK_TYPING_KNOBS

    def precisions(self) -> tuple[str, ...]:
        """Graph precisions TensorRT consumes: fp16 and bf16 by conversion, int8 and fp8 by Q/DQ."""
        return ("fp32", "fp16", "bf16", "int8", "fp8")

    def space(self, model: ModelInfo, shapes: dict[str, ShapeRange]) -> Space:
        trt = self.trt
        builder = trt.Builder(_capturing_logger(trt))
        config = builder.create_builder_config()
        dynamic = any(not spec.is_static for spec in model.inputs)
        return Space(discover_knobs(trt, config, has_qdq=_has_qdq(model), dynamic=dynamic, l2_bytes=_device_l2_bytes()))

    def _parse(self, model: ModelInfo, paths: EnginePaths, candidate: Candidate) -> tuple[Any, Any, Any, Any]:
        """Builder, network (typed as :func:`network_flags` says), parser and logger with the model
        parsed (its constant subgraphs folded first, a copy kept in the model cache); BuildError
        naming the nodes TensorRT refused."""
        trt = self.trt
        model = folded(model, paths.models)
        logger = _capturing_logger(trt)
        builder = trt.Builder(logger)
        network = builder.create_network(network_flags(trt, candidate))
        parser = trt.OnnxParser(network, logger)
        if not parser.parse_from_file(str(model.path)):
            errors = [parser.get_error(i) for i in range(parser.num_errors)]
            text = "; ".join(f"node {e.node_name()!r} (op {e.node_operator()}): {e.desc()}" for e in errors)
            raise BuildError(f"TensorRT could not parse {model.path.name}: {text}", "\n".join(logger.messages))
        return builder, network, parser, logger

    def check_model(
        self, model: ModelInfo, space: Space, candidate: Candidate, paths: EnginePaths, shapes: dict[str, ShapeRange]
    ) -> list[KnobLimit]:
        """Build the candidate at the lowest optimization level: parsing alone misses what the
        builder refuses (a type it has no kernel for, say), and the lowest level builds quickly."""
        self.build(model, where_offered(candidate, {"builder_optimization_level": 0}), paths, shapes)
        return []

    def build(self, model: ModelInfo, candidate: Candidate, paths: EnginePaths, shapes: dict[str, ShapeRange]) -> Built:
        trt = self.trt
        builder, network, _parser, logger = self._parse(model, paths, candidate)
        config = builder.create_builder_config()
        routes = parse_build_routes(config.all_build_routes) if hasattr(config, "all_build_routes") else []
        configure(trt, config, candidate, routes)
        profile = optimization_profile(builder, model, shapes)
        if profile is not None and config.add_optimization_profile(profile) < 0:
            raise BuildError("TensorRT refused the optimization profile", "\n".join(logger.messages))
        cache_path = paths.timing_cache
        cache, shared = self._load_timing_cache(config, cache_path, logger) if self.timing_cache else (None, False)
        start = time.perf_counter()
        plan = builder.build_serialized_network(network, config)
        build_s = time.perf_counter() - start
        if plan is None:
            errors = [m for m in logger.messages if m.startswith(("[ERROR]", "[INTERNAL_ERROR]"))]
            reason = f": {errors[0].split('] ', 1)[1][:300]}" if errors else ""
            raise BuildError(f"TensorRT built no engine{reason}", "\n".join(logger.messages))
        if cache is not None and shared:
            self._merge_timing_cache(config, cache, cache_path)
        data = bytes(plan)
        facts = BuildFacts(
            engine_bytes=len(data),
            engine_sha256=hashlib.sha256(data).hexdigest(),
            engine_io=network_io(network),
            build_route=route_string(candidate, routes) if routes else None,
            build_log="\n".join(logger.messages)[-2000:] if logger.messages else None,
        )
        return Built(_Engine(data, candidate), build_s, facts)

    def serialize(self, built: Built) -> bytes | None:
        return built.engine.plan  # type: ignore[no-any-return]

    def load(self, model: ModelInfo, candidate: Candidate, engine: bytes) -> Built | None:
        """The trial's saved plan: builds of one configuration differ, so the engine re-measured
        is the one the trial measured and the export ships. None where this GPU or library cannot
        deserialize it (a plan of another architecture or version): it is built again."""
        if self.trt.Runtime(_capturing_logger(self.trt)).deserialize_cuda_engine(engine) is None:
            return None
        return Built(_Engine(engine, candidate), 0.0, BuildFacts(engine_sha256=hashlib.sha256(engine).hexdigest()))

    @staticmethod
    def _load_timing_cache(config: Any, path: Path, logger: Any) -> tuple[Any, bool]:
        """The study's timing cache set on ``config``, and whether this build's timings go back
        into its file. Never fatal: a file TensorRT cannot read (it returns an empty cache for
        one, not None) is set aside as ``.corrupt`` and started anew; one made on another GPU or
        TensorRT version is left as it is for the builds it fits, and this build starts empty."""
        empty = config.create_timing_cache(b"")
        data = path.read_bytes() if path.is_file() else b""
        if not data:
            config.set_timing_cache(empty, False)
            return empty, True
        blank = bytes(empty.serialize())
        cache = config.create_timing_cache(data)
        if cache is None or (data != blank and bytes(cache.serialize()) == blank):
            aside = path.with_name(path.name + ".corrupt")
            with contextlib.suppress(FileNotFoundError):  # another worker set it aside first
                path.replace(aside)
            logger.messages.append(f"[WARNING] set the unreadable timing cache aside as {aside}; started a new one")
            config.set_timing_cache(empty, False)
            return empty, True
        if not config.set_timing_cache(cache, False):
            logger.messages.append(
                f"[WARNING] the timing cache {path} was made on another GPU or TensorRT version: left as it is,"
                " and this build timed without it"
            )
            config.set_timing_cache(empty, False)
            return empty, False
        return cache, True

    @staticmethod
    def _merge_timing_cache(config: Any, cache: Any, path: Path) -> None:
        """Fold this build's timings into the study's cache file, one worker at a time (another
        worker's timings written between this one's read and write would be lost)."""
        with locked(path):
            if path.is_file():
                on_disk = config.create_timing_cache(path.read_bytes())
                if on_disk is not None:
                    cache.combine(on_disk, False)
            atomic_write(path, bytes(cache.serialize()))

    def open(self, built: Built, feeds: Feeds, outputs: Feeds) -> Runner:
        return TensorRTRunner(self.trt, built.engine, feeds)

    def layer_times(self, profiling: Profiling) -> list[NodeTime]:
        """Each layer's median time by TensorRT's ``IProfiler``, the engine run without a CUDA graph
        (a graph's launches are not profiled layer by layer), the trial's ``saved`` plan where it
        loads (builds differ); a layer's type is the ONNX operators it was made of, by the node
        names TensorRT gives its layers."""
        job, model = profiling, profiling.model
        plain = where_offered(job.candidate, {"runtime.cuda_graph": False, "runtime.cuda_graph_strategy": "DISABLED"})
        loaded = None if job.saved is None else self.load(model, plain, job.saved)
        with self.open(loaded or self.build(model, plain, job.paths, job.shapes), job.feeds, job.outputs) as runner:
            assert isinstance(runner, TensorRTRunner)
            times = runner.layer_times(job.runs)
        kinds = layer_kinds(model.path)
        found = [NodeTime(name, kinds(name), self.library, statistics.median(t)) for name, t in times.items()]
        return sorted(found, key=lambda n: -n.median_ms)


class TensorRTRTXBackend(TensorRTRTXDescription, TensorRTBackend):
    """TensorRT-RTX's engines. Its timing cache is a no-op since RTX 1.2, so none is kept."""

    timing_cache = False


def io_tensors(trt: ModuleType, engine: Any) -> tuple[list[str], list[str]]:
    """Input and output tensor names of an engine."""
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
    return inputs, [n for n in names if n not in inputs]


def network_io(network: Any) -> dict[str, dict[str, str]]:
    """The dtype of each network input and output the engine was built with, by name: what the
    engine takes and returns (``{"inputs": {...}, "outputs": {...}}``)."""

    def dtype_name(dtype: Any) -> str:
        name = str(getattr(dtype, "name", dtype)).rpartition(".")[2]
        return ENGINE_DTYPES[name].name if name in ENGINE_DTYPES else name.lower()

    inputs = (network.get_input(i) for i in range(network.num_inputs))
    outputs = (network.get_output(i) for i in range(network.num_outputs))
    return {
        "inputs": {tensor.name: dtype_name(tensor.dtype) for tensor in inputs},
        "outputs": {tensor.name: dtype_name(tensor.dtype) for tensor in outputs},
    }


def layer_kinds(model_path: Path) -> Callable[[str], str]:
    """A TensorRT layer's name -> the ONNX operators it was made of (``Conv+Relu``). TensorRT names
    a layer by its nodes' names (``node_of_OUTPUT`` for an unnamed node), fused ones joined."""
    import onnx

    graph = onnx.load(str(model_path), load_external_data=False).graph
    ops = {node.name or f"node_of_{node.output[0]}": node.op_type for node in graph.node if node.output}
    ops |= {f"node_of_{node.output[0]}": node.op_type for node in graph.node if node.output}

    def kind(layer: str) -> str:
        found = [ops[token] for token in re.findall(r"[^\s,()+]+", layer) if token in ops]
        if found:
            return "+".join(dict.fromkeys(found))
        return "Reformat" if "Reformat" in layer else "layer"

    return kind


class TensorRTRunner(Runner):
    """An engine with CuPy buffers per I/O tensor, run with ``execute_async_v3`` on a CuPy stream."""

    def __init__(self, trt: ModuleType, engine: _Engine, feeds: Feeds) -> None:
        cupy = import_cupy()

        logger = _capturing_logger(trt)
        self._trt = trt
        self._runtime = trt.Runtime(logger)
        start = time.perf_counter()
        self._engine = self._runtime.deserialize_cuda_engine(engine.plan)
        load_s = time.perf_counter() - start
        if self._engine is None:
            raise RuntimeError("TensorRT could not deserialize the engine: " + " ".join(logger.messages))
        candidate = engine.candidate
        strategy = candidate.get("runtime.cuda_graph_strategy")
        specialization = candidate.get("runtime.dynamic_shapes_kernel_specialization")
        if strategy is not None or specialization is not None:
            runtime_config = self._engine.create_runtime_config()
            if strategy is not None:
                runtime_config.cuda_graph_strategy = getattr(trt.CudaGraphStrategy, str(strategy))
            if specialization is not None:
                runtime_config.dynamic_shapes_kernel_specialization_strategy = getattr(
                    trt.DynamicShapesKernelSpecializationStrategy, str(specialization)
                )
            self._context = self._engine.create_execution_context(runtime_config)
        else:
            self._context = self._engine.create_execution_context()
        if self._context is None:
            raise RuntimeError("TensorRT could not create an execution context: " + " ".join(logger.messages))
        self.stream = cupy.cuda.Stream(non_blocking=True)
        inputs, outputs = io_tensors(trt, self._engine)
        self._buffers: dict[str, Any] = {}
        self._dtypes = {n: engine_dtype(self._engine.get_tensor_dtype(n).name, n) for n in (*inputs, *outputs)}
        self._host: dict[str, np.ndarray] = {}
        """Inputs TensorRT reads from host memory (shape tensors), by name."""
        with self.stream:
            for name in inputs:
                if self._engine.get_tensor_location(name) == trt.TensorLocation.HOST:
                    self._host[name] = np.ascontiguousarray(feeds[name].astype(self._dtypes[name]))
                    # its values size the outputs: TensorRT reads them once their address is set
                    if not self._context.set_tensor_address(name, self._host[name].ctypes.data):
                        raise RuntimeError(f"TensorRT refused the address of tensor {name!r}")
                else:
                    self._buffers[name] = cupy.asarray(on_device(feeds[name], self._dtypes[name]))
                if not self._context.set_input_shape(name, tuple(feeds[name].shape)):
                    raise RuntimeError(f"TensorRT refused shape {feeds[name].shape} for input {name!r}")
            for name in outputs:
                shape = tuple(self._context.get_tensor_shape(name))
                if any(d < 0 for d in shape):
                    raise RuntimeError(
                        f"the engine's output {name!r} has a data-dependent shape {shape} (known only as it"
                        " runs): running such engines is not supported"
                    )
                self._buffers[name] = cupy.empty(shape, device_dtype(self._dtypes[name]))
        self._outputs = outputs
        for name, buffer in self._buffers.items():
            if not self._context.set_tensor_address(name, buffer.data.ptr):
                raise RuntimeError(f"TensorRT refused the address of tensor {name!r}")
        self._aux_streams: list[Any] = []
        if candidate.get("runtime.aux_streams") and self._engine.num_aux_streams > 0:
            self._aux_streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(self._engine.num_aux_streams)]
            self._context.set_aux_streams([s.ptr for s in self._aux_streams])
        self.stream.synchronize()
        # loading the plan is what a confirmation pays for the engine: it loads the kept plan, not a build
        self.facts = RunFacts(device_memory_bytes=int(self._engine.device_memory_size_v2), rebuild_s=load_s)
        self._graph = self._capture() if candidate.get("runtime.cuda_graph") else None

    def layer_times(self, runs: int) -> dict[str, list[float]]:
        """Run ``runs`` times with a TensorRT profiler on the context: each layer's times (ms)."""
        times: dict[str, list[float]] = {}

        class LayerTimes(self._trt.IProfiler):  # type: ignore[name-defined,misc]
            def report_layer_time(self, layer_name: str, ms: float) -> None:
                times.setdefault(layer_name, []).append(float(ms))

        profiler = LayerTimes()
        self._context.profiler = profiler
        for _ in range(runs):
            self._enqueue()
            self.stream.synchronize()
        return times

    def _enqueue(self) -> None:
        if not self._context.execute_async_v3(self.stream.ptr):
            raise RuntimeError("execute_async_v3 failed")

    def _capture(self) -> Any:
        """Capture one enqueue in a CUDA graph; fall back to plain enqueues, said in the trial's
        ``cuda_graph`` attr, where TensorRT cannot (its enqueue refused, or the capture broken: then
        ending it raises)."""
        self._enqueue()  # one-time setup must not be captured
        self.stream.synchronize()
        self.stream.begin_capture()
        try:
            ok = self._context.execute_async_v3(self.stream.ptr)
        finally:
            try:
                graph = self.stream.end_capture()
                broken = ""
            except Exception as exc:  # CuPy's error for an invalidated capture
                graph, broken = None, f" ({type(exc).__name__}: {exc})"
        if not ok or graph is None:
            import_cupy().cuda.runtime.getLastError()  # the capture's error, cleared for the plain launches
            self.facts = replace(self.facts, cuda_graph=f"not capturable; ran without{broken}")
            return None
        return graph

    def launch(self) -> None:
        if self._graph is not None:
            self._graph.launch(stream=self.stream)
        else:
            self._enqueue()

    def infer(self) -> dict[str, np.ndarray]:
        self.launch()
        self.stream.synchronize()
        return {name: self._buffers[name].get(stream=self.stream).view(self._dtypes[name]) for name in self._outputs}

    def set_inputs(self, feeds: Feeds) -> None:
        for name, array in feeds.items():  # the addresses stay: a captured CUDA graph replays them
            if name in self._host:
                if not np.array_equal(self._host[name], array):
                    raise RuntimeError(f"shape tensor {name!r} changed: the engine's outputs were sized for its values")
            else:
                self._buffers[name].set(on_device(array, self._dtypes[name]), stream=self.stream)
        self.stream.synchronize()

    def close(self) -> None:
        """Release the engine and its buffers, and the blocks CuPy's pool keeps for this runner's
        streams (kept per stream, they would pile up over the trials of one worker)."""
        self.stream.synchronize()
        self._graph = None
        self._buffers.clear()
        self._context = None
        self._engine = None
        import_cupy().get_default_memory_pool().free_all_blocks()
