"""A backend that builds nothing: it returns the model's fp32 outputs (ONNX Runtime on the CPU,
one session per model and process) and times a chosen delay.

It exists to test and measure the tuner itself without an engine: isolation tests choose the
``mode`` knob to really crash (SIGSEGV), abort, hang, raise or fail a build in the worker
process (``noisy`` and ``nan`` fail the accuracy criterion, ``scaled`` passes it with outputs a
little off), and the overhead benchmark uses ``mode=ok`` with no delay. Use it with
``--backend gpt_optuna.testing.synthetic:SyntheticBackend``.

With the ``noise_pct`` knob, a launch's delay varies as on a shared host (:class:`NoisyHost`):
each process runs at its own speed, each candidate's ratio to the others differs a little between
processes, and each launch has its jitter, so the verdict's statistics can be proven by
simulation against a known true speedup.
"""

from __future__ import annotations

import ctypes
import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpt_optuna.backends.base import Backend, BuildError, Built, Runner
from gpt_optuna.core.engine_paths import EnginePaths
from gpt_optuna.core.log import onnxruntime_options
from gpt_optuna.core.space import Candidate, Knob, Space
from gpt_optuna.graph.model import Feeds, ModelInfo, ShapeRange

MODES = ("ok", "crash", "abort", "hang", "raise", "build_error", "nan", "noisy", "scaled")


class SyntheticBackend(Backend):
    """Knobs: ``mode`` (what happens), ``delay_us`` (per launch), ``build_ms``, three inert knobs."""

    name = "synthetic"

    def space(self, model: ModelInfo, shapes: dict[str, ShapeRange]) -> Space:
        return Space(
            [
                Knob("mode", MODES, "ok", "what the candidate does"),
                Knob("delay_us", (200, 0, 50, 100), 200, "busy-wait per launch (the default is the slowest)"),
                Knob("build_ms", (0, 100, 1000), 0, "sleep in build"),
                Knob(
                    "contention_us",
                    (0,),
                    0,
                    "per launch, this much faster while alone in its process (as in the search) and this much"
                    " slower beside other open candidates (as in the finalists' interleaved rounds); searched only"
                    " where [space] lists values",
                ),
                Knob(
                    "noise_pct",
                    (0,),
                    0,
                    "per-launch jitter in percent, with process and per-process candidate noise (NoisyHost);"
                    " searched only where [space] lists values",
                ),
                Knob("a", tuple(range(8)), 0),
                Knob("b", tuple(range(8)), 0),
                Knob("c", ("x", "y", "z"), "x"),
            ]
        )

    def build(self, model: ModelInfo, candidate: Candidate, paths: EnginePaths, shapes: dict[str, ShapeRange]) -> Built:
        start = time.perf_counter()
        time.sleep(int(candidate["build_ms"]) / 1000)
        mode = candidate["mode"]
        if mode == "crash":
            ctypes.string_at(0)  # SIGSEGV
        if mode == "abort":
            os.abort()
        if mode == "hang":
            time.sleep(3600)
        if mode == "raise":
            raise RuntimeError("synthetic failure in build")
        if mode == "build_error":
            raise BuildError("synthetic build error", "synthetic builder log: no engine produced")
        return Built((candidate, model.path), time.perf_counter() - start)

    def open(self, built: Built, feeds: Feeds, outputs: Feeds) -> Runner:
        return _SyntheticRunner(*built.engine, feeds)


ROUTE_EFFECTS = {("route.r2", "1"): 0.6, ("route.r5", "1"): 1.6}
"""What :class:`RoutedSyntheticBackend`'s route knobs do to the delay; the others do nothing."""


class RoutedSyntheticBackend(SyntheticBackend):
    """The synthetic backend with twelve screened route knobs (``route.r0`` to ``route.r11``, ``0`` or
    ``1``), as TensorRT's build routes are: two change the delay (:data:`ROUTE_EFFECTS`)."""

    name = "synthetic-routes"

    def space(self, model: ModelInfo, shapes: dict[str, ShapeRange]) -> Space:
        routes = [Knob(f"route.r{i}", ("0", "1"), "0", screened=True) for i in range(12)]
        return Space([*super().space(model, shapes).knobs, *routes])

    def build(self, model: ModelInfo, candidate: Candidate, paths: EnginePaths, shapes: dict[str, ShapeRange]) -> Built:
        factor = float(np.prod([ROUTE_EFFECTS.get(item, 1.0) for item in candidate.items()]))
        slowed = {**candidate, "delay_us": int(int(candidate["delay_us"]) * factor)}
        return super().build(model, slowed, paths, shapes)


@functools.cache
def _session(path: Path) -> Any:
    import onnxruntime as ort

    options = onnxruntime_options(ort)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


_open_runners = 0
"""Runners open in this process: one in the search, several in the finalists' rounds."""


@dataclass(frozen=True)
class NoisyHost:
    """Latency on a shared host, with a known truth: a candidate's true latency is its delay.

    In each process the host runs at its own speed (log-normal, ``process_sd``), each candidate's
    ratio to the others is off by its own factor in that process (log-normal, ``ratio_sd``: the
    load that hits one configuration more than another), and each launch has its jitter
    (``launch_sd``), with an occasional stall (``stall_p`` of launches take ``stall_x`` times as
    long). The true speedup of A over B is the ratio of their delays."""

    process_sd: float = 0.3
    ratio_sd: float = 0.05
    launch_sd: float = 0.05
    stall_p: float = 0.01
    stall_x: float = 5.0

    @classmethod
    def of(cls, noise: float) -> NoisyHost:
        """The host the ``noise_pct`` knob describes: ``noise`` as the process and launch spread,
        half of it between candidates."""
        return cls(process_sd=noise, ratio_sd=noise / 2, launch_sd=noise)

    def speed(self, rng: np.random.Generator) -> float:
        """A process's speed factor."""
        return float(np.exp(rng.normal(0, self.process_sd)))

    def ratio(self, rng: np.random.Generator) -> float:
        """A candidate's own factor in one process."""
        return float(np.exp(rng.normal(0, self.ratio_sd)))

    def jitter(self, rng: np.random.Generator) -> float:
        """One launch's factor."""
        stall = self.stall_x if rng.random() < self.stall_p else 1.0
        return stall * float(np.exp(rng.normal(0, self.launch_sd)))

    def timers(self, delays_ms: list[float], rng: np.random.Generator) -> list[Callable[[], float]]:
        """One process's launch timers (virtual: each returns a latency in ms without waiting)."""
        speed = self.speed(rng)
        return [functools.partial(self._launch, d * speed * self.ratio(rng), rng) for d in delays_ms]

    def _launch(self, scale: float, rng: np.random.Generator) -> float:
        return scale * self.jitter(rng)


_HOST_RNG = np.random.default_rng()
"""A worker process's own noise (seeded by the OS): each process is another draw of the host."""
_PROCESS_SPEED: list[float] = []


class _SyntheticRunner(Runner):
    def __init__(self, candidate: Candidate, path: Path, feeds: Feeds) -> None:
        global _open_runners
        _open_runners += 1
        self._delay_s = int(candidate["delay_us"]) / 1e6
        noise = int(candidate.get("noise_pct", 0)) / 100
        self._host = NoisyHost.of(noise) if noise else None
        if self._host is not None:  # this process's speed, and this candidate's own factor in it
            if not _PROCESS_SPEED:
                _PROCESS_SPEED.append(self._host.speed(_HOST_RNG))
            self._delay_s *= _PROCESS_SPEED[0] * self._host.ratio(_HOST_RNG)
        self._contention_s = int(candidate.get("contention_us", 0)) / 1e6
        self._mode = candidate["mode"]
        self._path = path
        self._feeds = feeds

    def close(self) -> None:
        global _open_runners
        _open_runners -= 1

    def set_inputs(self, feeds: Feeds) -> None:
        self._feeds = feeds

    def infer(self) -> dict[str, np.ndarray]:
        session = _session(self._path)
        names = [o.name for o in session.get_outputs()]
        outputs = dict(zip(names, session.run(names, self._feeds), strict=True))
        if self._mode == "nan":
            return {n: np.full_like(a, np.nan, dtype=np.float32) for n, a in outputs.items()}
        if self._mode == "scaled":  # feasible, its cosine exact, its max_abs not: an output metric that differs
            return {n: a * np.asarray(1.0001, dtype=a.dtype) for n, a in outputs.items()}
        if self._mode == "noisy":
            rng = np.random.default_rng(0)
            return {n: a + rng.standard_normal(a.shape).astype(a.dtype) * 10 for n, a in outputs.items()}
        return outputs

    def launch(self) -> None:
        contention = self._contention_s if _open_runners > 1 else -self._contention_s
        jitter = self._host.jitter(_HOST_RNG) if self._host is not None else 1.0
        end = time.perf_counter() + self._delay_s * jitter + contention
        while time.perf_counter() < end:
            pass
