"""The study's plotly figures, drawn from the report's rows: latency against an accuracy metric
with the Pareto front, the optimization history, parameter importances, build time, and every
trial by outcome and reason.

Latency axes turn logarithmic where the latencies drawn span more than :data:`LOG_SPAN`, so that a
few slow candidates do not crowd the competitive ones into one corner; the baseline and the winner
are drawn at the summary's figures, labelled, above the trials.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Iterable
from typing import Any

import optuna

from gpt_optuna.core.words import in_number
from gpt_optuna.results.rows import ErrorAxis, Mark, TrialRow, pareto_front

LOG_SPAN = 10.0
"""Latencies spanning more than this ratio are drawn on a log axis."""
MARK_STYLE = {"baseline": ("star", "#444444", "top center"), "winner": ("diamond", "#d62728", "bottom center")}
"""Each mark's symbol, colour and label position: the labels go opposite ways, so both stay legible."""
STATUS_COLOURS = {"feasible": "#1f77b4", "infeasible": "#ff7f0e", "failed": "#9467bd", "interrupted": "#7f7f7f"}


def padded(values: list[float]) -> list[float]:
    """An axis range holding ``values`` with room around them for the marks and their labels."""
    low, high = min(values, default=0.0), max(values, default=1.0)
    span = high - low or abs(high) or 1.0
    return [low - 0.15 * span, high + 0.15 * span]


def latency_axis(values: Iterable[float | None]) -> dict[str, Any]:
    """A latency axis's settings: logarithmic where the values span more than :data:`LOG_SPAN`."""
    drawn = [v for v in values if v is not None and v > 0]
    if drawn and max(drawn) / min(drawn) > LOG_SPAN:
        return {"type": "log", "title": "latency (ms, log scale)"}
    return {"title": "latency (ms)"}


def _style(mark: Mark) -> tuple[str, str, str]:
    """The mark's symbol, colour and label position (:data:`MARK_STYLE`)."""
    return MARK_STYLE["baseline" if mark.label.startswith("baseline") else "winner"]


def _mark_trace(mark: Mark, x: float, y: float | None, row: TrialRow | None = None) -> Any:
    """The baseline or the winner, labelled, its hover text with the trial's own (its parameters)."""
    import plotly.graph_objects as go

    symbol, colour, position = _style(mark)
    return go.Scatter(
        x=[x],
        y=[y],
        mode="markers+text",
        marker={"symbol": symbol, "size": 18, "color": colour, "line": {"width": 1, "color": "white"}},
        text=[mark.label],
        textposition=position,
        name=mark.name,
        hovertext=[mark.hover + ("<br>" + row.hover if row is not None else "")],
        hoverinfo="text",
    )


def _points(rows: list[TrialRow], x: list[Any], y: list[Any], name: str, **marker: Any) -> Any:
    """``rows`` as markers at ``x``, ``y``, each with its trial's hover text (its parameters)."""
    import plotly.graph_objects as go

    return go.Scatter(
        x=x, y=y, mode="markers", marker=marker or None, name=name, hovertext=[r.hover for r in rows], hoverinfo="text"
    )


LEGEND = {"orientation": "h", "yanchor": "top", "y": -0.22, "xanchor": "left", "x": 0}
"""Legends below the plot, clear of the axis title."""


def pareto_figure(rows: list[TrialRow], axis: ErrorAxis, marked: list[Mark] | None = None) -> Any:
    """Latency against ``axis`` of every trial measured (search latencies), feasible and infeasible
    by reason, the Pareto front as a step line, and the baseline and winner where the summary
    places them."""
    import plotly.graph_objects as go

    figure = go.Figure()
    drawn = [r for r in rows if r.latency_ms is not None and axis.value(r.accuracy) is not None]
    groups = {"feasible": [r for r in drawn if r.status == "feasible"]}
    for r in drawn:
        if r.status != "feasible":
            groups.setdefault(f"{r.status}: {r.cause}", []).append(r)
    for label, shown in groups.items():
        feasible = label == "feasible"
        x, y = [r.latency_ms for r in shown], [axis.value(r.accuracy) for r in shown]
        style = {"symbol": "circle" if feasible else "x", "size": 8 if feasible else 10, "opacity": 0.8}
        figure.add_trace(_points(shown, x, y, label[:80], **style))
    front = pareto_front(rows, axis)
    figure.add_trace(
        go.Scatter(
            x=[r.latency_ms for r in front],
            y=[axis.value(r.accuracy) for r in front],
            mode="lines+markers",
            line={"shape": "hv", "width": 3, "color": "#2ca02c"},
            marker={"size": 6},
            name="Pareto front",
            hovertext=[r.hover for r in front],
            hoverinfo="text",
        )
    )
    by_number = {r.number: r for r in rows}
    for mark in marked or []:
        row = by_number.get(mark.trial)
        error = axis.value(row.accuracy) if row is not None else None
        figure.add_trace(_mark_trace(mark, mark.latency_ms, error, row))
    untimed = Counter(r.status for r in rows if r.latency_ms is None and r.status in ("infeasible", "failed"))
    if untimed:
        counted = " and ".join(f"{count} {status}" for status, count in sorted(untimed.items()))
        candidates = in_number(sum(untimed.values()), "candidate")
        figure.add_annotation(
            text=f"{counted} {candidates} not timed: see the trials by outcome and reason",
            xref="paper",
            yref="paper",
            x=0,
            y=1.0,
            yanchor="bottom",
            showarrow=False,
            font={"size": 11, "color": "#555555"},
        )
    latencies = [r.latency_ms for r in drawn] + [m.latency_ms for m in marked or []]
    errors = [axis.value(r.accuracy) for r in drawn]  # the marked trials' among them
    yaxis: dict[str, Any] = {"title": axis.title, "range": padded([e for e in errors if e is not None])}
    if axis.higher_is_better and not axis.complement:
        yaxis["range"] = yaxis["range"][::-1]  # better is lower on the page, as for an error
    figure.update_layout(
        title=f"Latency against {axis.title}", xaxis=latency_axis(latencies), yaxis=yaxis, legend=LEGEND
    )
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
    numbers = [r.number for r in feasible]
    figure = go.Figure(
        [
            _points(feasible, numbers, [r.latency_ms for r in feasible], "trial"),
            go.Scatter(x=numbers, y=best, mode="lines", line={"shape": "hv"}, name="best so far"),
        ]
    )
    right, by_number = max(numbers, default=0), {r.number: r for r in rows}
    for mark in marked or []:  # a line across, and the mark at the right end, labelled
        _, colour, _ = _style(mark)
        figure.add_hline(y=mark.latency_ms, line_dash="dash", line_color=colour)
        figure.add_trace(_mark_trace(mark, right, mark.latency_ms, by_number.get(mark.trial)))
    axis = latency_axis([r.latency_ms for r in feasible] + [m.latency_ms for m in marked or []])
    figure.update_layout(title="Optimization history", xaxis_title="trial", yaxis=axis, legend=LEGEND)
    return figure


def importance_figure(study: optuna.Study) -> Any | None:
    """fANOVA importances of the parameters for latency (None where too few trials completed)."""
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
    """Each trial's build time against its search latency."""
    import plotly.graph_objects as go

    shown = [r for r in rows if r.build_s is not None and r.latency_ms is not None]
    figure = go.Figure(_points(shown, [r.build_s for r in shown], [r.latency_ms for r in shown], "trial"))
    axis = latency_axis([r.latency_ms for r in shown])
    figure.update_layout(title="Build time against latency", xaxis_title="build (s)", yaxis=axis)
    return figure


def outcomes_figure(rows: list[TrialRow]) -> Any:
    """How many candidates ended how: feasible, and the infeasible, failed and interrupted ones by
    reason (a candidate evaluated once however often it was proposed)."""
    import plotly.graph_objects as go

    counted = Counter((r.status, r.cause) for r in rows if r.reused_from is None and r.status in STATUS_COLOURS)
    ordered = sorted(counted.items(), key=lambda item: (list(STATUS_COLOURS).index(item[0][0]), -item[1]))[::-1]
    labels = [f"{status}: {cause[:70]}" if cause else status for (status, cause), _ in ordered]
    figure = go.Figure(
        go.Bar(
            x=[count for _, count in ordered],
            y=labels,
            orientation="h",
            marker={"color": [STATUS_COLOURS[status] for (status, _), _ in ordered]},
            text=[count for _, count in ordered],
            hovertext=[f"{label}: {count}" for label, (_, count) in zip(labels, ordered, strict=True)],
            hoverinfo="text",
        )
    )
    figure.update_layout(
        title="Trials by outcome and reason",
        xaxis_title="candidates",
        yaxis={"automargin": True},
        height=max(260, 90 + 34 * len(labels)),
    )
    return figure


def profile_figure(profile: dict[str, Any]) -> Any:
    """A saved profile (``gpt-optuna profile``) as grouped bars: each operator type's time per run
    in the baseline and in the trial, the trial's slowest first."""
    import plotly.graph_objects as go

    rows = profile["by_op_type"]
    types = [row["op_type"] for row in rows]
    figure = go.Figure(
        [
            go.Bar(name=profile["baseline"] + " (baseline)", x=types, y=[row["baseline_ms"] for row in rows]),
            go.Bar(name=profile["trial"], x=types, y=[row["trial_ms"] for row in rows]),
        ]
    )
    figure.update_layout(
        barmode="group",
        title=f"Where the time goes: {profile['trial']} against the baseline (median of {profile['runs']} runs)",
        yaxis_title="ms per run",
    )
    return figure
