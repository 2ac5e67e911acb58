"""Open an exported ONNX Runtime model as it was tuned."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from gpt_optuna.backends.side_file import SideFile
from gpt_optuna.core.errors import UserError


def open_session(path: str | Path, device_id: int | None = None, io: str = "model") -> Any:
    """An ``onnxruntime.InferenceSession`` of an exported ONNX Runtime trial, configured exactly as
    the trial was: its session options, session config entries, execution provider and provider
    options. ``device_id`` picks another GPU than the one tuned on (default: the recorded one).

    A model whose study allowed I/O dtype changes (``--allow-io-change``) and whose inputs or
    outputs changed opens, by default (``io="model"``), as a :class:`ConvertingSession`: its
    ``run`` takes and returns the original model's dtypes. ``io="exported"`` returns the plain
    session, which takes and returns the exported dtypes (e.g. float16).
    """
    import onnxruntime as ort

    from gpt_optuna.backends.onnxruntime.settings import options_from_settings

    if io not in ("model", "exported"):
        raise UserError(f"io must be 'model' or 'exported', not {io!r}")
    record = SideFile.read(path)
    settings = record.sections.get("onnxruntime")
    if settings is None:
        raise UserError(f"{path} is a {record.backend} export, not an ONNX Runtime one")
    if hashlib.sha256(Path(path).read_bytes()).hexdigest() != record.model_sha256:
        raise UserError(f"{path} is not the model that was exported with {path}.json (its content changed)")
    (provider, options), *_ = settings["providers"]
    if provider not in ort.get_available_providers():
        raise UserError(f"{path} was tuned on {provider}, which this onnxruntime build does not have")
    if device_id is not None and "device_id" in options:
        options = {**options, "device_id": str(device_id)}
    session = ort.InferenceSession(str(path), options_from_settings(settings), providers=[(provider, options)])
    if session.get_providers()[:1] != [provider]:
        raise UserError(f"{provider} could not take {path}; ONNX Runtime fell back to {session.get_providers()[0]}")
    changes = (record.interface or {}).get("changes") or {}
    return ConvertingSession(session, changes, Path(path).name) if changes and io == "model" else session


class ConvertingSession:
    """An exported session whose inputs or outputs are of other dtypes than the original model's,
    used as the original: ``run`` casts each input from the model's dtype to the exported one and
    each output back; an input of any other dtype is refused in one line. Everything else (``get_inputs``,
    I/O binding, ...) is the underlying session's, as exported: ``session``."""

    def __init__(self, session: Any, changes: dict[str, dict[str, list[str]]], name: str) -> None:
        self.session = session
        self._inputs = {n: (np.dtype(old), np.dtype(new)) for n, (old, new) in changes.get("inputs", {}).items()}
        self._outputs = {n: np.dtype(old) for n, (old, _) in changes.get("outputs", {}).items()}
        self._name = name

    def __getattr__(self, name: str) -> Any:
        return getattr(self.session, name)

    def run(self, output_names: list[str] | None, input_feed: dict[str, Any], run_options: Any = None) -> list[Any]:
        feeds = dict(input_feed)
        for name, (model, exported) in self._inputs.items():
            if name not in feeds:
                continue
            given = np.asarray(feeds[name])
            if given.dtype not in (model, exported):
                raise UserError(
                    f"input {name} is {given.dtype.name}: {self._name} takes {model.name}, the original model's"
                    f" dtype (its engine computes in {exported.name})"
                )
            feeds[name] = given.astype(exported, copy=False)
        names = output_names or [o.name for o in self.session.get_outputs()]
        outputs = self.session.run(names, feeds, run_options)
        return [o.astype(self._outputs[n]) if n in self._outputs else o for n, o in zip(names, outputs, strict=True)]
