"""A backend that builds nothing: it returns the reference outputs after a chosen delay.

It exists to test and measure the tuner itself without an engine: isolation tests choose the
``mode`` knob to really crash (SIGSEGV), abort, hang, raise or fail a build in the worker
process, and the overhead benchmark uses ``mode=ok`` with no delay. Use it with
``--backend gpt_optuna.backends.synthetic:SyntheticBackend``.
"""

from __future__ import annotations

import ctypes
import os
import time
from pathlib import Path

import numpy as np

from gpt_optuna.backends.base import Backend, BuildError, Built, Runner
from gpt_optuna.model import Feeds, ModelInfo, ShapeRange
from gpt_optuna.space import Candidate, Knob, Space

MODES = ("ok", "crash", "abort", "hang", "raise", "build_error", "nan", "noisy")


class SyntheticBackend(Backend):
    """Knobs: ``mode`` (what happens), ``delay_us`` (per launch), ``build_ms``, three inert knobs."""

    name = "synthetic"

    def space(self, model: ModelInfo, shapes: dict[str, ShapeRange]) -> Space:
        return Space(
            [
                Knob("mode", MODES, "ok", "what the candidate does"),
                Knob("delay_us", (200, 0, 50, 100), 200, "busy-wait per launch (the default is the slowest)"),
                Knob("build_ms", (0, 100, 1000), 0, "sleep in build"),
                Knob("a", tuple(range(8)), 0),
                Knob("b", tuple(range(8)), 0),
                Knob("c", ("x", "y", "z"), "x"),
            ]
        )

    def build(self, model: ModelInfo, candidate: Candidate, workdir: Path, shapes: dict[str, ShapeRange]) -> Built:
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
        return Built(candidate, 0.0)

    def open(self, built: Built, feeds: Feeds, outputs: Feeds) -> Runner:
        return _SyntheticRunner(built.engine, outputs)


class _SyntheticRunner(Runner):
    def __init__(self, candidate: Candidate, outputs: Feeds) -> None:
        self._delay_s = int(candidate["delay_us"]) / 1e6
        mode = candidate["mode"]
        if mode == "nan":
            self._outputs = {n: np.full_like(a, np.nan, dtype=np.float32) for n, a in outputs.items()}
        elif mode == "noisy":
            rng = np.random.default_rng(0)
            self._outputs = {n: a + rng.standard_normal(a.shape).astype(a.dtype) * 10 for n, a in outputs.items()}
        else:
            self._outputs = dict(outputs)

    def infer(self) -> dict[str, np.ndarray]:
        return {n: a.copy() for n, a in self._outputs.items()}

    def launch(self) -> None:
        end = time.perf_counter() + self._delay_s
        while time.perf_counter() < end:
            pass
