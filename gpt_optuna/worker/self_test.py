"""One engine's self-test, run in a worker process: what it offers for a tiny model here, and that
the model builds and runs with the engine's defaults."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from gpt_optuna.backends import EnginePaths
from gpt_optuna.core.measure_settings import MeasureSettings
from gpt_optuna.graph.model import load_model_info, resolve_shapes
from gpt_optuna.graph.program import onnx_of_program
from gpt_optuna.protocol.jobs import SelfTestJob
from gpt_optuna.protocol.process import gpu_names
from gpt_optuna.worker.evaluate import backend_of
from gpt_optuna.worker.measure import measure

TINY_MODEL = Path(__file__).resolve().parent.parent / "data" / "small_cnn.onnx"
"""The model every engine is tried on: the small CNN shipped with the package."""


def tiny_program(path: Path) -> Path:
    """The program an engine of PyTorch programs is tried on: a seeded two-layer network on a
    [4, 16] input, exported and saved at ``path``."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8)).eval()
    torch.export.save(torch.export.export(model, (torch.randn(4, 16),)), str(path))
    return path


def self_test(job: SelfTestJob) -> dict[str, Any]:
    """What :class:`SelfTestJob` asks, for :data:`TINY_MODEL` (an engine of PyTorch programs: a tiny one's)."""
    backend = backend_of(job.backend)
    with tempfile.TemporaryDirectory(prefix="gpt-optuna-doctor-") as folder:
        model = onnx_of_program(tiny_program(Path(folder) / "tiny.pt2"), 300) if backend.takes_programs else TINY_MODEL
        info = load_model_info(model)
        space = backend.space(info, {})
        found: dict[str, Any] = {
            "versions": backend.versions(),
            "gpus": gpu_names(),
            "providers": backend.execution_providers(),
            "knobs": {knob.name: list(knob.search_choices) for knob in space.knobs},
        }
        started = time.perf_counter()
        shapes = resolve_shapes(info, {})
        built = backend.build(info, space.defaults() | space.default(), EnginePaths.under(Path(folder)), shapes)
        found["build_s"] = time.perf_counter() - started
        rng = np.random.default_rng(0)
        feeds = {spec.name: rng.standard_normal(spec.shape).astype(spec.dtype) for spec in info.inputs}
        outputs = {spec.name: np.zeros(spec.shape, spec.dtype) for spec in info.outputs}
        try:
            with backend.open(built, feeds, outputs) as runner:
                runner.infer()
                found["latency_ms"] = measure(runner, MeasureSettings(budget_s=0.2)).median_ms
        except Exception as exc:  # built, but it cannot run here (an engine that needs a GPU)
            found["not_run"] = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return found
