"""How Triton's ONNX Runtime backend runs an exported trial: the graph level in
``optimization.graph.level``, threads, execution mode, memory arena and pattern in ``parameters``,
CUDA and TensorRT provider options in ``optimization.execution_accelerators``."""

from __future__ import annotations

from gpt_optuna.backends.base import TritonFields
from gpt_optuna.backends.onnxruntime.settings import CPU, CUDA, EXECUTION_MODES, PROVIDER_OPTIONS, TENSORRT
from gpt_optuna.backends.side_file import SideFile

GRAPH_LEVELS = {"ORT_ENABLE_ALL": None, "ORT_ENABLE_BASIC": -1, "ORT_ENABLE_EXTENDED": 1, "ORT_DISABLE_ALL": 2}
"""ONNX Runtime's graph levels as the backend's ``optimization.graph.level`` (None: the default, all)."""
SESSION_PARAMETERS = {
    "execution_mode": "execution_mode",
    "intra_op_num_threads": "intra_op_thread_count",
    "inter_op_num_threads": "inter_op_thread_count",
    "enable_cpu_mem_arena": "enable_mem_arena",
    "enable_mem_pattern": "enable_mem_pattern",
}
"""SessionOptions attributes and the backend's ``parameters`` keys for them."""
CONFIG_DEFAULTS = {"session.intra_op.allow_spinning": "1", "session.set_denormal_as_zero": "0"}
"""ONNX Runtime's own values for the session config entries the search sets: one at its default
needs no field in Triton's configuration."""
TRITON_NAMES = {row.option: row.triton for row in PROVIDER_OPTIONS if row.provider == TENSORRT}
"""The searched TensorRT provider options by the names the backend's ``tensorrt`` accelerator takes
them under (None: it has no field for one)."""
PRECISION_MODE = "precision_mode"
"""The accelerator's precision: ``FP16`` where the trial enabled fp16."""
KEPT_CACHE = "trt_timing_cache_enable"
"""The timing cache, on as the trial had it; Triton keeps the cache where it chooses."""


def triton_fields(record: SideFile) -> TritonFields:
    """The side file's ONNX Runtime settings as Triton configuration fields, and those it has no field for."""
    settings = record.sections.get("onnxruntime")
    if not settings:
        return TritonFields(on_gpu=True)
    options, entries = settings["session_options"], settings["session_config_entries"]
    provider, provider_options = settings["providers"][0]
    left_out: list[str] = []
    inner: list[str] = []
    level = options["graph_optimization_level"]
    if level not in GRAPH_LEVELS:
        left_out.append(f"graph_optimization_level={level}")
    elif GRAPH_LEVELS[level] is not None:
        inner.append(f"graph {{ level: {GRAPH_LEVELS[level]} }}")
    accelerator = _accelerator(provider, provider_options, left_out)
    if accelerator:
        inner.append(f"execution_accelerators {{ gpu_execution_accelerator [ {accelerator} ] }}")
    lines = [f"optimization {{ {' '.join(inner)} }}"] if inner else []
    for attribute, key in SESSION_PARAMETERS.items():
        if attribute in options:
            value = str(options[attribute])
            text = str(EXECUTION_MODES.index(value)) if value in EXECUTION_MODES else value.lower()
            lines.append(f'parameters {{ key: "{key}" value: {{ string_value: "{text}" }} }}')
    left_out += [f"session config {key}={value}" for key, value in entries.items() if CONFIG_DEFAULTS.get(key) != value]
    return TritonFields(provider != CPU, lines, left_out)


def _accelerator(provider: str, options: dict[str, str], left_out: list[str]) -> str:
    if provider == CUDA:
        chosen = {k: v for k, v in options.items() if k != "device_id"}  # Triton picks the device
        name = "cuda"
    elif provider == TENSORRT:
        chosen, precision = {}, {}
        for key, value in options.items():
            if key == KEPT_CACHE:
                chosen[key] = value
            elif key not in TRITON_NAMES:  # where the session runs, the cache's path: not the trial's settings
                continue
            elif TRITON_NAMES[key] is None:
                left_out.append(f"{key}={value}")
            elif TRITON_NAMES[key] == PRECISION_MODE:
                precision = {PRECISION_MODE: "FP16"} if value == "1" else {}  # off: Triton's default, FP32
            else:
                chosen[TRITON_NAMES[key]] = value
        chosen |= precision
        name = "tensorrt"
    else:
        return ""
    pairs = " ".join(f'parameters {{ key: "{k}" value: "{v}" }}' for k, v in chosen.items())
    return f'{{ name: "{name}" {pairs} }}'
