"""A model file copied so that it loads wherever the copy goes, weights kept in other files included."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from gpt_optuna.graph.model import file_sha256

PROTOBUF_LIMIT = 2**31 - 1
"""Bytes one ONNX file can hold: larger models keep their weights in a file beside it."""


def external_data_file(model: Path) -> Path:
    """Where :func:`copy_model` puts the weights of a model too large for one file: ``MODEL.data``."""
    return model.with_name(model.name + ".data")


def external_data_paths(model: Path) -> list[Path]:
    """The files beside ``model`` that hold the weights it keeps outside itself, in the order it
    names them (none for a model that holds them all; an unreadable model: none)."""
    import onnx
    from onnx.external_data_helper import ExternalDataInfo, _get_all_tensors, uses_external_data

    try:
        proto = onnx.load(str(model), load_external_data=False)
    except Exception:  # not an ONNX file: it names no other file
        return []
    locations = [ExternalDataInfo(t).location for t in _get_all_tensors(proto) if uses_external_data(t)]
    return [model.parent / location for location in dict.fromkeys(locations)]


def external_data_sha256(model: Path) -> dict[str, str]:
    """The content hash of each file holding ``model``'s external weights, by the location it names;
    a file that is missing: ``"missing"``."""
    return {
        os.path.relpath(path, model.parent): file_sha256(path) if path.is_file() else "missing"
        for path in external_data_paths(model)
    }


def copy_model(source: Path, dest: Path) -> None:
    """``source`` to ``dest``: byte for byte where the file holds every weight; else with the weights
    it keeps in other files brought along, inside ``dest`` where the whole fits one file, otherwise in
    :func:`external_data_file` beside it (a plain copy would point at files left behind)."""
    import onnx
    from onnx.external_data_helper import _get_all_tensors, load_external_data_for_model, uses_external_data

    model = onnx.load(str(source), load_external_data=False)
    if not any(uses_external_data(t) for t in _get_all_tensors(model)):
        shutil.copyfile(source, dest)
        return
    load_external_data_for_model(model, str(source.parent))
    if model.ByteSize() < PROTOBUF_LIMIT:
        onnx.save_model(model, str(dest))
        return
    location = external_data_file(dest).name
    onnx.save_model(model, str(dest), save_as_external_data=True, all_tensors_to_one_file=True, location=location)
