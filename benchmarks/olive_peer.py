"""Olive's ONNX Runtime session-parameter tuning as a peer of the tuner.

Olive (``olive-ai``) sweeps ONNX Runtime's session parameters (execution provider, execution
mode, graph optimization level, threads, I/O binding, CUDA graph) on the model as it is, with
generated inputs of the model's shapes and types, and returns the inference settings it found
fastest. Here its tuning runs in a process of its own (its imports are heavy; a run that takes
longer than the time given is stopped), and the settings it returned are opened as Olive opens
them (its own session builder), on the stream the peer timing records its events on.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

PROVIDERS = {"gpu": "CUDAExecutionProvider", "cpu": "CPUExecutionProvider"}


def installed() -> bool:
    return importlib.util.find_spec("olive") is not None


def _tune(model: Path, feeds: dict[str, np.ndarray], folder: Path, device: str, conn: Connection) -> None:
    """In a process of its own: Olive's session-parameter tuning of ``model``; its inference settings to ``conn``."""
    from olive.workflows import run as olive_run

    gpu = device == "gpu"
    config = {
        "input_model": {"type": "ONNXModel", "model_path": str(model)},
        "systems": {
            "local": {
                "type": "LocalSystem",
                "accelerators": [{"device": device, "execution_providers": [PROVIDERS[device]]}],
            }
        },
        "data_configs": [
            {
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
        ],
        "passes": {
            "tuning": {
                "type": "OrtSessionParamsTuning",
                "data_config": "inputs",
                "device": device,
                "providers_list": PROVIDERS[device],
                "force_evaluate_other_eps": False,
                "io_bind": gpu,
                "enable_cuda_graph": gpu,
            }
        },
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
        process.join()
        return None, f"not measured: Olive's tuning failed (exit code {process.exitcode})"
    finally:
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
