"""Olive's ONNX Runtime session-parameter tuning as a peer of the tuner.

Olive (``olive-ai``) sweeps ONNX Runtime's session parameters on the model as it is, with
generated inputs of the model's shapes and types, and returns the inference settings it found
fastest. Its own defaults search only the execution provider, so the peer names the sweep:
execution mode x graph optimization level x (on a GPU, with I/O binding) CUDA graph or (on the
CPU) intra-op threads, every point measured by Olive's latency evaluator. Here its tuning runs in
a process of its own (its imports are heavy; a run that takes longer than the time given is
stopped; its output goes to ``olive.log`` in its folder), and the settings it returned are opened
as Olive opens them (its own session builder), on the stream the peer timing records its events on.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

PROVIDERS = {"gpu": "CUDAExecutionProvider", "cpu": "CPUExecutionProvider"}
THREADS = [1, 2, 4, 8]
"""Intra-op thread counts searched on the CPU."""
EXIT_WAIT_S = 30.0
"""How long the tuning process may take to exit once its settings are in."""


def _choices(values: list[Any]) -> dict[str, Any]:
    """A categorical search parameter in Olive's configuration language."""
    return {"olive_parameter_type": "SearchParameter", "type": "Categorical", "support": values}


def installed() -> bool:
    return importlib.util.find_spec("olive") is not None


def _tune(model: Path, feeds: dict[str, np.ndarray], folder: Path, device: str, conn: Connection) -> None:
    """In a process of its own: Olive's session-parameter tuning of ``model``; its inference settings to ``conn``."""
    folder.mkdir(parents=True, exist_ok=True)
    log = os.open(folder / "olive.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)  # Olive's own output, kept beside its run rather than mixed into the table's
    os.dup2(log, 2)
    from olive.workflows import run as olive_run

    gpu = device == "gpu"
    data = {
        "name": "inputs",
        "type": "dummydatacontainer",
        "load_dataset_config": {
            "type": "dummy_dataset",
            "input_names": list(feeds),
            "input_shapes": [list(v.shape) for v in feeds.values()],
            "input_types": [str(v.dtype) for v in feeds.values()],
            "max_samples": 32,
        },
    }
    space = {
        "execution_mode_list": _choices([0, 1]),
        "opt_level_list": _choices([0, 1, 2, 99]),
        **({"enable_cuda_graph": _choices([False, True])} if gpu else {"intra_thread_num_list": _choices(THREADS)}),
    }
    config = {
        "input_model": {"type": "ONNXModel", "model_path": str(model)},
        "systems": {
            "local": {
                "type": "LocalSystem",
                "accelerators": [{"device": device, "execution_providers": [PROVIDERS[device]]}],
            }
        },
        "data_configs": [data],
        "evaluators": {
            "latency": {
                "type": "OnnxEvaluator",
                "metrics": [
                    {
                        "name": "latency",
                        "type": "latency",
                        "sub_types": [{"name": "avg", "priority": 1}],
                        "data_config": "inputs",
                    }
                ],
            }
        },
        "passes": {
            "tuning": {
                "type": "OrtSessionParamsTuning",
                "data_config": "inputs",
                "device": device,
                "providers_list": PROVIDERS[device],
                "force_evaluate_other_eps": False,
                "io_bind": gpu,
                **space,
            }
        },
        "search_strategy": {"execution_order": "joint", "sampler": "sequential"},
        "evaluator": "latency",
        "host": "local",
        "target": "local",
        "output_dir": str(folder),
        "cache_dir": str(folder / "cache"),
        "no_artifacts": True,
        "log_severity_level": 3,
    }
    models = olive_run(config).get_output_models()
    conn.send(models[0].get_inference_config() if models else None)


def tuned_settings(
    model: Path, feeds: dict[str, np.ndarray], folder: Path, timeout: float, device: str = "gpu"
) -> tuple[dict[str, Any] | None, str]:
    """Olive's inference settings for ``model`` (None where it found none, failed or took longer
    than ``timeout`` s), and what happened, in words."""
    if not installed():
        return None, "not measured: olive-ai is not installed"
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_tune, args=(model, feeds, folder, device, send))
    started = time.monotonic()
    process.start()
    send.close()
    try:
        if not receive.poll(timeout):
            process.kill()
            return None, f"not measured: Olive's tuning took over {timeout:g} s"
        settings = receive.recv()
    except EOFError:
        process.join(EXIT_WAIT_S)
        return None, f"not measured: Olive's tuning failed (exit code {process.exitcode}; see {folder / 'olive.log'})"
    finally:
        process.join(EXIT_WAIT_S)  # its settings are in; a child that hangs on its way out is stopped
        if process.is_alive():
            process.kill()
            process.join()
    if not settings:
        return None, "not measured: Olive's tuning returned no settings"
    return settings, f"Olive tuned in {time.monotonic() - started:.0f} s"


def open_session(model: Path, settings: dict[str, Any], device: str, stream: int | None) -> Any:
    """An ONNX Runtime session with Olive's settings, opened by Olive's own builder; on a GPU its
    work goes to the CUDA stream ``stream`` (the one the timing records on)."""
    from olive.common.ort_inference import get_ort_inference_session

    if stream is not None:
        settings = {
            **settings,
            "provider_options": [
                {**options, "user_compute_stream": str(stream)} if provider == PROVIDERS["gpu"] else options
                for provider, options in zip(settings["execution_provider"], settings["provider_options"], strict=True)
            ],
        }
    return get_ort_inference_session(model, device, settings)
