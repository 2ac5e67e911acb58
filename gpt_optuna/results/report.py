"""The self-contained HTML report: the summary, every figure, the feasible candidates and every
trial's accuracy. The study is only read: a report of a study still running never locks or disturbs its
writers.
"""

from __future__ import annotations

import html
import json
from typing import Any

import optuna

from gpt_optuna.core.words import counted, in_number
from gpt_optuna.protocol.accuracy import Criterion
from gpt_optuna.results.figures import (
    build_figure,
    history_figure,
    importance_absence,
    importance_figure,
    outcomes_figure,
    pareto_figure,
    profile_figure,
)
from gpt_optuna.results.rows import TrialRow, collect, criterion_of, error_axis, marks
from gpt_optuna.study.folder import StudyFolder
from gpt_optuna.study.record import StudyRecord
from gpt_optuna.study.summary import StudySummary, summarize_study


def metric_names(rows: list[TrialRow], criterion: Criterion | None) -> list[str]:
    """The accuracy metrics the trials recorded: the criterion's first, ``samples`` last."""
    named = [c.metric.key for c in criterion.clauses] if criterion is not None else []
    recorded = dict.fromkeys(name for r in rows for name in r.accuracy)
    ordered = [n for n in named if n in recorded] + [n for n in recorded if n not in named and n != "samples"]
    return ordered + (["samples"] if "samples" in recorded else [])


def accuracy_rows(rows: list[TrialRow], criterion: Criterion | None) -> list[dict[str, Any]]:
    """Every trial that has accuracy metrics or a reason, in order, with each metric it recorded."""
    names = metric_names(rows, criterion)
    return [
        {"trial": r.number, "status": r.status, "latency_ms": r.latency_ms}
        | {name: r.accuracy.get(name) for name in names}
        | {"measured on": r.measured_on, "reason": r.reason[:160]}
        for r in rows
        if r.reused_from is None and (r.accuracy or r.reason)
    ]


BEST_SHOWN = 10
"""Feasible candidates the report's table lists."""


def best_rows(rows: list[TrialRow], summary: StudySummary, criterion: Criterion | None = None) -> list[dict[str, Any]]:
    """The best distinct feasible candidates, the one the verdict deploys first, then the confirmed
    finalists by speedup, then the rest by search latency. Each speedup is the ratio of the two
    latencies of one measurement, named in the row (:meth:`StudySummary.figures`): confirmed ones
    against the confirmed baseline, the others against the baseline's search latency; each row's
    settings are those it changed from the baseline's."""
    trials = {t.number: t for t in summary.trials}
    feasible = [r for r in rows if r.status == "feasible" and r.latency_ms is not None and r.reused_from is None]
    figures = {r.number: summary.figures(trials[r.number]) for r in feasible}
    deploy = summary.decided.number if summary.decided is not None else None

    def order(r: TrialRow) -> tuple[int, float]:
        if r.number == deploy:
            return (0, 0.0)
        if figures[r.number].measurement != "search":
            return (1, -(figures[r.number].speedup or 0.0))
        return (2, r.latency_ms)  # type: ignore[return-value]

    table = []
    names = metric_names(rows, criterion)
    defaults = summary.baseline.params if summary.baseline is not None else {}
    for r in sorted(feasible, key=order)[:BEST_SHOWN]:
        f = figures[r.number]
        row: dict[str, Any] = {"trial": r.number, "deploy": "yes" if r.number == deploy else ""}
        row |= {"latency_ms": f.latency_ms, "baseline_ms": f.baseline_ms, "measured": f.measurement}
        interval = f" [{f.ci[0]:.3f}, {f.ci[1]:.3f}]" if f.ci is not None else ""
        row["speedup"] = f"{f.speedup:.3f}x{interval}" if f.speedup is not None else ""
        row |= {name: r.accuracy.get(name) for name in names}
        row["measured on"] = r.measured_on
        row["changed from the baseline"] = {k: v for k, v in r.params.items() if defaults.get(k) != v}
        table.append(row)
    return table


def render(study: optuna.Study, where: str = "", error: str | None = None) -> str:
    """One self-contained HTML page (plotly.js embedded once): it opens offline. ``where`` names
    the study in the export command it shows (``--storage URL --study-name NAME``); ``error`` is
    the accuracy metric the Pareto front is drawn against (default: :func:`error_axis`'s)."""
    from gpt_optuna.results.summary_text import format_summary

    rows = collect(study)
    summary = summarize_study(study)
    criterion = criterion_of(study)
    marked = marks(summary)
    figures = [
        pareto_figure(rows, error_axis(rows, criterion, error), marked),
        history_figure(rows, marked),
        importance_figure(study),
        build_figure(rows),
        outcomes_figure(rows),
        *(profile_figure(p) for p in saved_profiles(study)),
    ]
    parts = [
        figure.to_html(full_html=False, include_plotlyjs=(index == 0), include_mathjax=False, div_id=f"figure-{index}")
        for index, figure in enumerate(f for f in figures if f is not None)
    ]
    if figures[2] is None:
        parts.insert(2, f'<p id="importances">{html.escape(importance_absence(study))}</p>')
    counts = {label: sum(r.status == label for r in rows) for label in ("feasible", "infeasible", "failed")}
    failures = "".join(f"<li>{html.escape(line)}</li>" for line in failure_lines(rows))
    per_trial = accuracy_rows(rows, criterion)
    best = best_rows(rows, summary, criterion)
    distinct = sum(r.status == "feasible" and r.latency_ms is not None and r.reused_from is None for r in rows)
    export = f"gpt-optuna export {where or '--study-name ' + summary.name} --trial N -o FILE"
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>gpt-optuna report: {html.escape(study.study_name)}</title>
<style>{_STYLE}</style>
</head><body>
<h1>Study {html.escape(study.study_name)}</h1>
<pre>{html.escape(format_summary(summary))}</pre>
<p>{counts["feasible"]} feasible, {counts["infeasible"]} infeasible, {counts["failed"]} failed trials.</p>
<p id="criterion">{html.escape(criterion_sentence(study, rows))}</p>
{"".join(parts)}
<h2>{html.escape(candidates_title(len(best), distinct))}</h2>
<p>Export one: <code>{html.escape(export)}</code></p>
{_table(best)}
<h2>Accuracy of every trial</h2>
<details id="accuracy"><summary>{counted(len(per_trial), "trial")}</summary>{_table(per_trial)}</details>
<h2>Failed trials</h2><ul>{failures or "<li>none</li>"}</ul>
</body></html>
"""


def saved_profiles(study: optuna.Study) -> list[dict[str, Any]]:
    """The profiles ``gpt-optuna profile`` kept in the study folder (a damaged one is left out)."""
    found = []
    for path in StudyFolder.of(study).profiles():
        try:
            profile = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(profile, dict) and {"trial", "baseline", "runs", "by_op_type"} <= profile.keys():
            found.append(profile)
    return found


SHOWN_NUMBERS = 20
"""Trials named per cause of failure; the rest are counted."""


def failure_lines(rows: list[TrialRow]) -> list[str]:
    """The failed trials grouped by cause, most common first, each with its trials' numbers (a few,
    then how many more): thousands of failures stay a short list."""
    by_cause: dict[str, list[int]] = {}
    for r in rows:
        if r.status == "failed" and r.reused_from is None:
            by_cause.setdefault(r.reason[:200], []).append(r.number)
    lines = []
    for cause, numbers in sorted(by_cause.items(), key=lambda item: (-len(item[1]), item[1][0])):
        shown = ", ".join(map(str, numbers[:SHOWN_NUMBERS]))
        more = f" and {len(numbers) - SHOWN_NUMBERS} more" if len(numbers) > SHOWN_NUMBERS else ""
        lines.append(f"{len(numbers)} x {cause} ({in_number(len(numbers), 'trial')} {shown}{more})")
    return lines


def criterion_sentence(study: optuna.Study, rows: list[TrialRow]) -> str:
    """The accuracy criterion in words: what it requires, on how many samples, with whose metrics."""
    record = StudyRecord.read(study)
    if record.accuracy is None:
        return "Accuracy criterion: not recorded."
    samples = max((int(r.accuracy.get("samples", 1)) for r in rows if r.accuracy), default=None)
    sentence = f"Accuracy criterion: {record.accuracy}"
    if samples is not None:
        sentence += f", on {counted(samples, 'sample')} (output metrics: the worst sample; mean(...): the average)"
    if record.metric:
        sentence += f"; user metrics from {record.metric}"
    return sentence + "."


def candidates_title(shown: int, distinct: int) -> str:
    """The candidates table's heading: what it lists, ``shown`` of the ``distinct`` feasible ones."""
    if shown < distinct:
        return f"The {shown} best of {distinct} feasible candidates, the deployed one first"
    return f"Every feasible candidate ({distinct}), the deployed one first"


def _table(rows: list[dict[str, Any]]) -> str:
    header = "".join(f"<th>{html.escape(k)}</th>" for k in (rows[0] if rows else {}))
    body = "".join(
        "<tr>" + "".join(f'<td class="{_kind(v)}">{html.escape(_cell(v))}</td>' for v in r.values()) + "</tr>"
        for r in rows
    )
    return f"<table><tr>{header}</tr>{body}</table>"


_STYLE = (
    "body{font-family:sans-serif;margin:2em;max-width:1600px} table{border-collapse:collapse;max-width:100%}"
    " td,th{border:1px solid #ccc;padding:4px;vertical-align:top;white-space:pre-line}"
    " th{white-space:nowrap} td.number{white-space:nowrap;text-align:right} td.short{white-space:nowrap}"
    " td.text{overflow-wrap:anywhere;min-width:16em}"
    " pre{white-space:pre-wrap} code{overflow-wrap:anywhere}"
)
"""Numbers and headers never break (a header's words stay whole); long text (reasons, settings,
paths) breaks anywhere rather than widening the page."""


SHORT = 40
"""Cells of at most this many characters stay on one line."""


def _kind(value: Any) -> str:
    """A cell's class: ``number`` (right-aligned), ``short`` (a figure, a name, a speedup with its
    interval: kept on one line) or ``text`` (reasons, settings, paths: broken where they must be)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return "number"
    return "short" if len(_cell(value)) <= SHORT and "\n" not in _cell(value) else "text"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):  # one setting a line: the table stays narrow
        return "\n".join(f"{k}={json.dumps(v) if isinstance(v, dict | list) else v}" for k, v in value.items())
    return "" if value is None else str(value)
