"""Write a trial's engine (or, for ONNX Runtime, its model) with a JSON side file."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from gpt_optuna.backends import DEPLOYMENTS
from gpt_optuna.backends.base import ExportedTrial
from gpt_optuna.backends.side_file import SideFile
from gpt_optuna.core.engine_spec import trial_engine
from gpt_optuna.core.errors import UserError
from gpt_optuna.core.files import Staging, roll_back_dead
from gpt_optuna.graph.feeds import relative_spec
from gpt_optuna.graph.interface import dtype_changes, io_record
from gpt_optuna.graph.model import file_sha256
from gpt_optuna.graph.model_cache import intact
from gpt_optuna.graph.model_copy import copy_model, external_data_file
from gpt_optuna.results.summary_text import headline
from gpt_optuna.study.artifacts import INPUTS_FILE, artifact_folder, verified
from gpt_optuna.study.folder import StudyFolder
from gpt_optuna.study.record import StudyRecord
from gpt_optuna.study.sources import StudySources, check_model, model_unchanged
from gpt_optuna.study.summary import StudySummary, first_value
from gpt_optuna.study.summary_record import study_summary, trial_by_number
from gpt_optuna.study.trial_record import TrialRecord


def trial_model(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> Path:
    """The ONNX model a trial ran: its transformed copy in the study folder, else the study's model;
    either checked against the hash recorded when it was made (a UserError where it changed)."""
    transformed = TrialRecord(trial).transformed_model
    if transformed:
        path = StudyFolder.of(study).models / transformed
        if path.is_file() and not intact(path):
            raise UserError(
                f"the model trial {trial.number} ran is damaged: {path} is not the file made for it (its content"
                " differs from the hash recorded then); a search or confirm that runs this candidate makes it again"
            )
        return path
    model = StudyRecord.read(study).model
    if model is None:
        raise UserError(f"study {study.study_name!r} was not made by gpt-optuna: it records no model")
    check_model(study)
    return model


def _samples(out: Path, samples_dir: Path | None) -> dict[str, Path]:
    """Where an export to ``out`` writes the recorded inputs and reference outputs: beside it, or in
    ``samples_dir``."""
    folder = out.parent if samples_dir is None else samples_dir
    return {kind: folder / f"{out.name}.{kind}.npz" for kind in ("inputs", "reference")}


def export_suffix(trial: optuna.trial.FrozenTrial, engine: str | None) -> str:
    """The file extension of what a trial of ``engine`` exports: its deployment's, else ``.plan``
    for an engine and ``.onnx`` for a model."""
    deployment = DEPLOYMENTS.get(engine or "")
    if deployment is not None and deployment.suffix:
        return deployment.suffix
    return ".plan" if TrialRecord(trial).engine_artifact is not None else ".onnx"


def written_files(out: Path, engine: bool, backend: str | None, samples_dir: Path | None = None) -> list[Path]:
    """Every file an export to ``out`` writes: the file, its side file, the recorded inputs and
    reference outputs (beside it, or in ``samples_dir``), and beside an engine what its engine's
    deployment adds (TensorRT: the ONNX model it parses)."""
    files = [out, out.with_name(out.name + ".json"), *_samples(out, samples_dir).values()]
    deployment = DEPLOYMENTS.get(backend or "")
    beside = (*deployment.beside, deployment.engine_beside) if engine and deployment is not None else ()
    files += [out.with_name(out.name + suffix) for suffix in beside]
    return files + [external_data_file(f) for f in files if f.suffix == ".onnx"]  # a model too large for one file


def refuse_overwrite(files: list[Path], force: bool) -> None:
    """A UserError naming the files that exist, unless ``force``."""
    existing = [str(f) for f in files if f.exists()]
    if existing and not force:
        verb = "exists" if len(existing) == 1 else "exist"
        raise UserError(f"{', '.join(existing)} already {verb}: choose another -o, or overwrite with --force")


def chosen_trial(study: optuna.Study, summary: StudySummary, number: int | None) -> FrozenTrial:
    """The trial ``--trial`` names, else what the study decided: its winner, or the baseline where
    the verdict keeps the default configuration; only a feasible one."""
    if number is None:
        if summary.best is None:
            raise UserError(f"study {study.study_name} has no feasible trial to export")
        trial = summary.decided
    else:
        try:
            trial = trial_by_number(study, number) if number >= 0 else None
        except KeyError:
            trial = None
        if trial is None:
            raise UserError(f"study {study.study_name} has no trial {number}")
    if trial.state is not optuna.trial.TrialState.COMPLETE:
        raise UserError(f"trial {trial.number} is {trial.state.name.lower()}: only feasible trials are exported")
    return trial


def figures_record(summary: StudySummary, trial: FrozenTrial) -> dict[str, Any]:
    """The trial's latency, the baseline's and their ratio, from one named measurement, as every
    reader states them (``best --json``, the side file)."""
    figures = summary.figures(trial)
    winner = summary.best is not None and trial.number == summary.best.number
    decided = summary.decided is not None and trial.number == summary.decided.number
    return {
        "headline": headline(summary) if winner or decided else None,
        "decided": decided,
        "measurement": figures.measurement,
        "latency_ms": figures.latency_ms,
        "baseline_latency_ms": figures.baseline_ms,
        "speedup": figures.speedup,
        "speedup_ci95": list(figures.ci) if figures.ci is not None else None,
        "significant": figures.significant if figures.ci is not None else None,
        "search_latency_ms": first_value(trial),
        "winner": winner,
        "verdict": summary.verdict if winner or decided else None,
        "your_configuration": versus_yours_record(summary, trial),
        "engine": summary.engine(trial),
        "engine_defaults": versus_engines_record(summary, trial),
    }


def versus_engines_record(summary: StudySummary, trial: FrozenTrial) -> dict[str, Any] | None:
    """The trial beside each other engine's defaults (a study of several engines), None in a study of one."""
    if not summary.engine_defaults:
        return None
    found = {}
    for engine, reference in summary.engine_defaults:
        figures = summary.versus_engine(engine, trial)
        found[engine] = {
            "trial": reference.number,
            "is_this_trial": trial.number == reference.number,
            "measurement": figures.measurement if figures is not None else None,
            "latency_ms": figures.baseline_ms if figures is not None else TrialRecord(reference).latency_ms,
            "speedup": figures.speedup if figures is not None else None,
            "speedup_ci95": list(figures.ci) if figures is not None and figures.ci is not None else None,
            "significant": figures.significant if figures is not None and figures.ci is not None else None,
        }
    return found


def versus_yours_record(summary: StudySummary, trial: FrozenTrial) -> dict[str, Any] | None:
    """The trial beside the user's own configuration (``--baseline-config``), None without one."""
    yours = summary.yours
    if yours is None:
        return None
    figures = summary.versus_yours(trial)
    own_ms, measurement = summary.your_latency()
    return {
        "trial": yours.number,
        "file": TrialRecord(yours).your_configuration,
        "params": dict(yours.params),
        "is_this_trial": trial.number == yours.number,
        "measurement": figures.measurement if figures is not None else measurement,
        "latency_ms": figures.baseline_ms if figures is not None else own_ms,
        "speedup": figures.speedup if figures is not None else None,
        "speedup_ci95": list(figures.ci) if figures is not None and figures.ci is not None else None,
        "faster": summary.beats_yours(trial),
    }


def export_trial(
    study: optuna.Study,
    number: int | None,
    out: Path,
    force: bool = False,
    samples_dir: Path | None = None,
    storage: str | None = None,
) -> tuple[Path, Path]:
    """The chosen trial (:func:`chosen_trial`) to ``out`` (given the extension of what it is where
    it has none) and ``out``.json, the recorded inputs and reference outputs beside it (or in
    ``samples_dir``), overwriting nothing without ``force`` and never a file the study reads
    (its ``storage``'s included). The files are written as one (:class:`Staging`), the side file
    last: an export interrupted or killed midway leaves the files that were there."""
    summary = study_summary(study)
    trial = chosen_trial(study, summary, number)
    record = StudyRecord.read(study)
    artifact = TrialRecord(trial).engine_artifact
    if out.suffix in (".json", ".npz"):
        kind = "engine" if artifact else "model"
        raise UserError(f"-o names the {kind} file to write; its record FILE.json is written beside it")
    engine = trial_engine(record.backend, trial.params)
    if not out.suffix:
        out = out.with_name(out.name + export_suffix(trial, engine))
    files = written_files(out, artifact is not None, engine, samples_dir)
    StudySources.of(study, storage).refuse(files, "export to")
    side_path = out.with_name(out.name + ".json")
    roll_back_dead(side_path)  # an export of the same files killed midway: back to what was there
    refuse_overwrite(files, force)
    workdir = verified(study, StudyFolder.of(study).root)
    source = trial_model(study, trial)
    if not source.is_file():
        raise UserError(f"the model of trial {trial.number} is gone: {source} (the study folder was moved or removed)")
    dropped = TrialRecord(trial).engine_dropped
    if artifact is None and dropped is not None:
        raise UserError(not_kept(trial, dropped))
    with Staging(files, side_path) as staging:
        _write_export(study, summary, trial, Written(record, source, out, workdir, samples_dir), staging)
        staging.commit()
    return out, side_path


@dataclass(frozen=True)
class Written:
    """What an export writes from: the study's record, the model the trial ran, the study's data
    folder; and where to."""

    record: StudyRecord
    source: Path
    out: Path
    workdir: Path
    samples_dir: Path | None


def _write_export(
    study: optuna.Study, summary: StudySummary, trial: FrozenTrial, where: Written, staging: Staging
) -> None:
    """The files of :func:`export_trial`, each into ``staging``."""
    artifact = TrialRecord(trial).engine_artifact
    record, source, out, workdir = where.record, where.source, where.out, where.workdir
    staged = engine_file = staging.path(out)
    deployment = DEPLOYMENTS.get(trial_engine(record.backend, trial.params) or "")
    shipped = deployment.shipped if artifact is not None and deployment is not None else None
    if shipped is not None:  # the engine (inductor's caches) beside the file shipped (its program)
        shutil.copyfile(shipped(source), staged)
        engine_file = staging.path(out.with_name(out.name + deployment.engine_beside))  # type: ignore[union-attr]
    if artifact is not None:
        from optuna.artifacts import FileSystemArtifactStore, download_artifact
        from optuna.artifacts.exceptions import ArtifactNotFound

        try:
            download_artifact(
                artifact_store=FileSystemArtifactStore(artifact_folder(study)),
                artifact_id=artifact,
                file_path=str(engine_file),
            )
        except ArtifactNotFound:
            raise UserError(not_kept(trial, "faster candidates took its place")) from None
    else:  # ONNX Runtime builds no engine file: the model it ran, with the options in the side file
        copy_model(source, staged)
    samples = _samples(out, where.samples_dir)
    confirmation = summary.confirmation
    confirmed = next((r for r in confirmation.ranking if r.number == trial.number), None) if confirmation else None
    side = SideFile(
        study=study.study_name,
        trial=trial.number,
        backend=record.backend,
        params=trial.params,
        **figures_record(summary, trial),
        latency=TrialRecord(trial).latency,
        accuracy=TrialRecord(trial).accuracy,
        accuracy_criterion=record.accuracy,
        metric=None if record.metric is None else relative_spec(record.metric, out.parent),
        shapes=record.shapes,
        interface=model_interface(study, trial, source),
        samples={kind: os.path.relpath(path, out.parent) for kind, path in samples.items()},
        confirmed=confirmed.stored if confirmed is not None else None,
        confirmed_baseline=confirmation.baseline.stored if confirmed and confirmation.baseline else None,
        versions=record.versions,
        file="pytorch program" if shipped else "engine" if artifact is not None else "onnx model",
        model_sha256=file_sha256(staged),
    )
    if deployment is not None:
        paths, inputs = StudyFolder(workdir).engine_paths, workdir / INPUTS_FILE  # workdir: the study folder
        exported = ExportedTrial(
            source, staged, trial.params, record.defaults, record.shapes or {}, paths, inputs, record.versions
        )
        side = replace(side, sections=deployment.side_file(exported))
    for kind, path in samples.items():  # what a later `gpt-optuna check` compares a changed model on
        shutil.copyfile(workdir / f"{kind}.npz", staging.path(path))
    staging.path(out.with_name(out.name + ".json")).write_text(side.to_json())


def not_kept(trial: FrozenTrial, why: str) -> str:
    """Why a trial's engine cannot be exported: the artifact store did not keep it."""
    return (
        f"the engine of trial {trial.number} was not kept ({why}): the study keeps the baseline's and the fastest"
        " candidates' engines; export one of those, or search with --keep-all-engines to keep every one"
    )


def model_interface(study: optuna.Study, trial: FrozenTrial, model: Path) -> dict[str, Any]:
    """The inputs and outputs of the model a trial ran (an engine's are those of the ONNX graph it
    was built from), with the dtypes it changed against the study's model: the side file's ``interface``."""
    from gpt_optuna.graph.model import load_model_info

    record = StudyRecord.read(study)
    made = load_model_info(model)
    original = record.model
    if original is not None and model_unchanged(record):
        changes = dtype_changes(load_model_info(original), made)
    else:  # the model file moved or changed: the changes the evaluation recorded
        changes = TrialRecord(trial).io_changes
    interface = io_record(made, changes, record.allow_io_change)
    engine_io = TrialRecord(trial).engine_io
    if engine_io is not None:  # the dtypes the engine itself was built to take and return
        interface["engine"] = engine_io
    return interface
