"""Resuming a study: its fingerprint, what differs, and the folder it was made in."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import optuna

from gpt_optuna.core.errors import UserError
from gpt_optuna.study.record import FINGERPRINT_ATTR, mark_undecided
from gpt_optuna.study.trial_record import BASELINE, YOURS_ATTR


def fingerprint_differences(stored: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """Plain-language differences between a study's recorded configuration and this run's."""
    labels = {
        "model_sha256": "the model (content hash)",
        "backend": "the backend",
        "accuracy": "the accuracy criterion",
        "metric": "the user metric function (--metric)",
        "inputs_sha256": "the input data",
        "shapes": "the input shapes",
        "your_configuration": "your configuration (--baseline-config)",
        "space": "the search space",
        "objective": "the objective (--dry-run)",
        "objectives": "the objectives (--objectives)",
        "calibration_sha256": "the calibration data",
        "allow_io_change": "I/O precision changes (--allow-io-change)",
    }
    diffs = []
    for key, label in labels.items():
        old, new = stored.get(key), current.get(key)
        if key == "allow_io_change":  # studies made before it was recorded kept their I/O dtypes
            old, new = bool(old), bool(new)
        if old == new:
            continue
        if key == "space":
            diffs.append(f"{label}: {_space_difference(old or [], new or [])}")
        elif key.endswith("sha256"):
            diffs.append(f"{label}: {str(old)[:12]} in the study, {str(new)[:12]} now")
        else:
            diffs.append(f"{label}: {old!r} in the study, {new!r} now")
    return diffs


def _space_difference(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> str:
    before = {k["name"]: k for k in old}
    after = {k["name"]: k for k in new}
    parts = [f"knob {n} is new" for n in after if n not in before]
    parts += [f"knob {n} is gone" for n in before if n not in after]
    parts += [f"knob {n} changed" for n in after if n in before and after[n] != before[n]]
    return ", ".join(parts) or "knob order changed"


def open_study(
    storage: optuna.storages.BaseStorage,
    name: str,
    sampler: optuna.samplers.BaseSampler,
    fingerprint: dict[str, Any],
    baseline: dict[str, Any],
    objectives: int = 1,
    seeds: Sequence[tuple[dict[str, Any], dict[str, Any]]] = (),
) -> tuple[optuna.Study, bool]:
    """Create the study with its baseline trial enqueued, then each seed candidate that differs
    from it (with its user attrs: ``seeded`` or ``warm_start_from``), or resume it if its
    configuration matches."""
    directions = ["minimize"] * objectives
    try:
        study = optuna.create_study(
            storage=storage, study_name=name, sampler=sampler, directions=directions, load_if_exists=True
        )
    except ValueError as exc:  # an existing study with another number of objectives
        raise UserError(f"study {name!r} exists with other objectives ({exc}); choose another --study-name") from exc
    stored = study.user_attrs.get(FINGERPRINT_ATTR)
    if stored is None:
        if study.trials:
            raise UserError(f"study {name!r} exists but was not made by gpt-optuna; choose another --study-name")
        mark_undecided(study)
        study.set_user_attr(FINGERPRINT_ATTR, fingerprint)
        yours = {k: v for seed, attrs in seeds if seed == baseline for k, v in attrs.items() if k == YOURS_ATTR}
        study.enqueue_trial(baseline, user_attrs={BASELINE: True} | yours)
        for seed, attrs in seeds:
            if seed != baseline:
                study.enqueue_trial(seed, user_attrs=attrs)
        return study, False
    refuse_if_different(name, stored, fingerprint)
    if "model_profile" not in stored and "model_profile" in fingerprint:  # made before models were profiled
        study.set_user_attr(FINGERPRINT_ATTR, {**stored, "model_profile": fingerprint["model_profile"]})
    return study, True


def refuse_if_different(name: str, stored: Mapping[str, Any], current: Mapping[str, Any]) -> None:
    """A UserError saying what differs between a study's recorded configuration and this run's."""
    diffs = fingerprint_differences(stored, current)
    if diffs:
        raise UserError(
            f"study {name!r} was made with a different configuration ({'; '.join(diffs)}); "
            "resume it with the same settings, or start a new study with --study-name"
        )


def recorded_fingerprint(storage: optuna.storages.BaseStorage, name: str) -> dict[str, Any] | None:
    """The configuration a study of that name recorded, or None where there is no such study yet."""
    try:
        study_id = storage.get_study_id_from_name(name)
    except KeyError:
        return None
    recorded = storage.get_study_user_attrs(study_id).get(FINGERPRINT_ATTR)
    if recorded is None and storage.get_all_trials(study_id, deepcopy=False):
        raise UserError(f"study {name!r} exists but was not made by gpt-optuna; choose another --study-name")
    return recorded
