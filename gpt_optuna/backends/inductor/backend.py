"""PyTorch's Inductor compiler (``torch.compile``) as an engine: it compiles the PyTorch program a
model was exported from (a ``.pt2`` given as the model), on the GPU where torch has one, else on
the CPU."""

from __future__ import annotations

import contextlib
import os
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
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
from gpt_optuna.backends.inductor.deploy import CompiledProgram
from gpt_optuna.backends.inductor.deployment import CACHE_ENV, inductor_caches, needs_program, settings_of
from gpt_optuna.backends.inductor.description import InductorDescription
from gpt_optuna.backends.inductor.knobs import CUDAGRAPHS, inductor_knobs
from gpt_optuna.backends.inductor.profiling import profiled_kernels
from gpt_optuna.core.engine_facts import BuildFacts
from gpt_optuna.core.engine_paths import EnginePaths
from gpt_optuna.core.space import Candidate, Space
from gpt_optuna.graph.model import Feeds, ModelInfo, ShapeRange, one_line
from gpt_optuna.graph.program import load_program

CALLS_IN_BUILD = 3
"""Calls made while building: the compile happens at the first, CUDA graphs are recorded by the third."""
REBUILD_CHECK_S = 10.0
"""A compile longer than this is done again from the caches it left, timed: what a confirmation
process or a service pays for it (a shorter one is taken to cost as much again)."""


@contextlib.contextmanager
def _cache_in(folder: Path) -> Iterator[None]:
    """Inductor's caches where the study keeps them (:func:`inductor_caches`) while compiling, and
    the saved-caches record emptied first, so that what is saved after is this compile's."""
    previous = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(inductor_caches(folder))
    with contextlib.suppress(ImportError):  # a torch without saved caches compiles all the same
        from torch.compiler._cache import CacheArtifactManager

        CacheArtifactManager.clear()
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(CACHE_ENV, None)
        else:
            os.environ[CACHE_ENV] = previous


class InductorBackend(InductorDescription, Backend):
    """The program compiled and run in a worker."""

    @staticmethod
    def _device() -> str:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    def versions(self) -> dict[str, str]:
        import torch

        found = {"torch": torch.__version__}
        with contextlib.suppress(ImportError):
            import triton

            found["triton"] = triton.__version__
        return found

    def space(self, model: ModelInfo, shapes: dict[str, ShapeRange]) -> Space:
        program = load_program(needs_program(model.path))
        targets = {str(node.target) for node in program.graph.nodes if node.op == "call_function"}
        attention = any("scaled_dot_product" in t for t in targets)
        convolution = any("convolution" in t or "conv2d" in t or "conv1d" in t for t in targets)
        return Space(inductor_knobs(self._device() == "cuda", attention, convolution))

    def check_model(
        self, model: ModelInfo, space: Space, candidate: Candidate, paths: EnginePaths, shapes: dict[str, ShapeRange]
    ) -> list[KnobLimit]:
        load_program(needs_program(model.path))  # a compile is a trial's work: compile errors fail that trial
        return []

    def build(
        self,
        model: ModelInfo,
        candidate: Candidate,
        paths: EnginePaths,
        shapes: dict[str, ShapeRange],
        extra_options: dict[str, Any] | None = None,
    ) -> Built:
        """The candidate compiled (``extra_options``: Inductor options besides the candidate's)."""
        import torch

        program = load_program(needs_program(model.path))
        device = self._device()
        settings = settings_of(candidate, device)
        settings["options"] |= extra_options or {}
        zeros = [np.zeros(shapes[spec.name].opt, spec.dtype) for spec in model.inputs]
        start = time.perf_counter()
        try:
            with _cache_in(paths.caches):
                compiled = _compiled_and_run(program, settings, zeros, device == "cuda")
                saved = torch.compiler.save_cache_artifacts()
                build_s = time.perf_counter() - start
                rebuild_s = None
                if build_s > REBUILD_CHECK_S:  # the caches it left, as a fresh process meets them
                    del compiled
                    again = time.perf_counter()
                    compiled = _compiled_and_run(program, settings, zeros, device == "cuda")
                    rebuild_s = time.perf_counter() - again
        except Exception as exc:  # Dynamo, Inductor, Triton or the C++ compiler refused the candidate
            raise BuildError(
                f"torch.compile failed: {type(exc).__name__}: {one_line(exc)}", traceback.format_exc()
            ) from None
        return Built((compiled, saved[0] if saved else None), build_s, BuildFacts(rebuild_s=rebuild_s))

    def layer_times(self, profiling: Profiling) -> list[NodeTime]:
        """The candidate compiled as a trial compiles it, but without CUDA graphs (whose replays the
        profiler does not see) and with Inductor's C++ kernels named to the profiler, then
        :func:`profiled_kernels`."""
        job, candidate = profiling, profiling.candidate
        profiled = where_offered(candidate, {CUDAGRAPHS: False})
        built = self.build(job.model, profiled, job.paths, job.shapes, {"cpp.enable_kernel_profile": True})
        with self.open(built, job.feeds, job.outputs) as runner:
            return profiled_kernels(runner, job.runs, self._device() == "cuda")

    def open(self, built: Built, feeds: Feeds, outputs: Feeds) -> Runner:
        compiled, _ = built.engine
        return InductorRunner(compiled, feeds, outputs)

    def serialize(self, built: Built) -> bytes | None:
        """Inductor's caches of the candidate's compile: what an export ships so that a service
        compiles warm, with the kernels the trial chose."""
        return built.engine[1]


def _compiled_and_run(program: Any, settings: dict[str, Any], zeros: list[np.ndarray], on_gpu: bool) -> CompiledProgram:
    """``program`` compiled from nothing in memory (Dynamo's and Inductor's in-process caches
    cleared; the folder's caches kept) and called :data:`CALLS_IN_BUILD` times, as a fresh
    process compiles it."""
    import torch
    from torch._inductor.codecache import PyCodeCache

    torch._dynamo.reset()  # the previous compile's code, guards and CUDA graphs
    PyCodeCache.cache_clear()
    compiled = CompiledProgram(program, settings)
    inputs = compiled.inputs(zeros)
    with compiled.context():
        for _ in range(CALLS_IN_BUILD):
            compiled.run(inputs)
    if on_gpu:
        torch.cuda.synchronize()
    return compiled


class InductorRunner(Runner):
    """A compiled program bound to input tensors; on the GPU its work goes to a stream of its own,
    which CuPy's events time."""

    def __init__(self, compiled: CompiledProgram, feeds: Feeds, outputs: Feeds) -> None:
        import torch

        self.compiled = compiled
        self.names = list(feeds)
        self.templates = outputs
        self.inputs = compiled.inputs([feeds[n] for n in self.names])
        self.torch_stream = None
        if compiled.device.type == "cuda":
            self.torch_stream = torch.cuda.Stream()
            self.stream = import_cupy().cuda.ExternalStream(self.torch_stream.cuda_stream)

    @contextlib.contextmanager
    def _on_stream(self) -> Iterator[None]:
        import torch

        with contextlib.ExitStack() as stack:
            if self.torch_stream is not None:
                stack.enter_context(torch.cuda.stream(self.torch_stream))
            stack.enter_context(self.compiled.context())
            yield

    def launch(self) -> None:
        with self._on_stream():
            self.compiled.run(self.inputs)

    def infer(self) -> dict[str, np.ndarray]:
        with self._on_stream():
            outputs = self.compiled.run(self.inputs)
            host = [o.detach().float().cpu().numpy() if o.is_floating_point() else o.cpu().numpy() for o in outputs]
        if len(host) != len(self.templates):
            raise BuildError(f"the program returns {len(host)} outputs, its ONNX model {len(self.templates)}")
        return {
            name: array.astype(template.dtype, copy=False)
            for (name, template), array in zip(self.templates.items(), host, strict=True)
        }

    def set_inputs(self, feeds: Feeds) -> None:
        fresh = self.compiled.inputs([feeds[n] for n in self.names])
        for bound, value in zip(self.inputs, fresh, strict=True):
            bound.copy_(value)
