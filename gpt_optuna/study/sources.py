"""What a study reads (its model and the model's weights, its storage, its folder and artifact
store), so that nothing written at a user's path goes over one of them; and whether the model is
still the one the study was made with."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import optuna

from gpt_optuna.core.errors import UserError
from gpt_optuna.graph.model import file_sha256
from gpt_optuna.graph.model_copy import external_data_paths, external_data_sha256
from gpt_optuna.study.artifacts import artifact_folder
from gpt_optuna.study.folder import StudyFolder
from gpt_optuna.study.record import StudyRecord


@dataclass(frozen=True)
class StudySources:
    """The files and folders a study reads; ``storage`` is its storage's URL where known."""

    files: tuple[Path, ...]
    folders: tuple[Path, ...]
    written: Path
    """The one place in them the study's own readers write to (its checks' records)."""

    @classmethod
    def of(cls, study: optuna.Study, storage: str | None = None) -> StudySources:
        from gpt_optuna.study.storage import SQLITE_COMPANIONS, storage_file

        record = StudyRecord.read(study)
        files: list[Path] = []
        if record.model is not None:
            files += [record.model, *external_data_paths(record.model)]
        stored = storage_file(storage) if storage else None
        if stored is not None:
            files += [stored, *(stored.with_name(stored.name + c) for c in SQLITE_COMPANIONS)]
        folder = StudyFolder.of(study)
        return cls(tuple(files), (folder.root, artifact_folder(study)), folder.checks)

    def refuse(self, targets: Iterable[Path], what: str) -> None:
        """A UserError where a file of ``targets`` is one the study reads, or lies in its folders."""
        for target in targets:
            source = next((f for f in self.files if _same(target, f)), None)
            if source is not None:
                raise UserError(f"{what} {target} would overwrite {source}, which the study reads: choose another path")
            folder = next((d for d in self.folders if inside(target, d)), None)
            if folder is not None and not inside(target, self.written):
                raise UserError(f"{what} {target} is inside the study's folder {folder}: choose a path outside it")


def check_model(study: optuna.Study) -> None:
    """A UserError where the study's model or a file of its external weights is gone or changed
    since the study was made: what would be shipped is not what was tuned."""
    record = StudyRecord.read(study)
    model = record.model
    if model is None or record.model_sha256 is None:
        return
    if not model.is_file():
        raise UserError(f"the study's model {model} is gone: put it back where it was tuned")
    if not model_unchanged(record):
        raise UserError(
            f"{model} has changed since the study was made (its content hash differs from the one recorded): the"
            " study's trials ran another model; put the tuned model back, or tune the new one"
        )
    check_weights(model, record)


_UNCHANGED: dict[Path, tuple[int, int]] = {}
"""Models this process found unchanged, with the size and time of change they had then."""


def model_unchanged(record: StudyRecord) -> bool:
    """Whether the study's model file is there with the content hash it recorded (hashed once per
    process while its size and time of change stay)."""
    model = record.model
    if model is None or not model.is_file():
        return False
    stat = model.stat()
    if _UNCHANGED.get(model) == (stat.st_size, stat.st_mtime_ns):
        return True
    if file_sha256(model) != record.model_sha256:
        return False
    _UNCHANGED[model] = (stat.st_size, stat.st_mtime_ns)
    return True


def check_weights(model: Path, record: StudyRecord) -> None:
    """A UserError where a file of ``model``'s external weights is gone, or differs from the one
    ``record``'s study was made with (where it recorded them)."""
    for location, digest in external_data_sha256(model).items():
        if digest == "missing":
            raise UserError(f"{model}'s external weights {model.parent / location} are gone: put them back beside it")
        recorded = record.external_data_sha256.get(location)
        if recorded is not None and recorded != digest:
            raise UserError(
                f"{model}'s external weights {model.parent / location} have changed since the study was made: put"
                " the tuned ones back, or tune the new model"
            )


def _same(a: Path, b: Path) -> bool:
    if a.exists() and b.exists():
        return os.path.samefile(a, b)
    return a.resolve() == b.resolve()


def inside(path: Path, folder: Path) -> bool:
    """Whether ``path`` is ``folder`` or lies in it, links followed."""
    return path.resolve().is_relative_to(folder.resolve())
