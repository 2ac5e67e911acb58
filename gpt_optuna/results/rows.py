"""The study as plain rows: each trial with its latency, accuracy, status and reason; the marks of
the baseline, the best candidate and the trial to deploy; the Pareto front.

The figures (:mod:`figures`) and the report (:mod:`report`) draw these; they are what the tests
check. The study is only read.
"""

from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass, field
from typing import Any

import optuna

from gpt_optuna.core.errors import UserError
from gpt_optuna.core.words import counted
from gpt_optuna.protocol.accuracy import STANDARD_METRICS, Criterion, parse_criterion
from gpt_optuna.study.record import StudyRecord
from gpt_optuna.study.summary import StudySummary
from gpt_optuna.study.taxonomy import failure_cause, retried_numbers, trial_status
from gpt_optuna.study.trial_record import TrialRecord


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
    cause: str = ""
    """The reason as trials are grouped by it: the accuracy clauses an infeasible trial fails, a
    failed one's outcome and first line."""

    @property
    def hover(self) -> str:
        lines = [f"trial {self.number} ({self.status})"]
        if self.latency_ms is not None:
            lines.append(f"search latency {self.latency_ms:.4g} ms")
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
        record, status = TrialRecord(trial), trial_status(trial, retried)
        accuracy = record.accuracy
        error = criterion.error(accuracy) if criterion is not None and accuracy else None
        reason = record.infeasible or record.failure or record.interrupted or ""
        rows.append(
            TrialRow(
                number=trial.number,
                status=status,
                latency_ms=record.latency_ms,
                error=float(error) if error is not None else None,
                build_s=record.build_s,
                params=dict(trial.params),
                baseline=record.baseline,
                reason=str(reason),
                reused_from=record.reused_from,
                accuracy=dict(accuracy or {}),
                measured_on=f"{record.host} {record.gpu or ''}".strip() if record.host is not None else "",
                cause=_cause(trial, status, record.infeasible),
            )
        )
    return rows


def _cause(trial: optuna.trial.FrozenTrial, status: str, infeasible: str | None) -> str:
    if status == "failed":
        return failure_cause(trial)
    if status == "infeasible":
        reason = infeasible or ""
        clauses = re.findall(r"fails (\S+)", reason)
        return f"fails {', '.join(clauses)}" if clauses else (reason.splitlines() or [""])[0][:80]
    return ""


@dataclass(frozen=True)
class Mark:
    """A trial the summary names, drawn on its own trial's point (its search latency, as every
    trial is drawn): the ``baseline``, the ``best`` candidate, or the one to ``deploy``. Its
    re-measured latency, where the finalists' re-measurement timed it, is ``confirmed_ms``: the
    plots show it apart, labelled, linked to this point."""

    kind: str
    label: str
    trial: int
    latency_ms: float
    measurement: str
    confirmed_ms: float | None = None
    processes: int = 0

    @property
    def name(self) -> str:
        return f"{self.label} (trial {self.trial}, {self.measurement})"

    @property
    def hover(self) -> str:
        lines = [self.name, f"search latency {self.latency_ms:.4g} ms"]
        if self.confirmed_ms is not None:
            again = f"re-measured in {counted(self.processes, 'process', 'processes')}"
            lines.append(f"{self.measurement} latency {self.confirmed_ms:.4g} ms ({again})")
        return "<br>".join(html.escape(line) for line in lines)


def best_label(summary: StudySummary) -> str:
    """What the best candidate is called where it is not the baseline: the ``winner`` only where
    the verdict deploys it; a finalist the re-measurement did not show faster is called that."""
    best, decided = summary.best, summary.decided
    if best is not None and decided is not None and best.number == decided.number:
        return "winner"
    if summary.measurement != "search":
        return "best finalist, not shown faster"
    return "fastest in the search, not deployed"


def marks(summary: StudySummary) -> list[Mark]:
    """The baseline, the best candidate and the trial to deploy, each at its own search latency
    (the deploy mark on whichever of them, or on the user's own configuration, the verdict keeps)."""
    if summary.dry_run or summary.baseline is None:
        return []
    confirmation = summary.confirmation
    measurement = summary.measurement

    def mark(kind: str, label: str, trial: optuna.trial.FrozenTrial) -> Mark | None:
        latency = TrialRecord(trial).latency_ms
        if latency is None:
            return None
        row = confirmation.row(trial.number) if confirmation is not None and measurement != "search" else None
        confirmed = row.median_ms if row is not None else None
        processes = confirmation.processes if confirmation is not None else 0
        return Mark(kind, label, trial.number, latency, measurement, confirmed, processes)

    best, decided = summary.best, summary.decided
    found = [mark("baseline", "baseline, the winner" if summary.baseline_wins else "baseline", summary.baseline)]
    if best is not None and not summary.baseline_wins:
        found.append(mark("best", best_label(summary), best))
    if decided is not None:
        found.append(mark("deploy", "deployed", decided))
    return [m for m in found if m is not None]


@dataclass(frozen=True)
class ErrorAxis:
    """The accuracy metric an error axis shows: a similarity at most 1 (cosine, top-k agreement, a
    user's agreement rate) as ``1 - metric``, any other metric as it is, larger values lower on the
    axis where larger is better."""

    metric: str
    higher_is_better: bool
    complement: bool

    @property
    def title(self) -> str:
        if self.complement:
            return f"1 - {self.metric}"
        return f"{self.metric} ({'higher' if self.higher_is_better else 'lower'} is better)"

    def value(self, accuracy: dict[str, float]) -> float | None:
        """What the axis draws for a trial's metrics (None where it has not this metric)."""
        value = accuracy.get(self.metric)
        if value is None or not math.isfinite(value):
            return None
        return max(0.0, 1.0 - value) if self.complement else float(value)  # a rounded cosine may pass 1

    def cost(self, accuracy: dict[str, float]) -> float | None:
        """The drawn value as lower-is-better, for the Pareto front."""
        value = self.value(accuracy)
        return None if value is None else -value if self.higher_is_better and not self.complement else value


def metric_directions(criterion: Criterion | None) -> dict[str, bool]:
    """Each metric an error axis can show, with whether larger is better: the criterion's clauses
    first (the user's metrics among them), then the output metrics every trial records."""
    found = {c.metric.key: c.metric.higher_is_better for c in (criterion.clauses if criterion else ())}
    return found | {m.key: m.higher_is_better for m in STANDARD_METRICS if m.key not in found}


def error_axis(rows: list[TrialRow], criterion: Criterion | None, metric: str | None = None) -> ErrorAxis:
    """The error axis for ``metric``, or where none is named, the first metric whose values differ
    between the feasible trials: the criterion's clauses first, then the output metrics every trial
    records (an agreement rate every feasible trial meets at 1 tells them apart by none); the first
    clause where no metric does (:func:`tells_apart` says so)."""
    directions = metric_directions(criterion)
    if metric is not None and metric not in directions:
        raise UserError(f"no accuracy metric {metric!r} in this study; choose one of: {', '.join(directions)}")

    def axis(name: str) -> ErrorAxis:
        recorded = [r.accuracy[name] for r in rows if name in r.accuracy and math.isfinite(r.accuracy[name])]
        bounded = directions[name] and max(recorded, default=1.0) <= 1.0 + 1e-6  # a similarity
        return ErrorAxis(name, directions[name], bounded)

    if metric is not None:
        return axis(metric)
    clauses = [c.metric.key for c in criterion.clauses] if criterion is not None else ["cosine"]
    for name in dict.fromkeys([*clauses, *(m.key for m in STANDARD_METRICS)]):
        candidate = axis(name)
        if tells_apart(rows, candidate):
            return candidate
    return axis(clauses[0])


def tells_apart(rows: list[TrialRow], axis: ErrorAxis) -> bool:
    """Whether the feasible trials take more than one value on ``axis``."""
    return len({axis.value(r.accuracy) for r in rows if r.status == "feasible"} - {None}) > 1


def pareto_front(rows: list[TrialRow], axis: ErrorAxis | None = None) -> list[TrialRow]:
    """Feasible trials that no other feasible trial beats on both latency and error (``axis``'s
    cost; without one, the criterion's error), by latency."""

    def cost(r: TrialRow) -> float | None:
        return r.error if axis is None else axis.cost(r.accuracy)

    points = [(r, cost(r)) for r in rows if r.status == "feasible" and r.latency_ms is not None]
    points = [(r, c) for r, c in points if c is not None]
    front = [
        r
        for r, c in points
        if not any(
            o.latency_ms <= r.latency_ms and oc <= c and (o.latency_ms < r.latency_ms or oc < c)  # type: ignore[operator]
            for o, oc in points
        )
    ]
    return sorted(front, key=lambda r: (r.latency_ms, r.number))  # type: ignore[arg-type, return-value]
