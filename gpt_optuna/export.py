"""Write a trial's engine (or, for ONNX Runtime, its model) with a JSON side file."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import optuna

from gpt_optuna.errors import UserError
from gpt_optuna.shared_data import artifact_folder
from gpt_optuna.study import FINGERPRINT_ATTR, first_value, summarize_study


def onnxruntime_settings(candidate: dict[str, Any], folder: Path) -> dict[str, Any]:
    """How ONNX Runtime must open the model to run it as the trial did, in its own names
    (``gpt_optuna.open_session`` applies it); a TensorRT-provider timing cache goes in ``folder``."""
    from gpt_optuna.backends.onnxruntime import provider_options, session_settings

    return session_settings(candidate) | {
        "providers": [[candidate["provider"], provider_options(candidate, None, folder.resolve())]]
    }


def trial_model(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> Path:
    """The ONNX model a trial ran: its transformed copy in the study folder, else the study's model."""
    transformed = trial.user_attrs.get("transformed_model")
    if transformed:
        return Path("studies") / study.study_name / "models" / transformed
    return Path(study.user_attrs[FINGERPRINT_ATTR]["model"])


def build_commands(
    study: optuna.Study, trial: optuna.trial.FrozenTrial, engine: Path, defaults: dict[str, Any]
) -> dict[str, Any]:
    """``trtexec`` and ``polygraphy convert`` lines that build the trial's engine from the ONNX
    model TensorRT parsed (written beside the engine as ``ENGINE.onnx``), and the settings that
    have no flag in each."""
    from gpt_optuna.constant_folding import folded
    from gpt_optuna.model import load_model_info
    from gpt_optuna.trt_commands import polygraphy, trtexec

    recorded = study.user_attrs[FINGERPRINT_ATTR]
    parsed = engine.with_name(engine.name + ".onnx")
    models = Path("studies") / study.study_name / "models"
    shutil.copyfile(folded(load_model_info(trial_model(study, trial)), models).path, parsed)
    lines = [
        make(parsed.name, engine.name, trial.params, defaults, recorded.get("shapes", {}))
        for make in (trtexec, polygraphy)
    ]
    return {line.tool: line.text() for line in lines} | {f"{line.tool}_no_flag": line.no_flag for line in lines}


def _beside(out: Path, kind: str) -> str:
    return f"{out.name}.{kind}.npz"


def export_trial(study: optuna.Study, number: int | None, out: Path) -> tuple[Path, Path]:
    """The chosen trial (default: the best, confirmed ranking first) to ``out`` and ``out``.json."""
    summary = summarize_study(study)
    trials = study.get_trials(deepcopy=False)
    if number is None:
        if summary.best is None:
            raise UserError(f"study {study.study_name} has no feasible trial to export")
        trial = summary.best
    elif 0 <= number < len(trials):
        trial = trials[number]
    else:
        raise UserError(f"study {study.study_name} has no trial {number}")
    if trial.state is not optuna.trial.TrialState.COMPLETE:
        raise UserError(f"trial {trial.number} is {trial.state.name.lower()}: only feasible trials are exported")
    recorded = study.user_attrs.get(FINGERPRINT_ATTR, {})
    workdir = Path("studies") / study.study_name
    artifact = trial.user_attrs.get("engine_artifact")
    if artifact is not None:
        from optuna.artifacts import FileSystemArtifactStore, download_artifact

        if out.exists():
            out.unlink()
        download_artifact(
            artifact_store=FileSystemArtifactStore(artifact_folder(study)), artifact_id=artifact, file_path=str(out)
        )
    else:  # ONNX Runtime builds no engine file: the model it ran, with the options in the side file
        source = trial_model(study, trial)
        if not source.is_file():
            raise UserError(f"the model of trial {trial.number} is gone: {source}")
        shutil.copyfile(source, out)
    defaults = {knob["name"]: knob["default"] for knob in recorded.get("space", [])}
    confirmed = next((r for r in (summary.confirmed or {}).get("ranking", []) if r["number"] == trial.number), None)
    side: dict[str, Any] = {
        "study": study.study_name,
        "trial": trial.number,
        "backend": recorded.get("backend"),
        "params": trial.params,
        "latency_ms": first_value(trial),
        "latency": trial.user_attrs.get("latency"),
        "accuracy": trial.user_attrs.get("accuracy"),
        "accuracy_criterion": recorded.get("accuracy"),
        "metric": recorded.get("metric"),
        "shapes": recorded.get("shapes"),
        "samples": {"inputs": _beside(out, "inputs"), "reference": _beside(out, "reference")},
        "baseline_latency_ms": summary.baseline_search_value,
        "speedup": summary.baseline_search_value / first_value(trial)  # the search's two figures
        if summary.baseline_search_value and first_value(trial)
        else None,
        "confirmed": confirmed,
        "confirmed_baseline": (summary.confirmed or {}).get("baseline") if confirmed else None,
        "versions": recorded.get("versions", {}),
        "file": "engine" if artifact is not None else "onnx model",
        "model_sha256": hashlib.sha256(out.read_bytes()).hexdigest(),
    }
    if recorded.get("backend") == "onnxruntime":
        side["onnxruntime"] = onnxruntime_settings(defaults | trial.params, out.parent)
    elif recorded.get("backend") == "tensorrt":
        side["commands"] = build_commands(study, trial, out, defaults)
    for kind in ("inputs", "reference"):  # what a later `gpt-optuna check` compares a changed model on
        shutil.copyfile(workdir / f"{kind}.npz", out.with_name(_beside(out, kind)))
    side_path = out.with_name(out.name + ".json")
    side_path.write_text(json.dumps(side, indent=2))
    return out, side_path
