"""Accuracy metrics against reference outputs, and the criterion that gates candidates.

A criterion is clauses joined by ``and``, each ``METRIC OP NUMBER`` with OP one of
``<= < >= >``. Metrics (worst case over all outputs):

- ``max_abs``, ``mean_abs``: absolute error;
- ``rel_l2``: ``||out - ref|| / ||ref||``;
- ``cosine``: cosine similarity of the flattened tensors;
- ``outside(atol=1e-5, rtol=1e-3)``: fraction of elements with ``|out-ref| > atol + rtol*|ref|``;
- ``topk(k)``: fraction of rows (last axis = classes) whose reference top-1 class is among the
  output's top k classes; ``topk(1)`` is top-1 agreement. Its canonical text, as a study records
  it, is ``top1``, ``top5``: the parser reads both forms.

Over several samples the worst sample counts; ``mean(METRIC)`` averages over them instead. Names
returned by the user's ``--metric`` function are metrics too. NaN or Inf in any output is always
infeasible, and so is a metric the criterion names that comes out NaN. A criterion's ``text``
parses back to the same criterion.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from gpt_optuna.core.errors import UserError

DEFAULT_CRITERION = "cosine>=0.9999"
_VIOLATION_FOR_NONFINITE = 1e6

_OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    "<": operator.lt,
    ">=": operator.ge,
    ">": operator.gt,
}


@dataclass(frozen=True)
class Metric:
    """A named error measure; ``higher_is_better`` decides how outputs and samples are aggregated
    (the worst one counts). ``mean`` averages it over the samples instead; a ``user`` metric comes
    from the function given with ``--metric``, computed over all samples at once."""

    name: str
    params: tuple[tuple[str, float], ...] = ()
    mean: bool = False
    user: bool = False
    user_higher_is_better: bool = True

    @property
    def higher_is_better(self) -> bool:
        return self.user_higher_is_better if self.user else self.name in ("cosine", "topk")

    @property
    def key(self) -> str:
        if self.mean:
            return f"mean({Metric(self.name, self.params).key})"
        if not self.params:
            return self.name
        if self.name == "topk":
            return f"top{int(self.params[0][1])}"
        return f"{self.name}({', '.join(f'{k}={number_text(v)}' for k, v in self.params)})"

    def compute(self, out: np.ndarray, ref: np.ndarray) -> float | None:
        """The metric for one output pair, or None where it does not apply (topk on a scalar)."""
        o = out.astype(np.float64, copy=False).ravel()
        r = ref.astype(np.float64, copy=False).ravel()
        if self.name == "topk":
            return _topk_agreement(out, ref, int(self.params[0][1]))
        if o.size == 0:
            return 1.0 if self.higher_is_better else 0.0
        diff = np.abs(o - r)
        if self.name == "max_abs":
            return float(diff.max())
        if self.name == "mean_abs":
            return float(diff.mean())
        if self.name == "rel_l2":
            denom = float(np.linalg.norm(r))
            num = float(np.linalg.norm(o - r))
            return num / denom if denom > 0 else (0.0 if num == 0 else math.inf)
        if self.name == "cosine":
            no, nr = float(np.linalg.norm(o)), float(np.linalg.norm(r))
            if no == 0 and nr == 0:
                return 1.0
            if no == 0 or nr == 0:
                return 0.0
            return float(np.dot(o, r) / (no * nr))
        if self.name == "outside":
            p = dict(self.params)
            return float(np.mean(diff > p["atol"] + p["rtol"] * np.abs(r)))
        raise AssertionError(self.name)


def number_text(value: float) -> str:
    """``value`` as short as it reads back exactly (``1e-05``, ``0.9999``, ``0.99999995``)."""
    short = f"{value:g}"
    return short if float(short) == value else repr(value)


def _topk_agreement(out: np.ndarray, ref: np.ndarray, k: int) -> float | None:
    if out.ndim < 1 or out.shape[-1] < k:
        return None
    classes = out.shape[-1]
    if k >= classes:
        return 1.0
    ref_top1 = ref.reshape(-1, classes).argmax(axis=1)
    out_topk = np.argpartition(-out.reshape(-1, classes), k - 1, axis=1)[:, :k]
    return float(np.mean((out_topk == ref_top1[:, None]).any(axis=1)))


STANDARD_METRICS = (Metric("max_abs"), Metric("mean_abs"), Metric("rel_l2"), Metric("cosine"))


@dataclass(frozen=True)
class Clause:
    metric: Metric
    op: str
    threshold: float

    def holds(self, value: float) -> bool:
        return _OPS[self.op](value, self.threshold)

    def violation(self, value: float) -> float:
        """How far the value is on the wrong side, relative to the threshold (<= 0 when it holds)."""
        scale = abs(self.threshold) if self.threshold != 0 else 1.0
        if self.op in ("<=", "<"):
            return (value - self.threshold) / scale
        return (self.threshold - value) / scale

    def __str__(self) -> str:
        return f"{self.metric.key}{self.op}{number_text(self.threshold)}"


@dataclass(frozen=True)
class Verdict:
    """The outcome of checking one candidate's outputs."""

    feasible: bool
    reason: str
    metrics: dict[str, float] = field(default_factory=dict)
    constraint: float = 0.0


@dataclass(frozen=True)
class Criterion:
    """Clauses that must all hold; ``text`` is the canonical form stored with the study."""

    clauses: tuple[Clause, ...]

    @property
    def text(self) -> str:
        return " and ".join(str(c) for c in self.clauses)

    @property
    def metrics(self) -> tuple[Metric, ...]:
        """The output metrics computed per sample: the standard ones and those the clauses name."""
        wanted = list(STANDARD_METRICS)
        for clause in self.clauses:
            inner = Metric(clause.metric.name, clause.metric.params)
            if not clause.metric.user and inner not in wanted:
                wanted.append(inner)
        return tuple(wanted)

    @property
    def user_names(self) -> tuple[str, ...]:
        """The metrics the clauses take from the user's ``--metric`` function."""
        return tuple(c.metric.name for c in self.clauses if c.metric.user)

    def evaluate(
        self,
        outputs: Mapping[str, np.ndarray] | Sequence[Mapping[str, np.ndarray]],
        reference: Mapping[str, np.ndarray] | Sequence[Mapping[str, np.ndarray]],
        user: Callable[[], Mapping[str, float]] | None = None,
    ) -> Verdict:
        """Judge a candidate's outputs on one sample, or on several (lists of the same length):
        each output metric is computed per sample, and the worst sample counts (``mean(...)``: the
        average); ``user`` computes the user's metrics over all samples, once the outputs are valid."""
        samples = [outputs] if isinstance(outputs, Mapping) else list(outputs)
        references = [reference] if isinstance(reference, Mapping) else list(reference)
        for sample, ref in zip(samples, references, strict=True):
            invalid = _invalid(sample, ref)
            if invalid:
                return Verdict(False, invalid, constraint=_VIOLATION_FOR_NONFINITE)
        metrics = self._over_samples([self._aggregate(o, r) for o, r in zip(samples, references, strict=True)])
        if user is not None:
            metrics |= {k: float(v) for k, v in user().items()}
        undefined = [c.metric.key for c in self.clauses if math.isnan(metrics[c.metric.key])]
        if undefined:  # no verdict can rest on it: infeasible, with the metrics that were numbers
            known = {k: v for k, v in metrics.items() if not math.isnan(v)}
            return Verdict(False, f"{', '.join(undefined)} is NaN", known, _VIOLATION_FOR_NONFINITE)
        failed = [c for c in self.clauses if not c.holds(metrics[c.metric.key])]
        constraint = max(c.violation(metrics[c.metric.key]) for c in self.clauses)
        if failed:
            reason = "; ".join(f"{c.metric.key}={metrics[c.metric.key]:.6g} fails {c}" for c in failed)
            return Verdict(False, reason, metrics, constraint)
        return Verdict(True, "", metrics, constraint)

    def _over_samples(self, per_sample: list[dict[str, float]]) -> dict[str, float]:
        """Each output metric over the samples: the worst sample's, or (``mean(...)``) the average."""
        metrics = {m.key: _worst(m, [d[m.key] for d in per_sample]) for m in self.metrics}
        for clause in self.clauses:
            if clause.metric.mean:
                inner = Metric(clause.metric.name, clause.metric.params).key
                metrics[clause.metric.key] = float(np.mean([d[inner] for d in per_sample]))
        return metrics

    def error(self, metrics: Mapping[str, float]) -> float:
        """The first clause's metric as an error, lower is better (1 - similarity for cosine, topk)."""
        main = self.clauses[0].metric
        value = metrics[main.key]
        return 1.0 - value if main.higher_is_better else value

    def _aggregate(self, outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for metric in self.metrics:
            values = [metric.compute(np.asarray(outputs[n]), r) for n, r in reference.items()]
            applicable = [v for v in values if v is not None]
            if not applicable:
                raise UserError(f"metric {metric.key} applies to none of the model's outputs")
            metrics[metric.key] = _worst(metric, applicable)
        return metrics

    def check_applicable(self, reference: Mapping[str, np.ndarray]) -> None:
        """Raise UserError now, not mid-search, if a metric fits none of the outputs."""
        self._aggregate(reference, reference)

    def check_user_metrics(self, returned: Mapping[str, object]) -> None:
        """Raise UserError if the ``--metric`` function does not return a number for every user
        metric the criterion names (checked once, on the reference against itself)."""
        missing = [n for n in self.user_names if n not in returned]
        if missing:
            raise UserError(
                f"--accuracy names {missing[0]!r}, which is neither a built-in metric nor one the --metric "
                f"function returns (it returns: {', '.join(sorted(returned)) or 'nothing'})"
            )
        bad = [n for n in self.user_names if not isinstance(returned[n], int | float | np.floating | np.integer)]
        if bad:
            raise UserError(f"the --metric function returns {bad[0]}={returned[bad[0]]!r}: give a number")
        undefined = [n for n in self.user_names if math.isnan(float(returned[n]))]  # type: ignore[arg-type]
        if undefined:
            raise UserError(
                f"the --metric function returns {undefined[0]}=nan for the model's own outputs: the criterion must"
                " be a number there (it holds for the unmodified model)"
            )


def _invalid(outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> str:
    """Why outputs cannot be judged at all (missing, misshapen, NaN or Inf), or empty."""
    for name, ref in reference.items():
        if name not in outputs:
            return f"output {name!r} is missing"
        out = np.asarray(outputs[name])
        if out.shape != ref.shape:
            return f"output {name!r} has shape {out.shape}, the reference {ref.shape}"
        if out.dtype.kind in "fc" and not np.all(np.isfinite(out)):
            return f"output {name!r} contains {'NaN' if np.isnan(out).any() else 'Inf'}"
    return ""


def _worst(metric: Metric, values: list[float]) -> float:
    return min(values) if metric.higher_is_better else max(values)


_CLAUSE_RE = re.compile(
    r"^\s*(?P<name>[A-Za-z_][A-Za-z_0-9]*)\s*(\((?P<args>[^)]*)\))?\s*(?P<op><=|>=|<|>)\s*(?P<num>[-+0-9.eE]+)\s*$"
)
_MEAN_RE = re.compile(r"^\s*mean\s*\((?P<inner>.+)\)\s*(?P<rest>(<=|>=|<|>).*)$")
BUILT_IN = frozenset({"max_abs", "mean_abs", "rel_l2", "cosine", "topk", "outside"})
_TOPK_KEY = re.compile(r"top([1-9][0-9]*)")


def parse_criterion(text: str, user_metrics: bool = False) -> Criterion:
    """Parse ``"cosine>=0.9999 and max_abs<=1e-2"``; ``mean(cosine)>=0.999`` averages a metric over
    the samples instead of taking the worst one. With ``user_metrics``, a name that is no built-in
    metric is one the ``--metric`` function returns. A malformed expression is a UserError."""
    if not text or not text.strip():
        raise UserError("empty --accuracy expression")
    clauses = []
    for part in re.split(r"\s+and\s+", text.strip()):
        mean = _MEAN_RE.match(part)
        match = _CLAUSE_RE.match(f"{mean['inner']}{mean['rest']}" if mean else part)
        if not match:
            raise UserError(f"malformed --accuracy clause {part!r}: expected METRIC OP NUMBER, e.g. cosine>=0.9999")
        try:
            threshold = float(match["num"])
        except ValueError:
            raise UserError(f"malformed number {match['num']!r} in --accuracy clause {part!r}") from None
        legacy_topk = _TOPK_KEY.fullmatch(match["name"])  # topk(k)'s own key, as studies record it
        if legacy_topk and match["args"] is None:
            metric = Metric("topk", (("k", float(legacy_topk[1])),), mean=bool(mean))
        elif match["name"] not in BUILT_IN and user_metrics and match["args"] is None and not mean:
            metric = Metric(match["name"], user=True, user_higher_is_better=match["op"] in (">=", ">"))
        else:
            metric = _parse_metric(match["name"], match["args"], part)
            metric = Metric(metric.name, metric.params, mean=bool(mean))
        clauses.append(Clause(metric, match["op"], threshold))
    return Criterion(tuple(clauses))


def _parse_metric(name: str, args: str | None, clause: str) -> Metric:
    simple = {"max_abs", "mean_abs", "rel_l2", "cosine"}
    if name in simple:
        if args is not None:
            raise UserError(f"metric {name} takes no arguments (in {clause!r})")
        return Metric(name)
    if name == "topk":
        try:
            k = int((args or "").strip())
        except ValueError:
            raise UserError(f"topk needs a positive integer k, e.g. topk(5) (in {clause!r})") from None
        if k < 1:
            raise UserError(f"topk needs a positive integer k (in {clause!r})")
        return Metric("topk", (("k", float(k)),))
    if name == "outside":
        values = {"atol": 1e-5, "rtol": 1e-3}
        for item in filter(None, (a.strip() for a in (args or "").split(","))):
            key, _, value = item.partition("=")
            if key.strip() not in values:
                raise UserError(f"outside() takes atol= and rtol=, not {key.strip()!r} (in {clause!r})")
            try:
                values[key.strip()] = float(value)
            except ValueError:
                raise UserError(f"malformed number {value!r} in {clause!r}") from None
        return Metric("outside", (("atol", values["atol"]), ("rtol", values["rtol"])))
    known = ", ".join(sorted(simple | {"topk(k)", "outside(atol=, rtol=)"}))
    raise UserError(
        f"unknown accuracy metric {name!r} in {clause!r}; known: {known}, or a name your --metric function returns"
    )
