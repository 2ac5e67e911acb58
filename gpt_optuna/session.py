"""Open an exported ONNX Runtime model as it was tuned."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from gpt_optuna.errors import UserError


def read_record(path: str | Path) -> dict[str, Any]:
    """The side file ``PATH.json`` that ``gpt-optuna export`` wrote beside ``PATH``."""
    side = Path(f"{path}.json")
    if not side.is_file():
        raise UserError(f"{side} is missing: open a file written by gpt-optuna export")
    try:
        return json.loads(side.read_text())
    except json.JSONDecodeError as exc:
        raise UserError(f"{side} is not the JSON gpt-optuna export writes: {exc}") from exc


def open_session(path: str | Path, device_id: int | None = None) -> Any:
    """An ``onnxruntime.InferenceSession`` of an exported ONNX Runtime trial, configured exactly as
    the trial was: its session options, session config entries, execution provider and provider
    options. ``device_id`` picks another GPU than the one tuned on (default: the recorded one)."""
    import onnxruntime as ort

    from gpt_optuna.backends.onnxruntime import options_from_settings

    record = read_record(path)
    settings = record.get("onnxruntime")
    if settings is None:
        raise UserError(f"{path} is a {record.get('backend')} export, not an ONNX Runtime one")
    if hashlib.sha256(Path(path).read_bytes()).hexdigest() != record.get("model_sha256"):
        raise UserError(f"{path} is not the model that was exported with {path}.json (its content changed)")
    (provider, options), *_ = settings["providers"]
    if provider not in ort.get_available_providers():
        raise UserError(f"{path} was tuned on {provider}, which this onnxruntime build does not have")
    if device_id is not None and "device_id" in options:
        options = {**options, "device_id": str(device_id)}
    session = ort.InferenceSession(str(path), options_from_settings(settings), providers=[(provider, options)])
    if session.get_providers()[:1] != [provider]:
        raise UserError(f"{provider} could not take {path}; ONNX Runtime fell back to {session.get_providers()[0]}")
    return session
