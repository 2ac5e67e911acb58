"""A Triton Inference Server model repository for one trial.

``REPO/<model>/config.pbtxt`` and ``REPO/<model>/1/model.onnx`` (ONNX Runtime backend) or
``1/model.plan`` (TensorRT backend), with the export's JSON side file beside the model and its
recorded samples in ``REPO/<model>/``, outside the version folder Triton loads. Inputs,
outputs, data types and dims come from the model the trial ran (dynamic dims as -1, no batching
by Triton: ``max_batch_size: 0``). Each engine's settings go where Triton reads them (its
:class:`Deployment`'s ``triton_fields``: ONNX Runtime's in ``optimization`` and ``parameters``,
TensorRT's CUDA graphs). A setting Triton has no field for is named in a comment at the top of
the file and returned, so the caller can say that the served model is not the measured one.

Triton's own load-time rules (its ``ValidateIOShape``) are kept: every tensor needs at least one
dim, and an empty ``reshape`` (how a batching model takes a scalar) is refused where
``max_batch_size`` is 0, so a model with a scalar (0-d) input or output has no configuration
Triton loads: the export refuses it, saying why, before it writes anything.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import numpy as np
import optuna

from gpt_optuna.backends import DEPLOYMENTS
from gpt_optuna.backends.base import Deployment
from gpt_optuna.backends.side_file import SideFile
from gpt_optuna.core.engine_spec import trial_engine
from gpt_optuna.core.errors import UserError
from gpt_optuna.core.files import STAGING_SUFFIX, atomic_write, dead_stagings, staging_folder
from gpt_optuna.graph.interface import describe_changes
from gpt_optuna.graph.model import ModelInfo, TensorSpec, load_model_info
from gpt_optuna.results.export import chosen_trial, export_trial, trial_model
from gpt_optuna.study.record import StudyRecord
from gpt_optuna.study.sources import StudySources, inside
from gpt_optuna.study.summary_record import study_summary

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


def model_name(study: optuna.Study) -> str:
    """The default Triton model name: the model file's stem, in the characters Triton allows."""
    stem = (StudyRecord.read(study).model or Path(study.study_name)).stem
    return re.sub(r"[^A-Za-z0-9_.-]", "_", stem)


def write_repository(
    study: optuna.Study, number: int | None, repo: Path, name: str, force: bool = False, storage: str | None = None
) -> tuple[Path, list[str], Path]:
    """Write the trial's model directory in ``repo`` (made where it is missing; an existing model
    directory only with ``force``, what the export does not write kept: other versions, files of
    the user's); returns it, the settings left out and the export's side file. The directory is
    made whole beside its place and renamed into it, so that a kill leaves the old one or the new
    one."""
    if repo.exists() and not repo.is_dir():
        raise UserError(f"{repo} is a file, not a folder: give a model repository folder")
    if not repo.parent.is_dir():
        raise UserError(f"the folder {repo.parent} does not exist")
    trial = chosen_trial(study, study_summary(study), number)
    backend = trial_engine(StudyRecord.read(study).backend, trial.params)
    deployment = DEPLOYMENTS.get(backend or "")
    if deployment is None or deployment.triton_platform is None:
        raise UserError(
            f"Triton serves ONNX Runtime and TensorRT models; trial {trial.number} used {backend}"
            + (
                ": Triton's PyTorch backend runs TorchScript, not a program Inductor compiles; export the trial"
                " (gpt-optuna export) and load it with gpt_optuna.backends.inductor.deploy.load in a Python"
                " backend model"
                if backend == "inductor"
                else ""
            )
        )
    target = repo / name
    sources = StudySources.of(study, storage)
    sources.refuse([target], "the model folder")
    if any(inside(source, target) for source in (*sources.files, *sources.folders)):
        raise UserError(f"{target} holds files the study reads: choose another --model-name or repository")
    _put_back(target)
    if target.exists() and not force:
        raise UserError(f"{target} already exists: choose another --model-name, or overwrite with --force")
    info = load_model_info(trial_model(study, trial))  # an engine: the ONNX it was built from
    refuse_scalars(info)
    repo.mkdir(exist_ok=True)  # a new model repository
    staging = staging_folder(target)
    try:
        version = staging / "1"
        version.mkdir(parents=True)
        _, side = export_trial(study, trial.number, version / deployment.triton_model_file, True, staging)
        text, left_out = config_text(name, info, SideFile.read(side.with_suffix("")), deployment)
        atomic_write(staging / "config.pbtxt", text)
        if target.exists():  # --force: the old folder leaves as the new one comes in
            _carry_over(target, staging)
            old = staging_folder(target, old=True)
            os.rename(target, old)
            os.rename(staging, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target, left_out, target / "1" / side.name


def _put_back(target: Path) -> None:
    """Undo what a killed export of ``target`` left beside it: the old folder it was replacing put
    back where the new one never came, a folder being made removed."""
    for left in dead_stagings(target):
        if left.name.endswith(".old" + STAGING_SUFFIX) and not target.exists():
            os.rename(left, target)
        else:
            shutil.rmtree(left, ignore_errors=True)


def _carry_over(old: Path, new: Path) -> None:
    """What ``old`` holds that ``new`` does not (other versions, the user's files), into ``new``:
    linked where the file system allows it, else copied."""
    for entry in old.iterdir():
        there = new / entry.name
        if there.exists() or there.is_symlink():
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.copytree(entry, there, symlinks=True, copy_function=_link_or_copy)
        else:
            _link_or_copy(entry, there)


def _link_or_copy(source: Path | str, destination: Path | str) -> None:
    try:
        os.link(source, destination, follow_symlinks=False)
    except OSError:
        shutil.copy2(source, destination, follow_symlinks=False)


def config_text(name: str, info: ModelInfo, record: SideFile, deployment: Deployment) -> tuple[str, list[str]]:
    """``config.pbtxt`` in protobuf text format, and the trial's settings it cannot express (an
    engine Triton serves)."""
    assert deployment.triton_fields is not None, "an engine Triton does not serve"
    fields = deployment.triton_fields(record)
    lines = [f'name: "{name}"', deployment.triton_platform, "max_batch_size: 0"]
    lines += [_tensor("input", spec) for spec in info.inputs]
    lines += [_tensor("output", spec) for spec in info.outputs]
    lines.append(f"instance_group [ {{ kind: {'KIND_GPU' if fields.on_gpu else 'KIND_CPU'} count: 1 }} ]")
    lines += fields.lines
    left_out = fields.left_out
    header = [f"# gpt-optuna: study {record.study}, trial {record.trial}"]
    interface = record.interface or {}
    if interface.get("changed"):
        changed = describe_changes(interface["changes"])
        header.append(f"# the interface differs from the original model's (--allow-io-change): {changed}")
    header += [f"# not expressible in Triton's model configuration: {item}" for item in left_out]
    return "\n".join([*header, *lines]) + "\n", left_out


def refuse_scalars(info: ModelInfo) -> None:
    """A UserError for a model whose input or output is a scalar: Triton loads no configuration of it."""
    scalars = [spec.name for spec in (*info.inputs, *info.outputs) if not spec.shape]
    if scalars:
        raise UserError(
            f"Triton cannot serve {info.path.name} as exported: {', '.join(scalars)} "
            f"{'is a scalar' if len(scalars) == 1 else 'are scalars'} (0-d), and Triton's configuration needs at"
            " least one dim per tensor (dims: [1] with an empty reshape is refused where max_batch_size is 0, and"
            " batching would hand the model a batch of them); give the tensor a dim of 1 in the model, or export"
            " without --format triton"
        )


def _tensor(kind: str, spec: TensorSpec) -> str:
    dtype = DATA_TYPES.get(np.dtype(spec.dtype).name)
    if dtype is None:
        raise UserError(f"{kind} {spec.name} has type {spec.dtype}, which Triton has no type for")
    dims = ", ".join(str(d) if isinstance(d, int) and d > 0 else "-1" for d in spec.shape)
    return f'{kind} [ {{ name: "{spec.name}" data_type: {dtype} dims: [ {dims} ] }} ]'
