"""Where every worker of a study finds what it needs besides the storage: the study's artifact
store (engines, and the data below), and the inputs, reference outputs and calibration samples
kept there as Optuna artifacts of the study, so that a worker on another host reads them from
the store rather than from the first host's disk."""

from __future__ import annotations

from pathlib import Path

import optuna
from optuna.artifacts import FileSystemArtifactStore, download_artifact, upload_artifact

from gpt_optuna.core.errors import UserError
from gpt_optuna.core.files import atomic_path
from gpt_optuna.graph.model import file_sha256
from gpt_optuna.study.folder import StudyFolder
from gpt_optuna.study.record import ARTIFACTS_ATTR, DATA_ATTR
from gpt_optuna.study.trial_record import TrialRecord

INPUTS_FILE, REFERENCE_FILE, CALIBRATION_FILE = "inputs.npz", "reference.npz", "calibration.npz"
"""What a study folder caches: the inputs, the fp32 reference outputs, the calibration samples."""
DATA_FILES = (INPUTS_FILE, REFERENCE_FILE, CALIBRATION_FILE)


def artifact_folder(study: optuna.Study, given: Path | None = None) -> Path:
    """The study's artifact store: ``given`` (the same store seen from this host), else the one
    it recorded, else the study folder's (studies made before it was recorded)."""
    if given is not None:
        return given.resolve()
    recorded = study.user_attrs.get(ARTIFACTS_ATTR)
    return Path(recorded) if recorded else StudyFolder.of(study).artifacts


def kept_engine(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> tuple[Path | None, str | None]:
    """The engine file the trial kept in the study's store (None where it kept none), and where
    it kept one that is gone, why it is built again instead (said to the user)."""
    artifact = TrialRecord(trial).engine_artifact
    if artifact is None:
        return None, None
    path = artifact_folder(study) / artifact
    if not path.is_file():
        return None, f"trial {trial.number}'s kept engine ({path}) is gone: it is built again"
    return path, None


def publish(study: optuna.Study, store: Path, workdir: Path) -> None:
    """Record the store, and upload each data file of ``workdir`` that the store lacks or holds
    in another version."""
    store.mkdir(parents=True, exist_ok=True)
    if study.user_attrs.get(ARTIFACTS_ATTR) is None:
        study.set_user_attr(ARTIFACTS_ATTR, str(store.resolve()))
    shared = dict(study.user_attrs.get(DATA_ATTR, {}))
    for name in DATA_FILES:
        path = workdir / name
        if not path.is_file():
            continue
        digest = file_sha256(path)
        if shared.get(name, {}).get("sha256") != digest:
            artifact = upload_artifact(
                artifact_store=FileSystemArtifactStore(store), file_path=str(path), study_or_trial=study
            )
            shared[name] = {"artifact": artifact, "sha256": digest}
    study.set_user_attr(DATA_ATTR, shared)


def fetch(study: optuna.Study, store: Path, workdir: Path, not_here: str) -> None:
    """Copy the study's data files from the store into ``workdir`` where they are missing or differ;
    ``not_here``: the error where the store is not on this host (what the command can do about it)."""
    shared = study.user_attrs.get(DATA_ATTR)
    if not shared or INPUTS_FILE not in shared:
        raise UserError(
            f"study {study.study_name!r} has no input data in its artifact store yet: start the search with "
            "gpt-optuna tune (this version) before workers join"
        )
    stale = {n: e for n, e in shared.items() if not (workdir / n).is_file() or file_sha256(workdir / n) != e["sha256"]}
    if stale and not store.is_dir():
        raise UserError(not_here)
    workdir.mkdir(parents=True, exist_ok=True)
    for name, entry in stale.items():
        with atomic_path(workdir / name) as incoming:
            try:
                artifacts = FileSystemArtifactStore(store)
                download_artifact(artifact_store=artifacts, artifact_id=entry["artifact"], file_path=str(incoming))
            except Exception as exc:
                raise UserError(f"cannot read {name} of study {study.study_name!r} from {store}: {exc}") from exc
            if file_sha256(incoming) != entry["sha256"]:
                raise UserError(
                    f"{name} in the artifact store {store} does not match what study {study.study_name!r} recorded"
                )


def verified(study: optuna.Study, workdir: Path) -> Path:
    """``workdir`` with the study's data files as the study recorded them: a file missing or changed
    since (corrupted, truncated) is copied again from the artifact store, or one clear error says
    why it cannot be (a study folder moved: where the study expects it). Studies made before their
    data was recorded are taken as they are."""
    if study.user_attrs.get(DATA_ATTR):
        store, folder = artifact_folder(study), StudyFolder.of(study)
        if store.is_relative_to(folder.root) and not folder.root.is_dir():
            not_here = folder.gone(study.study_name)
        else:
            not_here = f"the study's artifact store {store} is not there: mount it there again, or link it there"
        fetch(study, store, workdir, not_here)
    return workdir
