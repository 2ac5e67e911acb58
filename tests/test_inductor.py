"""The inductor engine on the CPU: its space, a .pt2 program's ONNX model, a real compile, and an
export loaded in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import tune

from gpt_optuna.backends import load_backend
from gpt_optuna.backends.base import Profiling
from gpt_optuna.backends.inductor.knobs import (
    CUDAGRAPHS,
    GEMM_BACKENDS,
    MAX_AUTOTUNE,
    SDPA_BACKEND,
    compile_options,
    inductor_knobs,
)
from gpt_optuna.cli import main
from gpt_optuna.core.engine_paths import EnginePaths
from gpt_optuna.core.errors import UserError
from gpt_optuna.core.space import Space
from gpt_optuna.graph.model import load_model_info, resolve_shapes
from gpt_optuna.graph.program import load_program, onnx_of_program, program_of
from gpt_optuna.worker.self_test import tiny_program


def test_the_defaults_are_torch_compiles_own_and_the_gpu_offers_cuda_graphs_and_attention() -> None:
    cpu = Space(inductor_knobs(on_gpu=False, has_attention=True, has_convolution=True))
    gpu = Space(inductor_knobs(on_gpu=True, has_attention=True, has_convolution=False))
    assert compile_options(cpu.default()) == {"freezing": False, "epilogue_fusion": True, "max_autotune": False}
    assert {k.name for k in cpu.knobs}.isdisjoint({CUDAGRAPHS, SDPA_BACKEND})  # both GPU-only
    assert {CUDAGRAPHS, SDPA_BACKEND} <= {k.name for k in gpu.knobs}
    assert GEMM_BACKENDS not in gpu.default()  # the kernel choices apply with autotuning alone
    tuned = {**gpu.default(), MAX_AUTOTUNE: True, GEMM_BACKENDS: "TRITON", CUDAGRAPHS: True}
    assert compile_options(tuned)["triton.cudagraphs"] is True
    assert compile_options(tuned)["max_autotune_gemm_backends"] == "TRITON"


@pytest.fixture
def program(tmp_path: Path) -> Path:
    pytest.importorskip("torch")
    return tiny_program(tmp_path / "tiny.pt2")  # the program doctor tries the engine on


def test_a_programs_onnx_model_keeps_its_interface_and_leads_back_to_it(program: Path) -> None:
    onnx_path = onnx_of_program(program, 120)
    info = load_model_info(onnx_path)
    assert [(s.name, s.shape) for s in info.inputs] == [("input", (4, 16))]
    assert [s.shape for s in info.outputs] == [(4, 8)]
    kept = program_of(onnx_path)
    assert kept is not None and kept.read_bytes() == program.read_bytes() and kept != program
    assert onnx_of_program(program, 120) == onnx_path  # made once per program content
    kept.write_bytes(b"changed")
    with pytest.raises(UserError, match="has changed"):
        program_of(onnx_path)


def test_a_file_that_is_no_program_is_refused_in_one_line(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    (tmp_path / "junk.pt2").write_bytes(b"not a zip")
    with pytest.raises(UserError, match="could not be exported to ONNX") as error:
        onnx_of_program(tmp_path / "junk.pt2", 120)
    assert "\n" not in str(error.value)


def test_the_engine_refuses_an_onnx_model_with_what_to_give_instead(cnn_path: Path) -> None:
    info = load_model_info(cnn_path)
    with pytest.raises(UserError, match="give the model as a .pt2 file"):
        load_backend("inductor").space(info, resolve_shapes(info, {}))


@pytest.mark.slow
def test_a_search_of_a_program_exports_what_a_fresh_process_compiles_and_runs(program: Path, tmp_path: Path) -> None:
    config = tmp_path / "tune.toml"
    config.write_text("[measure]\nbudget_s = 0.05\nmin_samples = 5\n")
    args = ["--backend", "inductor", "--config", str(config), "--n-trials", "3", "--confirm-top", "1"]
    assert tune(str(program), *args, "--confirm-processes", "2") == 0
    assert main(["export", "-o", str(tmp_path / "served")]) == 0  # the trial the study decided on
    side = json.loads((tmp_path / "served.pt2.json").read_text())
    assert side["file"] == "pytorch program" and side["inductor"]["device"] == "cpu"
    assert (tmp_path / "served.pt2.cache").stat().st_size > 0  # Inductor's caches of the trial's compile
    assert side["fresh_process"]["latency"]["median_ms"] > 0  # what a service gets, timed at export
    script = (  # a service that imports its modules in another order than the export's process did
        "import sys, numpy as np\n"
        "from gpt_optuna.backends.inductor.deploy import load\n"
        "import torch\n"
        "from torch._dynamo.utils import counters\n"
        "model = load(sys.argv[1])\n"
        "x = np.load(sys.argv[1] + '.inputs.npz')['input'][0]\n"
        "np.save(sys.argv[2], model(x)[0].numpy())\n"
        "print(counters['inductor']['fxgraph_cache_hit'])\n"
    )
    out = tmp_path / "fresh.npy"
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "service-caches")}
    command = [sys.executable, "-c", script, str(tmp_path / "served.pt2"), str(out)]
    done = subprocess.run(command, check=True, timeout=300, env=env, capture_output=True, text=True)
    assert int(done.stdout.split()[-1]) >= 1  # compiled warm from the caches shipped beside it
    reference = np.load(tmp_path / "served.pt2.reference.npz")
    (name,) = reference.files
    produced = np.load(out)
    cosine = float(np.dot(produced.ravel(), reference[name][0].ravel()))
    cosine /= float(np.linalg.norm(produced) * np.linalg.norm(reference[name][0]))
    assert cosine >= 0.999  # the outputs of the trial's settings, compiled anew


def test_a_long_compile_is_timed_again_from_the_caches_it_left(program: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpt_optuna.backends.inductor import backend as inductor

    onnx_path = onnx_of_program(program, 120)
    info = load_model_info(onnx_path)
    shapes = resolve_shapes(info, {})
    engine = load_backend("inductor")
    candidate = engine.space(info, shapes).default()
    monkeypatch.setattr(inductor, "REBUILD_CHECK_S", float("inf"))
    assert (
        engine.build(info, candidate, EnginePaths.under(program.parent), shapes).facts.rebuild_s is None
    )  # a short compile
    monkeypatch.setattr(inductor, "REBUILD_CHECK_S", 0.0)
    built = engine.build(info, candidate, EnginePaths.under(program.parent), shapes)
    assert built.facts.rebuild_s > 0
    x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    template = {info.outputs[0].name: np.zeros((4, 8), np.float32)}
    with engine.open(built, {"input": x}, template) as runner:  # the rebuilt program is the one run
        outputs = runner.infer()[info.outputs[0].name]
    import torch

    expected = load_program(program).module()(torch.from_numpy(x))
    assert np.allclose(outputs, expected.detach().numpy(), atol=1e-5)


@pytest.mark.gpu
def test_on_the_gpu_cuda_graphs_replay_on_the_runners_stream_and_cuda_events_time_them(program: Path) -> None:
    from gpt_optuna.core.measure_settings import MeasureSettings
    from gpt_optuna.worker.measure import measure

    onnx_path = onnx_of_program(program, 120)
    info = load_model_info(onnx_path)
    shapes = resolve_shapes(info, {})
    backend = load_backend("inductor")
    space = backend.space(info, shapes)
    x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    reference = {}
    for candidate in (space.default(), {**space.default(), CUDAGRAPHS: True, "compute_precision": "fp16"}):
        built = backend.build(info, candidate, EnginePaths.under(program.parent), shapes)
        template = {info.outputs[0].name: np.zeros((4, 8), np.float32)}
        with backend.open(built, {"input": x}, template) as runner:
            assert runner.stream is not None  # timed by CUDA events on the runner's stream
            outputs = runner.infer()[info.outputs[0].name]
            reference = reference or {"out": outputs}
            assert np.allclose(outputs, reference["out"], atol=2e-2)
            stats = measure(runner, MeasureSettings(budget_s=0.2, min_samples=5))
            assert stats.median_ms > 0 and stats.samples >= 5


def test_profiled_events_are_told_apart_by_what_made_them() -> None:
    from gpt_optuna.backends.inductor.profiling import kind_of

    assert kind_of("graph_0_cpp_fused_mean_silu_1") == kind_of("triton_poi_fused_add_0") == "generated kernel"
    assert kind_of("TorchDynamo Cache Lookup") == "torch.compile runtime"
    assert kind_of("aten::addmm") == "aten operator" and kind_of("sm90_xmma_gemm_f16f16") == "kernel"


@pytest.mark.slow
def test_profile_names_the_kernels_a_trial_compiled(program: Path) -> None:
    info = load_model_info(onnx_of_program(program, 120))
    shapes = resolve_shapes(info, {})
    backend = load_backend("inductor")
    x = {"input": np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)}
    template = {info.outputs[0].name: np.zeros((4, 8), np.float32)}
    candidate, paths = backend.space(info, shapes).default(), EnginePaths.under(program.parent)
    times = backend.layer_times(Profiling(info, candidate, paths, shapes, x, template, 5))
    assert any(t.op_type == "generated kernel" and t.median_ms > 0 for t in times)
    assert times == sorted(times, key=lambda t: -t.median_ms)
