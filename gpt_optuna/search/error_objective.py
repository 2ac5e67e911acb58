"""What ``--objectives latency,error`` trades latency against, said before the search where it may
trade against nothing: the error objective is the criterion's first clause's metric, and an
agreement-style metric (a task metric of the user's, top-k agreement) that every feasible
candidate meets at its best makes the search one over latency alone."""

from __future__ import annotations

from gpt_optuna.protocol.accuracy import STANDARD_METRICS, Criterion

AGREEMENT = ("topk", "outside")
"""Built-in metrics that count agreeing elements: a rate that many candidates meet exactly."""


def error_objective_note(objectives: tuple[str, ...], criterion: Criterion) -> list[str]:
    """A note where ``error`` is an objective and its metric may be the same for every feasible
    candidate (none otherwise)."""
    if "error" not in objectives:
        return []
    clause = criterion.clauses[0]
    metric = clause.metric
    if not metric.user and metric.name not in AGREEMENT:
        return []
    at_best = clause.threshold == (1.0 if metric.higher_is_better else 0.0) and clause.op in (">=", "<=")
    how = (
        f"every feasible candidate has {metric.key} = {clause.threshold:g} (its clause demands it), so"
        if at_best
        else f"where every feasible candidate scores the same {metric.key} (an agreement rate at its best),"
    )
    varied = " or ".join(m.key for m in STANDARD_METRICS[:2])
    return [
        f"note: the error objective is {metric.key}, the --accuracy criterion's first clause: {how} the search"
        f" is over latency alone; to trade accuracy off, put a metric that varies first (e.g. {varied})"
    ]
