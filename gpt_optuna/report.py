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

from gpt_optuna.accuracy import parse_criterion
from gpt_optuna.study import FINGERPRINT_ATTR, StudySummary, summarize_study
from gpt_optuna.taxonomy import retried_numbers, trial_status


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
    extra: dict[str, Any] = field(default_factory=dict)
    reused_from: int | None = None
    """The trial whose result this one copied (the same candidate): tables show the original once."""

    @property
    def hover(self) -> str:
        lines = [f"trial {self.number} ({self.status})"]
        if self.latency_ms is not None:
            lines.append(f"latency {self.latency_ms:.4g} ms")
        if self.error is not None:
            lines.append(f"error {self.error:.3g}")
        if self.reason:
            lines.append(self.reason[:120])
        lines += [f"{k}={v}" for k, v in self.params.items()]
        return "<br>".join(html.escape(line) for line in lines)


def collect(study: optuna.Study) -> list[TrialRow]:
    """Every trial with its latency (measured, also for an infeasible baseline), error and status."""
    recorded = study.user_attrs.get(FINGERPRINT_ATTR, {})
    criterion = parse_criterion(recorded["accuracy"]) if "accuracy" in recorded else None
    rows = []
    trials = study.get_trials(deepcopy=False)
    retried = retried_numbers(trials)
    for trial in trials:
        attrs = trial.user_attrs
        latency = attrs.get("latency", {}).get("median_ms")
        accuracy = attrs.get("accuracy")
        error = criterion.error(accuracy) if criterion is not None and accuracy else None
        reason = attrs.get("infeasible") or attrs.get("failure") or attrs.get("interrupted") or ""
        rows.append(
            TrialRow(
                number=trial.number,
                status=trial_status(trial, retried),
                latency_ms=float(latency) if latency is not None else None,
                error=float(error) if error is not None else None,
                build_s=attrs.get("build_s"),
                params=dict(trial.params),
                baseline=bool(attrs.get("baseline")),
                reason=str(reason),
                reused_from=attrs.get("reused_from"),
            )
        )
    return rows


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


def pareto_figure(rows: list[TrialRow]) -> Any:
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
    baseline = [r for r in rows if r.baseline and r.latency_ms is not None and r.error is not None]
    figure.add_trace(
        go.Scatter(
            x=[r.latency_ms for r in baseline],
            y=[r.error for r in baseline],
            mode="markers",
            marker={"symbol": "star", "size": 14},
            name="baseline",
            hovertext=[r.hover for r in baseline],
            hoverinfo="text",
        )
    )
    figure.update_layout(title="Latency against error", xaxis_title="latency (ms)", yaxis_title="error")
    return figure


def history_figure(rows: list[TrialRow], baseline_ms: float | None) -> Any:
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
    if baseline_ms is not None:
        figure.add_hline(y=baseline_ms, line_dash="dash", annotation_text="baseline")
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


def best_rows(rows: list[TrialRow], summary: StudySummary, limit: int = 10) -> list[dict[str, Any]]:
    """The best distinct feasible candidates, the study's winner first, then the other confirmed
    finalists by speedup, then the rest by search latency. Each speedup is the ratio of the two
    latencies of one measurement, named in the row: confirmed ones against the confirmed baseline,
    the others against the baseline's search latency."""
    confirmed = {row["number"]: row for row in (summary.confirmed or {}).get("ranking", [])}
    confirmed_base = (summary.confirmed or {}).get("baseline", {}).get("median_ms")
    search_base = summary.baseline_search_value
    feasible = [r for r in rows if r.status == "feasible" and r.latency_ms is not None and r.reused_from is None]
    winner = summary.best.number if summary.best is not None else None

    def order(r: TrialRow) -> tuple[int, float]:
        if r.number == winner:
            return (0, 0.0)
        if r.number in confirmed:
            return (1, -confirmed[r.number]["speedup"])
        return (2, r.latency_ms)  # type: ignore[return-value]

    table = []
    for r in sorted(feasible, key=order)[:limit]:
        row: dict[str, Any] = {"trial": r.number}
        if r.number in confirmed:
            c = confirmed[r.number]
            row |= {"latency_ms": c["median_ms"], "baseline_ms": confirmed_base, "measured": "confirmed"}
            row["speedup"] = f"{c['speedup']:.3f}x [{c['ci_low']:.3f}, {c['ci_high']:.3f}]"
        else:
            row |= {"latency_ms": r.latency_ms, "baseline_ms": search_base, "measured": "search"}
            row["speedup"] = f"{search_base / r.latency_ms:.3f}x" if search_base else ""  # type: ignore[operator]
        row["error"] = r.error
        row["export"] = f"gpt-optuna export --study-name {summary.name} --trial {r.number} -o trial{r.number}"
        row["params"] = r.params
        table.append(row)
    return table


def render(study: optuna.Study) -> str:
    """One self-contained HTML page (plotly.js embedded once): it opens offline."""
    rows = collect(study)
    summary = summarize_study(study)
    figures = [pareto_figure(rows), history_figure(rows, summary.baseline_search_value), build_figure(rows)]
    importance = importance_figure(study)
    if importance is not None:
        figures.insert(2, importance)
    parts = [
        figure.to_html(full_html=False, include_plotlyjs=(index == 0), div_id=f"figure-{index}")
        for index, figure in enumerate(figures)
    ]
    counts = {label: sum(r.status == label for r in rows) for label in ("feasible", "infeasible", "failed")}
    table = best_rows(rows, summary)
    header = "".join(f"<th>{html.escape(k)}</th>" for k in (table[0] if table else {}))
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_cell(v))}</td>" for v in row.values()) + "</tr>" for row in table
    )
    failed = [r for r in rows if r.status == "failed" and r.reused_from is None]
    failures = "".join(f"<li>trial {r.number}: {html.escape(r.reason[:200])}</li>" for r in failed)
    from gpt_optuna.progress import format_summary

    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>gpt-optuna report: {html.escape(study.study_name)}</title>
<style>{_STYLE}</style>
</head><body>
<h1>Study {html.escape(study.study_name)}</h1>
<pre>{html.escape(format_summary(summary))}</pre>
<p>{counts["feasible"]} feasible, {counts["infeasible"]} infeasible, {counts["failed"]} failed trials.</p>
{"".join(parts)}
<h2>Best trials</h2><table><tr>{header}</tr>{body}</table>
<h2>Failed trials</h2><ul>{failures or "<li>none</li>"}</ul>
</body></html>
"""


_STYLE = (
    "body{font-family:sans-serif;margin:2em} table{border-collapse:collapse} td,th{border:1px solid #ccc;padding:4px}"
)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return json.dumps(value)
    return "" if value is None else str(value)
