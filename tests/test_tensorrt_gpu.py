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
from gpt_optuna.core.engine_paths import EnginePaths
from gpt_optuna.core.measure_settings import MeasureSettings
from gpt_optuna.graph import feeds as mf
from gpt_optuna.graph import model as m
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
        built = backend.build(info, candidate, EnginePaths.under(tmp_path), shapes)
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
            assert runner.facts.device_memory_bytes >= 0


def test_the_whole_tensorrt_path_confirms_exports_and_checks_the_plan_the_trial_built(
    cnn_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A search of real TensorRT engines (with and without CUDA graphs), its finalists re-measured
    from the plans the trials kept, the winner exported and its plan run by ``compare`` and
    ``check`` in fresh processes: run where TensorRT is installed with
    ``python -m pytest -m gpu tests/test_tensorrt_gpu.py``."""
    import json
    import subprocess
    import sys

    from conftest import tune

    from gpt_optuna.cli import main

    if not any(importlib.util.find_spec(module) for module in TensorRTBackend.modules):
        pytest.skip("TensorRT is not installed")
    monkeypatch.chdir(tmp_path)
    assert tune(str(cnn_path), "--backend", "tensorrt", "--n-trials", "6", "--seed", "0", "--study-name", "t") == 0
    said = capsys.readouterr().out + capsys.readouterr().err
    assert "kept engine" not in said  # every finalist was loaded from its plan, none built again
    assert main(["best", "--json", "--study-name", "t"]) == 0
    best = json.loads(capsys.readouterr().out)
    assert best["measurement"] == "confirmed", best
    assert main(["export", "--study-name", "t", "-o", "best"]) == 0
    side = json.loads(Path("best.plan.json").read_text())
    trial = side["trial"]
    assert main(["compare", "--study-name", "t", str(trial), "baseline", "--processes", "2"]) in (0, 1)
    assert "built again" not in capsys.readouterr().out
    load = "import tensorrt as t; assert t.Runtime(t.Logger()).deserialize_cuda_engine(open('best.plan', 'rb').read())"
    opened = subprocess.run([sys.executable, "-c", load], capture_output=True, text=True, check=False)
    assert opened.returncode == 0, opened.stderr[-2000:]  # a service's fresh process opens the plan shipped
    check = ["check", str(cnn_path), "--baseline", "best.plan.json", "--budget", "60s", "--quiet"]
    assert main(check) in (0, 5), capsys.readouterr().out  # passed, or inconclusive on a busy GPU
