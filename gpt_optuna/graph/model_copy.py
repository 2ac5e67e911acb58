"""A model file copied so that it loads wherever the copy goes, weights kept in other files included."""

from __future__ import annotations

import shutil
from pathlib import Path

PROTOBUF_LIMIT = 2**31 - 1
"""Bytes one ONNX file can hold: larger models keep their weights in a file beside it."""


def external_data_file(model: Path) -> Path:
    """Where :func:`copy_model` puts the weights of a model too large for one file: ``MODEL.data``."""
    return model.with_name(model.name + ".data")


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
