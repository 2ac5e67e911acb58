"""The study's plotly figures, drawn from the report's rows: latency against an accuracy metric
with the Pareto front, the optimization history, parameter importances, build time, and every
trial by outcome and reason.

Every trial is drawn once, at its search latency; the baseline, the best candidate and the trial
to deploy are marked on their own points, and the finalists' re-measured latencies are drawn
apart, labelled and linked to their trials' points. Latency axes turn logarithmic where the
latencies drawn span more than :data:`LOG_SPAN`, so that a few slow candidates do not crowd the
competitive ones into one corner.
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from collections.abc import Iterable
from itertools import accumulate
from typing import Any

import optuna

from gpt_optuna.core.words import in_number
from gpt_optuna.results.rows import ErrorAxis, Mark, TrialRow, pareto_front, tells_apart

LOG_SPAN = 10.0
"""Latencies spanning more than this ratio are drawn on a log axis."""
MARK_STYLE = {
    "baseline": ("star", 18, "#444444", "top center"),
    "winner": ("diamond", 16, "#d62728", "bottom right"),
    "not shown faster": ("diamond-open", 16, "#d62728", "bottom right"),
    "deploy": ("circle-open", 30, "#2ca02c", "bottom center"),
}
"""Each mark's symbol, size, colour and label position: the baseline's and the best candidate's
labels go opposite ways, so both stay legible; the deploy mark is a ring around its trial's point."""
CONFIRMED_COLOUR = "#8c564b"
SAME_POINT = 0.1
"""A re-measured latency within this log-ratio of the search's is drawn unlabelled: it sits on its
trial's point, whose marks are labelled."""
STATUS_COLOURS = {"feasible": "#1f77b4", "infeasible": "#ff7f0e", "failed": "#9467bd", "interrupted": "#7f7f7f"}
MIN_IMPORTANCE_TRIALS = 20
"""Feasible trials below which no importances are drawn: fANOVA's forest over fewer noisy
latencies ranks the knobs by chance."""


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


def trial_axis(numbers: list[int]) -> dict[str, Any]:
    """A trial-number axis ticked at whole trials (1, 2, 5, 10, ... apart: about ten ticks)."""
    span = max(numbers, default=0) - min(numbers, default=0)
    step = next(s for s in (m * 10**e for e in range(9) for m in (1, 2, 5)) if span / s <= 10)
    return {"title": "trial", "tick0": 0, "dtick": step, "tickformat": "d"}


def _style(mark: Mark) -> tuple[str, int, str, str]:
    """The mark's symbol, size, colour and label position (:data:`MARK_STYLE`)."""
    if mark.kind == "best" and mark.label != "winner":
        return MARK_STYLE["not shown faster"]
    return MARK_STYLE[{"baseline": "baseline", "best": "winner"}.get(mark.kind, mark.kind)]


def _text(mark: Mark, marked: list[Mark]) -> str:
    """What a mark says beside its point: the deploy ring's word joins the other mark on its trial."""
    deployed = {m.trial for m in marked if m.kind == "deploy"}
    shared = any(m.kind != "deploy" and m.trial == mark.trial for m in marked)
    if mark.kind == "deploy":
        return "" if shared else mark.label
    return mark.label.removesuffix(", the winner") + ", deployed" if mark.trial in deployed else mark.label


def _mark_traces(marked: list[Mark], at: dict[int, tuple[float, float | None]], rows: list[TrialRow]) -> list[Any]:
    """Each mark on its trial's point (``at``: the point per trial), labelled, its hover text with
    the trial's own (its parameters)."""
    import plotly.graph_objects as go

    by_number = {r.number: r for r in rows}
    traces = []
    for mark in marked:
        symbol, size, colour, position = _style(mark)
        row = by_number.get(mark.trial)
        traces.append(
            go.Scatter(
                x=[at[mark.trial][0]],
                y=[at[mark.trial][1]],
                mode="markers+text",
                marker={"symbol": symbol, "size": size, "color": colour, "line": {"width": 2, "color": colour}},
                text=[_text(mark, marked)],
                textposition=position,
                textfont={"color": colour},
                cliponaxis=False,  # a label beside a point at the plot's edge runs into the margin, whole
                name=mark.name,
                hovertext=[mark.hover + ("<br>" + row.hover if row is not None else "")],
                hoverinfo="text",
                customdata=[mark.trial],
                meta="mark",
            )
        )
    return traces


def _points(
    rows: list[TrialRow],
    x: list[Any],
    y: list[Any],
    name: str,
    marker: dict[str, Any] | None = None,
    mode: str = "markers",
    meta: str = "trial",
    **trace: Any,
) -> Any:
    """``rows`` as markers (or ``mode``) at ``x``, ``y``, each with its trial's hover text (its parameters)."""
    import plotly.graph_objects as go

    return go.Scatter(
        x=x,
        y=y,
        mode=mode,
        marker=marker,
        name=name,
        hovertext=[r.hover for r in rows],
        hoverinfo="text",
        customdata=[r.number for r in rows],
        meta=meta,
        **trace,
    )


def _confirmed_traces(marked: list[Mark], y: dict[int, float | None]) -> list[Any]:
    """The re-measured latencies of the marked trials, labelled, each linked by a dotted line to
    its trial's search point (one re-measurement per trial, however many marks it carries)."""
    import plotly.graph_objects as go

    shown = {m.trial: m for m in marked if m.confirmed_ms is not None and y.get(m.trial) is not None}
    if not shown:
        return []
    which = next(iter(shown.values())).measurement
    links_x: list[float | None] = []
    links_y: list[float | None] = []
    for m in shown.values():
        links_x += [m.latency_ms, m.confirmed_ms, None]
        links_y += [y[m.trial], y[m.trial], None]
    link = go.Scatter(
        x=links_x,
        y=links_y,
        mode="lines",
        line={"dash": "dot", "color": CONFIRMED_COLOUR, "width": 1},
        name="search to re-measured",
        hoverinfo="skip",
        meta="link",
    )
    points = go.Scatter(
        x=[m.confirmed_ms for m in shown.values()],
        y=[y[t] for t in shown],
        mode="markers+text",
        marker={"symbol": "square-open", "size": 11, "color": CONFIRMED_COLOUR, "line": {"width": 2}},
        text=[which if abs(math.log(m.confirmed_ms / m.latency_ms)) > SAME_POINT else "" for m in shown.values()],  # type: ignore[operator]
        textposition=["middle left" if m.confirmed_ms < m.latency_ms else "middle right" for m in shown.values()],  # type: ignore[operator]
        textfont={"color": CONFIRMED_COLOUR, "size": 11},
        cliponaxis=False,
        name=f"{which}: the re-measured latency, linked to its trial",
        hovertext=[m.hover for m in shown.values()],
        hoverinfo="text",
        customdata=list(shown),
        meta="confirmed",
    )
    return [link, points]


LEGEND = {"orientation": "h", "yanchor": "top", "y": -0.22, "xanchor": "left", "x": 0}
"""Legends below the plot, clear of the axis title."""


def _note(figure: Any, text: str, y: float = 1.0) -> None:
    """A line of small grey text above the plot."""
    figure.add_annotation(
        text=text, xref="paper", yref="paper", x=0, y=y, yanchor="bottom", showarrow=False,
        font={"size": 11, "color": "#555555"},
    )  # fmt: skip


def pareto_figure(rows: list[TrialRow], axis: ErrorAxis, marked: list[Mark] | None = None) -> Any:
    """Latency against ``axis`` of every trial measured, once each at its search latency, feasible
    and infeasible by reason; the baseline, the best candidate and the trial to deploy marked on
    their points; the re-measured latencies apart, linked to them; and the Pareto front above all."""
    import plotly.graph_objects as go

    figure = go.Figure()
    drawn = [r for r in rows if r.latency_ms is not None and axis.value(r.accuracy) is not None]
    groups = _by_outcome(drawn)
    for label, shown in groups.items():
        feasible = label == "feasible"
        x, y = [r.latency_ms for r in shown], [axis.value(r.accuracy) for r in shown]
        style = {"symbol": "circle" if feasible else "x", "size": 8 if feasible else 10, "opacity": 0.8}
        figure.add_trace(_points(shown, x, y, label[:80], style))
    errors = {r.number: axis.value(r.accuracy) for r in drawn}
    marked = [m for m in marked or [] if errors.get(m.trial) is not None]
    figure.add_traces(_mark_traces(marked, {m.trial: (m.latency_ms, errors[m.trial]) for m in marked}, rows))
    figure.add_traces(_confirmed_traces(marked, errors))
    figure.add_trace(_front_trace(pareto_front(rows, axis), axis))
    for index, text in enumerate(_pareto_notes(rows, axis, len(groups["feasible"]))):
        _note(figure, text, 1.0 + 0.06 * index)
    latencies = [r.latency_ms for r in drawn] + [m.confirmed_ms for m in marked]
    yaxis = _error_axis(axis, [e for e in errors.values() if e is not None])
    figure.update_layout(
        title=f"Latency against {axis.title}", xaxis=latency_axis(latencies), yaxis=yaxis, legend=LEGEND
    )
    return figure


def _front_trace(front: list[TrialRow], axis: ErrorAxis) -> Any:
    """The Pareto front as a line over its points."""
    line = {"shape": "hv", "width": 3, "color": "#2ca02c"}
    marker = {"size": 7, "color": "#2ca02c", "line": {"width": 1, "color": "white"}}
    x, y = [r.latency_ms for r in front], [axis.value(r.accuracy) for r in front]
    return _points(front, x, y, "Pareto front", marker, "lines+markers", "front", line=line)


def _error_axis(axis: ErrorAxis, values: list[float]) -> dict[str, Any]:
    """The y axis over ``values``, better lower on the page (an accuracy that grows upside down)."""
    yaxis: dict[str, Any] = {"title": axis.title, "range": padded(values)}
    if axis.higher_is_better and not axis.complement:
        yaxis["range"] = yaxis["range"][::-1]  # better is lower on the page, as for an error
    return yaxis


def _by_outcome(drawn: list[TrialRow]) -> dict[str, list[TrialRow]]:
    """The trials drawn, feasible first, then by status and cause."""
    groups = {"feasible": [r for r in drawn if r.status == "feasible"]}
    for r in drawn:
        if r.status != "feasible":
            groups.setdefault(f"{r.status}: {r.cause}", []).append(r)
    return groups


def _pareto_notes(rows: list[TrialRow], axis: ErrorAxis, feasible: int) -> list[str]:
    """What the figure cannot show: the candidates not timed, and an axis on which ``feasible``
    trials all measure the same."""
    untimed = Counter(r.status for r in rows if r.latency_ms is None and r.status in ("infeasible", "failed"))
    notes = []
    if untimed:
        counted = " and ".join(f"{count} {status}" for status, count in sorted(untimed.items()))
        notes.append(
            f"{counted} {in_number(sum(untimed.values()), 'candidate')} not timed: see the trials by outcome and reason"
        )
    if feasible > 1 and not tells_apart(rows, axis):
        notes.append(f"all {feasible} feasible trials measure the same {axis.title}: this axis cannot tell them apart")
    return notes


def history_figure(rows: list[TrialRow], marked: list[Mark] | None = None) -> Any:
    """Each feasible trial's search latency and the best so far, the baseline, the best candidate
    and the trial to deploy marked on their own trials."""
    import plotly.graph_objects as go

    marked = marked or []
    feasible = [r for r in rows if r.status == "feasible" and r.latency_ms is not None]
    best = list(accumulate((r.latency_ms for r in feasible), min))  # type: ignore[type-var]
    numbers = [r.number for r in feasible]
    figure = go.Figure(
        [
            _points(feasible, numbers, [r.latency_ms for r in feasible], "trial"),
            go.Scatter(x=numbers, y=best, mode="lines", line={"shape": "hv"}, name="best so far", meta="line"),
        ]
    )
    figure.add_traces(_mark_traces(marked, {m.trial: (m.trial, m.latency_ms) for m in marked}, rows))
    axis = latency_axis([r.latency_ms for r in feasible] + [m.latency_ms for m in marked])
    xaxis = trial_axis(numbers + [m.trial for m in marked])
    figure.update_layout(title="Optimization history (search latencies)", xaxis=xaxis, yaxis=axis, legend=LEGEND)
    return figure


def importance_figure(study: optuna.Study) -> Any | None:
    """fANOVA importances for latency of the parameters that took more than one value (None below
    :data:`MIN_IMPORTANCE_TRIALS` feasible trials: :func:`importance_absence` says why)."""
    import plotly.graph_objects as go

    complete = [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)) if t.values]
    if len(complete) < MIN_IMPORTANCE_TRIALS:
        return None
    common = set.intersection(*(set(t.params) for t in complete))  # those every trial has
    varied = sorted(k for k in common if len({repr(t.params[k]) for t in complete}) > 1)
    if not varied:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # notes on sparse regimes, printed mid-report otherwise
            importances = optuna.importance.get_param_importances(study, params=varied, target=lambda t: t.values[0])
    except (RuntimeError, ValueError):  # a parameter some trials lack, or a single point
        return None
    if not importances:
        return None
    names = list(importances)[::-1]
    figure = go.Figure(go.Bar(x=[importances[n] for n in names], y=names, orientation="h", name="importance"))
    figure.update_layout(
        title=f"Parameter importances for latency ({len(complete)} feasible trials)",
        yaxis={"automargin": True},
        height=max(260, 120 + 30 * len(names)),
    )
    _note(
        figure,
        "fANOVA over noisy search latencies: a rough ranking of the knobs that varied, not a measurement",
        1.02,
    )
    return figure


def importance_absence(study: optuna.Study) -> str:
    """Why :func:`importance_figure` draws nothing for ``study``."""
    complete = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))
    if complete < MIN_IMPORTANCE_TRIALS:
        return (
            f"Parameter importances: not drawn: {complete} feasible trials; they need at least"
            f" {MIN_IMPORTANCE_TRIALS} to say more than noise."
        )
    return "Parameter importances: not drawn: no parameter took more than one value among the feasible trials."


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
