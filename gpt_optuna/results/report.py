"""The study as plain rows and figures, and the self-contained HTML report.

Figures are computed as plain data from the study (``collect``, ``pareto_front``) and drawn by
separate functions, so the data is what the tests check. The study is only read: a report of a
study still running never locks or disturbs its writers.
"""

from __future__ import annotations

import html
import json
import warnings
from dataclasses import dataclass, field
from typing import Any

import optuna

from gpt_optuna.evaluation.accuracy import Criterion, parse_criterion
from gpt_optuna.study.record import StudyRecord
from gpt_optuna.study.summary import StudySummary, summarize_study
from gpt_optuna.study.taxonomy import measured_latency_ms, retried_numbers, trial_status


@dataclass(frozen=True)
class TrialRow:
    """One trial as the report shows it."""

    number: int
    status: str
    latency_ms: float | None
    error: float | None
    build_s: float | None
    params: dict[str, Any]
    baseline: bool
    reason: str = ""
    reused_from: int | None = None
    """The trial whose result this one copied (the same candidate): tables show the original once."""
    accuracy: dict[str, float] = field(default_factory=dict)
    """Every accuracy metric of the trial (user attr ``accuracy``), ``samples`` included."""
    measured_on: str = ""
    """The host and device that evaluated the trial (user attrs ``host`` and ``gpu``)."""

    @property
    def hover(self) -> str:
        lines = [f"trial {self.number} ({self.status})"]
        if self.latency_ms is not None:
            lines.append(f"latency {self.latency_ms:.4g} ms")
        lines += [f"{k} {v:.6g}" for k, v in self.accuracy.items()]
        if self.reason:
            lines.append(self.reason[:120])
        lines += [f"{k}={v}" for k, v in self.params.items()]
        return "<br>".join(html.escape(line) for line in lines)


def criterion_of(study: optuna.Study) -> Criterion | None:
    """The accuracy criterion the study was made with (None for a study made by other means)."""
    record = StudyRecord.read(study)
    if record.accuracy is None:
        return None
    return parse_criterion(record.accuracy, user_metrics=record.metric is not None)


def collect(study: optuna.Study) -> list[TrialRow]:
    """Every trial with its latency (measured, also for an infeasible baseline), error and status."""
    criterion = criterion_of(study)
    rows = []
    trials = study.get_trials(deepcopy=False)
    retried = retried_numbers(trials)
    for trial in trials:
        attrs = trial.user_attrs
        latency = measured_latency_ms(trial)
        accuracy = attrs.get("accuracy")
        error = criterion.error(accuracy) if criterion is not None and accuracy else None
        reason = attrs.get("infeasible") or attrs.get("failure") or attrs.get("interrupted") or ""
        rows.append(
            TrialRow(
                number=trial.number,
                status=trial_status(trial, retried),
                latency_ms=latency,
                error=float(error) if error is not None else None,
                build_s=attrs.get("build_s"),
                params=dict(trial.params),
                baseline=bool(attrs.get("baseline")),
                reason=str(reason),
                reused_from=attrs.get("reused_from"),
                accuracy=dict(accuracy or {}),
                measured_on=f"{attrs['host']} {attrs.get('gpu', '')}".strip() if "host" in attrs else "",
            )
        )
    return rows


@dataclass(frozen=True)
class Mark:
    """The baseline or the winner as every plot places it: at its latency in the measurement that
    judges the study (the one the summary names), with its error."""

    label: str
    trial: int
    latency_ms: float
    error: float | None
    measurement: str

    @property
    def name(self) -> str:
        return f"{self.label} (trial {self.trial}, {self.measurement})"

    @property
    def hover(self) -> str:
        return html.escape(f"{self.name}: {self.latency_ms:.4g} ms")


def marks(rows: list[TrialRow], summary: StudySummary) -> list[Mark]:
    """The baseline and the winner at the summary's figures (one mark where the baseline wins)."""
    if summary.dry_run or summary.baseline is None:
        return []
    error = {r.number: r.error for r in rows}
    winner = summary.winner
    measurement = winner.measurement if winner is not None else "search"
    base = winner.baseline_ms if winner is not None else summary.baseline_search_value
    found = []
    if base is not None:
        label = "baseline, the winner" if summary.baseline_wins else "baseline"
        found.append(Mark(label, summary.baseline.number, base, error.get(summary.baseline.number), measurement))
    if winner is not None and not summary.baseline_wins and winner.latency_ms is not None:
        found.append(Mark("winner", winner.number, winner.latency_ms, error.get(winner.number), measurement))
    return found


def pareto_front(rows: list[TrialRow]) -> list[TrialRow]:
    """Feasible trials that no other feasible trial beats on both latency and error."""
    points = [r for r in rows if r.status == "feasible" and r.latency_ms is not None and r.error is not None]
    front = [
        r
        for r in points
        if not any(
            o.latency_ms <= r.latency_ms and o.error <= r.error and (o.latency_ms < r.latency_ms or o.error < r.error)  # type: ignore[operator]
            for o in points
        )
    ]
    return sorted(front, key=lambda r: r.latency_ms)  # type: ignore[arg-type, return-value]


def pareto_figure(rows: list[TrialRow], error_name: str = "error", marked: list[Mark] | None = None) -> Any:
    """Latency against error of every trial (search latencies), the Pareto front, and the
    baseline and winner where the summary places them."""
    import plotly.graph_objects as go

    figure = go.Figure()
    for status, symbol in (("feasible", "circle"), ("infeasible", "x")):
        shown = [r for r in rows if r.status == status and r.latency_ms is not None and r.error is not None]
        figure.add_trace(
            go.Scatter(
                x=[r.latency_ms for r in shown],
                y=[r.error for r in shown],
                mode="markers",
                marker={"symbol": symbol},
                name=status,
                hovertext=[r.hover for r in shown],
                hoverinfo="text",
            )
        )
    front = pareto_front(rows)
    figure.add_trace(
        go.Scatter(x=[r.latency_ms for r in front], y=[r.error for r in front], mode="lines", name="Pareto front")
    )
    for mark in marked or []:
        figure.add_trace(
            go.Scatter(
                x=[mark.latency_ms],
                y=[mark.error],
                mode="markers",
                marker={"symbol": "star" if mark.label.startswith("baseline") else "diamond", "size": 14},
                name=mark.name,
                hovertext=[mark.hover],
                hoverinfo="text",
            )
        )
    figure.update_layout(title="Latency against error", xaxis_title="latency (ms)", yaxis_title=error_name)
    return figure


def history_figure(rows: list[TrialRow], marked: list[Mark] | None = None) -> Any:
    """Each feasible trial's search latency and the best so far, with the baseline's and the
    winner's latencies as the summary states them."""
    import plotly.graph_objects as go

    feasible = [r for r in rows if r.status == "feasible" and r.latency_ms is not None]
    best, running = [], float("inf")
    for r in feasible:
        running = min(running, r.latency_ms)  # type: ignore[type-var]
        best.append(running)
    figure = go.Figure(
        [
            go.Scatter(
                x=[r.number for r in feasible], y=[r.latency_ms for r in feasible], mode="markers", name="trial"
            ),
            go.Scatter(x=[r.number for r in feasible], y=best, mode="lines", name="best so far"),
        ]
    )
    for mark in marked or []:  # the baseline's label above its line at the left, the winner's below at the right
        baseline = mark.label.startswith("baseline")
        figure.add_hline(
            y=mark.latency_ms,
            line_dash="dash" if baseline else "dot",
            annotation_text=f"{mark.name}: {mark.latency_ms:.4g} ms",
            annotation_position="top left" if baseline else "bottom right",
        )
    figure.update_layout(title="Optimization history", xaxis_title="trial", yaxis_title="latency (ms)")
    return figure


def importance_figure(study: optuna.Study) -> Any | None:
    import plotly.graph_objects as go

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # notes on sparse regimes, printed mid-report otherwise
            importances = optuna.importance.get_param_importances(study, target=lambda t: t.values[0])
    except (RuntimeError, ValueError):  # too few complete trials, or a single point
        return None
    if not importances:
        return None
    names = list(importances)[::-1]
    figure = go.Figure(go.Bar(x=[importances[n] for n in names], y=names, orientation="h", name="importance"))
    figure.update_layout(title="Parameter importances for latency")
    return figure


def build_figure(rows: list[TrialRow]) -> Any:
    import plotly.graph_objects as go

    shown = [r for r in rows if r.build_s is not None and r.latency_ms is not None]
    figure = go.Figure(
        go.Scatter(
            x=[r.build_s for r in shown],
            y=[r.latency_ms for r in shown],
            mode="markers",
            name="trial",
            hovertext=[r.hover for r in shown],
            hoverinfo="text",
        )
    )
    figure.update_layout(title="Build time against latency", xaxis_title="build (s)", yaxis_title="latency (ms)")
    return figure


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


def best_rows(
    rows: list[TrialRow],
    summary: StudySummary,
    criterion: Criterion | None = None,
    limit: int = 10,
    where: str = "",
) -> list[dict[str, Any]]:
    """The best distinct feasible candidates, the study's winner first, then the other confirmed
    finalists by speedup, then the rest by search latency. Each speedup is the ratio of the two
    latencies of one measurement, named in the row (:meth:`StudySummary.figures`): confirmed ones
    against the confirmed baseline, the others against the baseline's search latency. ``where``
    (``--storage URL --study-name NAME``) goes into each row's export command."""
    trials = {t.number: t for t in summary.trials}
    feasible = [r for r in rows if r.status == "feasible" and r.latency_ms is not None and r.reused_from is None]
    figures = {r.number: summary.figures(trials[r.number]) for r in feasible}
    winner = summary.best.number if summary.best is not None else None

    def order(r: TrialRow) -> tuple[int, float]:
        if r.number == winner:
            return (0, 0.0)
        if figures[r.number].measurement != "search":
            return (1, -(figures[r.number].speedup or 0.0))
        return (2, r.latency_ms)  # type: ignore[return-value]

    table = []
    names = metric_names(rows, criterion)
    for r in sorted(feasible, key=order)[:limit]:
        f = figures[r.number]
        row: dict[str, Any] = {"trial": r.number, "winner": "yes" if r.number == winner else ""}
        row |= {"latency_ms": f.latency_ms, "baseline_ms": f.baseline_ms, "measured": f.measurement}
        interval = f" [{f.ci[0]:.3f}, {f.ci[1]:.3f}]" if f.ci is not None else ""
        row["speedup"] = f"{f.speedup:.3f}x{interval}" if f.speedup is not None else ""
        row |= {name: r.accuracy.get(name) for name in names}
        row["measured on"] = r.measured_on
        suffix = ".plan" if trials[r.number].user_attrs.get("engine_artifact") is not None else ".onnx"
        row["export"] = (
            f"gpt-optuna export {where or '--study-name ' + summary.name} --trial {r.number} -o trial{r.number}{suffix}"
        )
        row["params"] = r.params
        table.append(row)
    return table


def render(study: optuna.Study, where: str = "") -> str:
    """One self-contained HTML page (plotly.js embedded once): it opens offline. ``where`` names
    the study in the export commands it shows (``--storage URL --study-name NAME``)."""
    rows = collect(study)
    summary = summarize_study(study)
    criterion = criterion_of(study)
    error_name = criterion.error_name if criterion is not None else "error"
    marked = marks(rows, summary)
    figures = [pareto_figure(rows, error_name, marked), history_figure(rows, marked), build_figure(rows)]
    importance = importance_figure(study)
    if importance is not None:
        figures.insert(2, importance)
    parts = [
        figure.to_html(full_html=False, include_plotlyjs=(index == 0), div_id=f"figure-{index}")
        for index, figure in enumerate(figures)
    ]
    counts = {label: sum(r.status == label for r in rows) for label in ("feasible", "infeasible", "failed")}
    failed = [r for r in rows if r.status == "failed" and r.reused_from is None]
    failures = "".join(f"<li>trial {r.number}: {html.escape(r.reason[:200])}</li>" for r in failed)
    per_trial = accuracy_rows(rows, criterion)
    from gpt_optuna.results.summary_text import format_summary

    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>gpt-optuna report: {html.escape(study.study_name)}</title>
<style>{_STYLE}</style>
</head><body>
<h1>Study {html.escape(study.study_name)}</h1>
<pre>{html.escape(format_summary(summary))}</pre>
<p>{counts["feasible"]} feasible, {counts["infeasible"]} infeasible, {counts["failed"]} failed trials.</p>
<p id="criterion">{html.escape(criterion_sentence(study, rows))}</p>
{"".join(parts)}
<h2>Best trials</h2>{_table(best_rows(rows, summary, criterion, where=where))}
<h2>Accuracy of every trial</h2>
<details id="accuracy"><summary>{len(per_trial)} trials</summary>{_table(per_trial)}</details>
<h2>Failed trials</h2><ul>{failures or "<li>none</li>"}</ul>
</body></html>
"""


def criterion_sentence(study: optuna.Study, rows: list[TrialRow]) -> str:
    """The accuracy criterion in words: what it requires, on how many samples, with whose metrics."""
    record = StudyRecord.read(study)
    if record.accuracy is None:
        return "Accuracy criterion: not recorded."
    samples = max((int(r.accuracy.get("samples", 1)) for r in rows if r.accuracy), default=None)
    sentence = f"Accuracy criterion: {record.accuracy}"
    if samples is not None:
        plural = "s" if samples != 1 else ""
        sentence += f", on {samples} sample{plural} (output metrics: the worst sample; mean(...): the average)"
    if record.metric:
        sentence += f"; user metrics from {record.metric}"
    return sentence + "."


def _table(rows: list[dict[str, Any]]) -> str:
    header = "".join(f"<th>{html.escape(k)}</th>" for k in (rows[0] if rows else {}))
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_cell(v))}</td>" for v in r.values()) + "</tr>" for r in rows)
    return f"<table><tr>{header}</tr>{body}</table>"


_STYLE = (
    "body{font-family:sans-serif;margin:2em} table{border-collapse:collapse} td,th{border:1px solid #ccc;padding:4px}"
    " pre{white-space:pre-wrap}"
)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return json.dumps(value)
    return "" if value is None else str(value)
