"""A user's own ONNX Runtime configuration (``--baseline-config``) in the space's knob names.

The file names sessions as ONNX Runtime does, the way an export's side file writes them: TOML or
JSON with ``providers`` (names, or ``[name, {options}]`` pairs: the first is the one used),
``session_options`` (``SessionOptions`` attributes) and ``session_config_entries``; an export's
``FILE.json`` itself (its ``onnxruntime`` table) is one. Each setting maps to the knob that sets
it (:func:`settings.session_settings` and :func:`settings.provider_options`, read backwards); a
setting no knob sets is refused in one line, since a baseline the tuner cannot reproduce would be
measured as something else.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpt_optuna.backends.onnxruntime.settings import (
    CPU,
    CUDA,
    CUDA_OPTIONS,
    EXECUTION_MODES,
    GRAPH_LEVEL,
    OPTIONAL_GRAPH_LEVELS,
    PROVIDER_OPTIONS,
    TENSORRT,
)
from gpt_optuna.core.errors import UserError
from gpt_optuna.core.space import Value

_GRAPH_LEVELS = dict(enumerate(OPTIONAL_GRAPH_LEVELS)) | {99: "ORT_ENABLE_ALL"}
_EXECUTION_MODES = dict(enumerate(EXECUTION_MODES))

_SESSION_OPTIONS = {
    "graph_optimization_level": GRAPH_LEVEL,
    "enable_mem_pattern": "mem_pattern",
    "execution_mode": "execution_mode",
    "intra_op_num_threads": "intra_op_num_threads",
    "inter_op_num_threads": "inter_op_num_threads",
    "enable_cpu_mem_arena": "cpu_mem_arena",
}
_ENTRIES = {
    "session.intra_op.allow_spinning": "intra_op_spinning",
    "session.set_denormal_as_zero": "denormal_as_zero",
} | {o.entry: o.knob for o in CUDA_OPTIONS if o.entry is not None}
_PROVIDER_OPTIONS = {
    provider: {row.option: row.knob for row in PROVIDER_OPTIONS if row.provider == provider}
    for provider in (CUDA, TENSORRT, CPU)
}
_PROVIDER_OPTIONS[CUDA] |= {key: o.knob for o in CUDA_OPTIONS for key in o.keys}
_PLACEMENT = frozenset({"device_id", "has_user_compute_stream", "user_compute_stream"})
"""Provider options that say where a session runs, not how: the tuner sets its own."""
_CACHES = frozenset({"trt_timing_cache_enable", "trt_timing_cache_path", "trt_engine_cache_enable"})
"""TensorRT provider options that keep files between sessions (the tuner keeps its own cache)."""


def read_settings(path: Path) -> dict[str, Any]:
    """The ONNX Runtime settings of a TOML or JSON file (an export's side file included)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise UserError(f"--baseline-config {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        kind = "JSON" if path.suffix == ".json" else "TOML"
        raise UserError(f"--baseline-config {path} is not valid {kind}: {exc}") from None
    settings = data.get("onnxruntime", data) if isinstance(data, dict) else None
    if not isinstance(settings, dict):
        raise UserError(f"--baseline-config {path}: give providers, session_options and session_config_entries")
    return settings


def knob_values(settings: Mapping[str, Any], where: str) -> dict[str, Value]:
    """The knobs (name -> value) that set what ``settings`` (:func:`read_settings`) say; a
    UserError naming the first setting no knob sets, or a value of the wrong kind."""
    unknown = sorted(set(settings) - {"providers", "session_options", "session_config_entries"})
    if unknown:
        tables = "providers, session_options, session_config_entries"
        raise UserError(f"{where}: unknown table {unknown[0]!r}; give {tables}")
    values: dict[str, Value] = {}
    provider, options = _provider(settings.get("providers", [CPU]), where)
    values["provider"] = provider
    for table, names, given in (
        ("session_options", _SESSION_OPTIONS, settings.get("session_options", {})),
        ("session_config_entries", _ENTRIES, settings.get("session_config_entries", {})),
        (f"the options of {provider}", _PROVIDER_OPTIONS.get(provider, {}), options),
    ):
        if not isinstance(given, dict):
            raise UserError(f"{where}: {table} must be a table of settings")
        for key, value in given.items():
            if key in _PLACEMENT or key in _CACHES and provider == TENSORRT:
                continue
            if key not in names:
                raise UserError(f"{where}: {table} sets {key!r}, which the tuner cannot set ({', '.join(names)})")
            values[names[key]] = _value(names[key], value, where)
    return values


def _provider(providers: Any, where: str) -> tuple[str, dict[str, Any]]:
    """The first provider of a ``providers`` list, and its options."""
    first = providers[0] if isinstance(providers, list) and providers else None
    if isinstance(first, str):
        name, options = first, {}
    elif isinstance(first, list | tuple) and len(first) in (1, 2):
        name, options = first[0], first[1] if len(first) == 2 else {}
    else:
        name, options = None, None
    if not isinstance(name, str) or not isinstance(options, dict):
        raise UserError(f'{where}: providers must list names or [name, {{options}}] pairs, e.g. ["{CPU}"]')
    if name not in _PROVIDER_OPTIONS:
        raise UserError(f"{where}: provider {name!r} is not one the tuner runs ({', '.join(_PROVIDER_OPTIONS)})")
    return name, options


def _value(knob: str, value: Any, where: str) -> Value:
    """A setting's value as the knob holds it: enum members by name, switches as booleans,
    numbers as numbers (ONNX Runtime's option strings ``"1"``, ``"0"``, ``"8"`` included)."""
    if knob == GRAPH_LEVEL:
        return _named(value, _GRAPH_LEVELS, knob, where)
    if knob == "execution_mode":
        return _named(value, _EXECUTION_MODES, knob, where)
    if isinstance(value, bool | int | float):
        return value
    text = str(value).strip()
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return int(text)
    except ValueError:
        return text


def _named(value: Any, names: Mapping[int, str], knob: str, where: str) -> str:
    if isinstance(value, int) and value in names:
        return names[value]
    text = str(value).removeprefix("GraphOptimizationLevel.").removeprefix("ExecutionMode.")
    if text not in names.values():
        raise UserError(f"{where}: {knob} = {value!r}: give one of {', '.join(names.values())}")
    return text
