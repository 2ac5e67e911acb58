"""TensorRT and TensorRT-RTX engines on a GPU: CuPy buffers, CUDA events, CUDA graphs.

These need the library and a GPU it accepts. TensorRT-RTX refuses compute capability 9.0
(H100/H200) when deserializing, so there these tests skip with that reason.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from gpt_optuna.backends.tensorrt.backend import TensorRTBackend, TensorRTRTXBackend
from gpt_optuna.graph import feeds as mf
from gpt_optuna.graph import model as m
from gpt_optuna.protocol.timing import MeasureSettings
from gpt_optuna.worker.measure import measure
from gpt_optuna.worker.reference import fp32_outputs

pytestmark = pytest.mark.gpu

BACKENDS = {"tensorrt": TensorRTBackend, "tensorrt-rtx": TensorRTRTXBackend}


@pytest.mark.parametrize("name", BACKENDS)
def test_engine_runs_on_cupy_buffers_with_and_without_cuda_graphs(name: str, cnn_path: Path, tmp_path: Path) -> None:
    import cupy

    backend = BACKENDS[name]()
    if not any(importlib.util.find_spec(module) for module in backend.modules):
        pytest.skip(f"{backend.library} is not installed")
    info = m.load_model_info(cnn_path)
    shapes = m.resolve_shapes(info, {})
    feeds = mf.synthetic_feeds(info, shapes)
    reference = fp32_outputs(info, [feeds])[0]
    space = backend.space(info, shapes)
    graph = [k for k in space.knobs if k.name in ("runtime.cuda_graph", "runtime.cuda_graph_strategy")][0]
    for value in graph.choices:
        candidate = {**space.default(), graph.name: value}
        built = backend.build(info, candidate, tmp_path, shapes)
        try:
            runner = backend.open(built, feeds, reference)
        except RuntimeError as exc:
            if name == "tensorrt-rtx" and "deserialize" in str(exc) and cupy.cuda.Device().compute_capability == "90":
                pytest.skip("TensorRT-RTX refuses compute capability 9.0 (H100/H200) at deserialization")
            raise
        with runner:
            np.testing.assert_allclose(runner.infer()["logits"], reference["logits"], rtol=1e-2, atol=1e-3)
            stats = measure(runner, MeasureSettings(budget_s=0.5))
            assert 0 < stats.median_ms < 50
            assert runner.attrs["device_memory_bytes"] >= 0
