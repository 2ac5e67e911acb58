"""The study's decided winner, written into the study for readers outside gpt-optuna.

gpt-optuna's own readers compute the winner from the study (:func:`summarize_study`); Optuna's
own tools (optuna-dashboard, ``study.best_trial``) rank trials by their search values, which the
confirmation may overturn. So whoever decides the winner (the end of a search, ``confirm``,
``check``) writes it into the study's user attrs (``winner``: the trial, the measurement, both
latencies, the speedup and its interval, the verdict; ``Verdict``: the verdict's sentence, first
among the user attrs), names the objectives, and, where optuna-dashboard is installed, draws the
winner as a figure on the study's first page (above the dashboard's own "Best Trial", which is the
search's fastest) and leaves a note on the study and the winning trial. Optuna refuses user attrs
on a finished trial, so the trial's mark is the dashboard's note. A study decided before
optuna-dashboard was installed gets them from the next of those, or from ``gpt-optuna dashboard``
(:func:`write_dashboard`).
"""

from __future__ import annotations

import warnings
from typing import Any

import optuna

from gpt_optuna.core.errors import UserError
from gpt_optuna.results.export import figures_record
from gpt_optuna.results.summary_text import headline, interval
from gpt_optuna.study.optuna_internals import note_target, storage_of, study_id
from gpt_optuna.study.record import DASHBOARD_ATTR, FORMER_VERDICT_ATTR, VERDICT_ATTR, WINNER_ATTR, StudyRecord
from gpt_optuna.study.summary import StudySummary, summarize_study
from gpt_optuna.study.summary_record import SUMMARY_ATTR, summary_record

OBJECTIVE_NAMES = {"latency": "latency_ms", "error": "error", "memory": "memory_mib", "build_s": "build_s"}


def objective_names(objectives: tuple[str, ...] | list[str], dry_run: bool) -> list[str]:
    """The names of a study's objective values, in order (a dry run's first value is its build time)."""
    names = [OBJECTIVE_NAMES[o] for o in objectives]
    return ["build_s", *names[1:]] if dry_run else names


def name_objectives(study: optuna.Study) -> None:
    """Name the objective values as the study recorded them (optuna-dashboard shows these names)."""
    record = StudyRecord.read(study)
    names = objective_names(list(record.objectives), record.dry_run)
    if study.metric_names != names:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(names)


def winner_record(summary: StudySummary) -> dict[str, Any] | None:
    """The winner as the study records it: the trial, its figures and the verdict (None: no winner yet)."""
    if summary.best is None:
        return None
    return {"trial": summary.best.number, **figures_record(summary, summary.best)}


def record_winner(study: optuna.Study) -> StudySummary:
    """Write the decided winner and the summary into the study (and optuna-dashboard's figure and
    notes where it is installed and does not hold them yet)."""
    name_objectives(study)
    summary = summarize_study(study)
    record = winner_record(summary)
    attrs, text = study.user_attrs, headline(summary)
    if record is not None and attrs.get(WINNER_ATTR) != record:
        study.set_user_attr(WINNER_ATTR, record)
    if attrs.get(VERDICT_ATTR) != text:
        study.set_user_attr(VERDICT_ATTR, text)
    if attrs.get(FORMER_VERDICT_ATTR, text) != text:  # a study that kept it under its former name: not left stale
        study.set_user_attr(FORMER_VERDICT_ATTR, text)
    if record is not None and not dashboard_written(study, record):
        _dashboard_notes(study, summary, record)
    recorded = summary_record(study, summary)
    if study.user_attrs.get(SUMMARY_ATTR) != recorded:
        study.set_user_attr(SUMMARY_ATTR, recorded)
    return summary


DASHBOARD_FIGURE = "gpt-optuna-winner"
"""The id of the winner's figure on optuna-dashboard's study page."""


def winner_figure(summary: StudySummary) -> Any:
    """The winner as a table: the verdict, the trial and its figures, and what it changed."""
    import plotly.graph_objects as go

    assert summary.best is not None
    figures = summary.figures(summary.best)
    unit = summary.unit
    defaults = summary.baseline.params if summary.baseline is not None else {}
    changed = {k: v for k, v in summary.best.params.items() if defaults.get(k) != v}
    title, named = winner_title(summary)
    rows = {
        "verdict": summary.verdict,
        **named,
        "its figure": f"{figures.latency_ms:.4g} {unit}" if figures.latency_ms is not None else "",
        "the baseline's": f"{figures.baseline_ms:.4g} {unit}" if figures.baseline_ms is not None else "",
        "speedup": f"{figures.speedup:.3f}x{interval(figures)}" if figures.speedup is not None else "",
        "measured": figures.measurement,
        "changed": ", ".join(f"{k}={v}" for k, v in changed.items()) or "nothing: the default configuration",
    }
    fastest = min((t for t in summary.trials if t.values), key=lambda t: (t.values[0], t.number), default=None)
    if fastest is not None and fastest.number != summary.best.number:
        rows["the search's fastest"] = f"trial {fastest.number}: the dashboard's Best Trial, by its search value"
    column = "winner" if "winner" in named else "decision"
    figure = go.Figure(
        go.Table(
            header={"values": ["gpt-optuna", f"the study's {column}"], "align": "left"},
            cells={"values": [list(rows), list(rows.values())], "align": "left"},
            columnwidth=[1, 3],
        )
    )
    figure.update_layout(title=title, height=420)
    return figure


def winner_title(summary: StudySummary) -> tuple[str, dict[str, str]]:
    """The winner figure's title and the rows that name its trials: the winner where the verdict
    deploys the best candidate, else the trial it deploys and the best finalist, not shown faster."""
    assert summary.best is not None
    best, decided = summary.best.number, summary.decided.number if summary.decided is not None else None
    if decided is None or decided == best:
        return f"gpt-optuna's winner: trial {best}", {
            "winner": f"trial {best}" + (" (the baseline)" if summary.baseline_wins else "")
        }
    kept = " (the baseline)" if summary.baseline is not None and decided == summary.baseline.number else ""
    return f"gpt-optuna deploys trial {decided}{kept}", {
        "deploy": f"trial {decided}{kept}",
        "best finalist": f"trial {best}: not shown faster, not deployed",
    }


def dashboard_written(study: optuna.Study, record: dict[str, Any] | None = None) -> bool:
    """Whether optuna-dashboard holds the figure and notes of the study's winner (``record``: as
    :func:`winner_record` makes it; default: as the study recorded it)."""
    record = record if record is not None else study.user_attrs.get(WINNER_ATTR)
    return record is not None and _shown(study) == record


def _shown(study: optuna.Study) -> Any:
    """The winner record whose figure and notes optuna-dashboard holds (None: none written)."""
    return storage_of(study).get_study_system_attrs(study_id(study)).get(DASHBOARD_ATTR)


def write_dashboard(study: optuna.Study) -> StudySummary:
    """The winner's figure and notes for optuna-dashboard, written into a study decided before it
    was installed (``gpt-optuna dashboard``); the summary. A user error where optuna-dashboard is
    not installed or the study has no winner yet."""
    import importlib.util

    if importlib.util.find_spec("optuna_dashboard") is None:
        raise UserError("optuna-dashboard is not installed here: pip install optuna-dashboard")
    summary = record_winner(study)
    if summary.best is None:
        raise UserError(f"study {study.study_name} has no feasible trial yet: there is no winner to show")
    return summary


def _dashboard_notes(study: optuna.Study, summary: StudySummary, record: dict[str, Any]) -> None:
    """The verdict as a note on the study and on the winning trial (a former winner's is emptied),
    and the winner's figure; marked as written (:data:`DASHBOARD_ATTR`). Nothing where
    optuna-dashboard is not installed."""
    try:
        from optuna_dashboard import save_note
    except ImportError:
        return
    assert summary.best is not None
    shown = _shown(study)
    former = shown["trial"] if isinstance(shown, dict) else None
    text = headline(summary)
    _, named = winner_title(summary)
    save_note(study, f"## gpt-optuna\n\n{text}\n\n" + "; ".join(f"{k}: {v}" for k, v in named.items()) + ".")
    try:
        from optuna_dashboard import save_plotly_graph_object
    except ImportError:  # a version without figures on the study's page
        pass
    else:
        save_plotly_graph_object(study, winner_figure(summary), graph_object_id=DASHBOARD_FIGURE)

    def note(number: int, body: str) -> None:
        save_note(note_target(study, summary.trials[number]), body)

    if former is not None and former != summary.best.number and former < len(summary.trials):
        note(former, "")
    heading = "The study's winner" if "winner" in named else "The best finalist, not shown faster: not deployed"
    note(summary.best.number, f"## {heading}\n\n{text}")
    storage_of(study).set_study_system_attr(study_id(study), DASHBOARD_ATTR, record)
