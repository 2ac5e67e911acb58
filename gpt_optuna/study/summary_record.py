"""The study's summary as the study records it, so that readers (``status``, ``best``, ``export``)
need not read every trial: thousands of trials take seconds to load, the record milliseconds.

Whoever decides the winner (the end of a search, ``confirm``, ``check``) records the summary
beside it (:func:`summary_record`); a reader takes it (:func:`study_summary`) while it still speaks
for the study: as many trials as when it was written, none running or queued, and the same
confirmation and look at the host. Otherwise, and for a storage that is not a database (where
counting the trials means reading them), the summary is made from every trial.
"""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from gpt_optuna.study.confirmation import recorded_confirmation
from gpt_optuna.study.optuna_internals import storage_of, study_id
from gpt_optuna.study.record import recorded_host
from gpt_optuna.study.storage import count_by_state
from gpt_optuna.study.summary import Stability, StudySummary, summarize_study

SUMMARY_ATTR = "summary"
"""Study user attr: the summary as :func:`summary_record` writes it."""


def summary_record(study: optuna.Study, summary: StudySummary) -> dict[str, Any]:
    """What the summary holds, trials by number, and what says whether it still speaks for the study."""
    return {
        "trials": len(summary.trials),
        "open": sum(1 for t in summary.trials if not t.state.is_finished()),
        "confirmed_attr": recorded_confirmation(study),
        "host_attr": recorded_host(study),
        **{f.name: _kept(getattr(summary, f.name)) for f in fields(summary) if f.name not in ("name", "trials")},
    }


def _kept(value: Any) -> Any:
    """A summary's field as its record keeps it: a trial by its number, tuples as lists."""
    if isinstance(value, FrozenTrial):
        return value.number
    if isinstance(value, Stability):
        return asdict(value)
    return [_kept(v) for v in value] if isinstance(value, tuple) else value


def study_summary(study: optuna.Study) -> StudySummary:
    """The study's summary: its record where that still speaks for it, else made from every trial."""
    return recorded_summary(study) or summarize_study(study)


def recorded_summary(study: optuna.Study) -> StudySummary | None:
    """The recorded summary, None where there is none or it may no longer speak for the study."""
    record = study.user_attrs.get(SUMMARY_ATTR)
    if not isinstance(record, dict) or record.get("open"):
        return None
    if record.get("confirmed_attr") != recorded_confirmation(study) or record.get("host_attr") != recorded_host(study):
        return None
    counts = count_by_state(study)
    if counts is None or sum(counts.values()) != record.get("trials"):
        return None
    if counts.get(TrialState.RUNNING) or counts.get(TrialState.WAITING):
        return None
    stability = record["stability"]
    return StudySummary(
        name=study.study_name,
        counts=dict(record["counts"]),
        reused=int(record["reused"]),
        baseline=trial_by_number(study, record["baseline"]),
        best=trial_by_number(study, record["best"]),
        dry_run=bool(record["dry_run"]),
        confirmed=record["confirmed"],
        failures=tuple((int(count), str(cause)) for count, cause in record["failures"]),
        warm_started=tuple(record["warm_started"]),
        allow_io_change=bool(record["allow_io_change"]),
        stability=None if stability is None else Stability(**stability),
        orphaned=tuple(record["orphaned"]),
        stale_confirmation=record["stale_confirmation"],
        host_tuned=tuple((str(k), v, str(why)) for k, v, why in record["host_tuned"]),
        host_warnings=tuple(record["host_warnings"]),
        yours=trial_by_number(study, record.get("yours")),
        backend=record.get("backend"),
        engine_defaults=tuple(
            (str(engine), trial)
            for engine, number in record.get("engine_defaults") or ()
            if (trial := trial_by_number(study, number))
        ),
    )


def trial_by_number(study: optuna.Study, number: int | None) -> FrozenTrial | None:
    """One trial of the study, read alone (None for None)."""
    if number is None:
        return None
    storage = storage_of(study)
    return storage.get_trial(storage.get_trial_id_from_study_id_trial_number(study_id(study), number))
