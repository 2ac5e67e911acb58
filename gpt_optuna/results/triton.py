"""A Triton Inference Server model repository for one trial.

``REPO/<model>/config.pbtxt`` and ``REPO/<model>/1/model.onnx`` (ONNX Runtime backend) or
``1/model.plan`` (TensorRT backend), with the export's JSON side file beside the model. Inputs,
outputs, data types and dims come from the model the trial ran (dynamic dims as -1, no batching
by Triton: ``max_batch_size: 0``). The trial's ONNX Runtime settings go where Triton's ONNX
Runtime backend reads them: the graph level in ``optimization.graph.level``, threads, execution
mode, memory arena and pattern in ``parameters``, CUDA and TensorRT provider options in
``optimization.execution_accelerators``. A setting Triton has no field for is named in a comment
at the top of the file and returned, so the caller can say so.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import optuna

from gpt_optuna.core.errors import UserError
from gpt_optuna.graph.interface import describe_changes
from gpt_optuna.graph.model import ModelInfo, TensorSpec, load_model_info
from gpt_optuna.results.export import export_trial, trial_model
from gpt_optuna.study.record import FINGERPRINT_ATTR

DATA_TYPES = {
    "float32": "TYPE_FP32",
    "float16": "TYPE_FP16",
    "float64": "TYPE_FP64",
    "int8": "TYPE_INT8",
    "int16": "TYPE_INT16",
    "int32": "TYPE_INT32",
    "int64": "TYPE_INT64",
    "uint8": "TYPE_UINT8",
    "uint16": "TYPE_UINT16",
    "uint32": "TYPE_UINT32",
    "uint64": "TYPE_UINT64",
    "bool": "TYPE_BOOL",
    "object": "TYPE_STRING",
}
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
TENSORRT_ACCELERATOR = {
    "trt_builder_optimization_level": "trt_builder_optimization_level",
    "trt_cuda_graph_enable": "trt_cuda_graph_enable",
    "trt_auxiliary_streams": "trt_auxiliary_streams",
    "trt_timing_cache_enable": "trt_timing_cache_enable",
}
"""TensorRT provider options the backend's ``tensorrt`` accelerator takes under the same names
(``trt_fp16_enable`` is its ``precision_mode``)."""


def model_name(study: optuna.Study) -> str:
    """The default Triton model name: the model file's stem, in the characters Triton allows."""
    stem = Path(study.user_attrs.get(FINGERPRINT_ATTR, {}).get("model", study.study_name)).stem
    return re.sub(r"[^A-Za-z0-9_.-]", "_", stem)


def write_repository(
    study: optuna.Study, number: int | None, repo: Path, name: str, force: bool = False
) -> tuple[Path, list[str], Path]:
    """Write the trial's model directory in ``repo`` (an existing one only with ``force``); returns
    it, the settings left out and the export's side file."""
    if not repo.is_dir():
        raise UserError(f"{repo} is not a folder: create the model repository first")
    backend = study.user_attrs.get(FINGERPRINT_ATTR, {}).get("backend")
    if backend not in ("onnxruntime", "tensorrt"):
        raise UserError(f"Triton serves ONNX Runtime and TensorRT models; study {study.study_name} used {backend}")
    if (repo / name).exists() and not force:
        raise UserError(f"{repo / name} already exists: choose another --model-name, or overwrite with --force")
    version = repo / name / "1"
    version.mkdir(parents=True, exist_ok=True)
    plan = backend == "tensorrt"
    written, side = export_trial(study, number, version / ("model.plan" if plan else "model.onnx"), force=True)
    exported = json.loads(side.read_text())
    info = load_model_info(trial_model(study, study.trials[exported["trial"]]) if plan else written)
    text, left_out = config_text(name, info, exported, plan)
    (repo / name / "config.pbtxt").write_text(text)
    return repo / name, left_out, side


def config_text(name: str, info: ModelInfo, record: dict[str, Any], plan: bool) -> tuple[str, list[str]]:
    """``config.pbtxt`` in protobuf text format, and the trial's settings it cannot express."""
    settings = record.get("onnxruntime")
    provider = settings["providers"][0][0] if settings else "TensorrtPlan"
    gpu = plan or provider != "CPUExecutionProvider"
    lines = [f'name: "{name}"', 'platform: "tensorrt_plan"' if plan else 'backend: "onnxruntime"', "max_batch_size: 0"]
    lines += [_tensor("input", spec) for spec in info.inputs]
    lines += [_tensor("output", spec) for spec in info.outputs]
    lines.append(f"instance_group [ {{ kind: {'KIND_GPU' if gpu else 'KIND_CPU'} count: 1 }} ]")
    left_out: list[str] = []
    if plan:
        graphs = bool(record["params"].get("runtime.cuda_graph")) or (
            record["params"].get("runtime.cuda_graph_strategy", "DISABLED") != "DISABLED"
        )
        if graphs:
            lines.append("optimization { cuda { graphs: true } }")
        left_out += [k for k in record["params"] if k == "runtime.aux_streams" and record["params"][k]]
    elif settings:
        optimization, parameters, more = _onnxruntime_fields(settings)
        lines += optimization + parameters
        left_out += more
    header = [f"# gpt-optuna: study {record['study']}, trial {record['trial']}"]
    interface = record.get("interface") or {}
    if interface.get("changed"):
        changed = describe_changes(interface["changes"])
        header.append(f"# the interface differs from the original model's (--allow-io-change): {changed}")
    header += [f"# not expressible in Triton's model configuration: {item}" for item in left_out]
    return "\n".join([*header, *lines]) + "\n", left_out


def _onnxruntime_fields(settings: dict[str, Any]) -> tuple[list[str], list[str], list[str]]:
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
    optimization = [f"optimization {{ {' '.join(inner)} }}"] if inner else []
    parameters = []
    for attribute, key in SESSION_PARAMETERS.items():
        if attribute in options:
            value = options[attribute]
            text = {"ORT_SEQUENTIAL": "0", "ORT_PARALLEL": "1"}.get(str(value), str(value).lower())
            parameters.append(f'parameters {{ key: "{key}" value: {{ string_value: "{text}" }} }}')
    left_out += [f"session config {key}={value}" for key, value in entries.items() if CONFIG_DEFAULTS.get(key) != value]
    return optimization, parameters, left_out


def _accelerator(provider: str, options: dict[str, str], left_out: list[str]) -> str:
    if provider == "CUDAExecutionProvider":
        chosen = {k: v for k, v in options.items() if k != "device_id"}  # Triton picks the device
        name = "cuda"
    elif provider == "TensorrtExecutionProvider":
        chosen = {TENSORRT_ACCELERATOR[k]: v for k, v in options.items() if k in TENSORRT_ACCELERATOR}
        if options.get("trt_fp16_enable") == "1":
            chosen["precision_mode"] = "FP16"
        name = "tensorrt"
    else:
        return ""
    pairs = " ".join(f'parameters {{ key: "{k}" value: "{v}" }}' for k, v in chosen.items())
    return f'{{ name: "{name}" {pairs} }}'


def _tensor(kind: str, spec: TensorSpec) -> str:
    dtype = DATA_TYPES.get(np.dtype(spec.dtype).name)
    if dtype is None:
        raise UserError(f"{kind} {spec.name} has type {spec.dtype}, which Triton has no type for")
    dims = ", ".join(str(d) if isinstance(d, int) and d > 0 else "-1" for d in spec.shape)
    return f'{kind} [ {{ name: "{spec.name}" data_type: {dtype} dims: [ {dims} ] }} ]'
