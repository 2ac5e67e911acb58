"""The finalists' re-measurement as the study keeps it (:data:`~.record.CONFIRMED_ATTR`): written from
the rounds' medians (:func:`summarize_rounds`) and read back typed (:class:`Confirmation`): its rows,
what it is as evidence, and whether the baseline won it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from gpt_optuna.study.evidence import LEVEL, MIN_PROCESSES, Speedup, judge, significant, speedups, widened_by
from gpt_optuna.study.record import CONFIRMED_ATTR

if TYPE_CHECKING:
    import optuna


@dataclass(frozen=True)
class ConfirmedRow:
    """One re-measured trial: its median over the processes, and (beside the baseline, or the
    user's own configuration) its speedup with the interval."""

    number: int
    median_ms: float
    speedup: float | None
    ci: tuple[float, float] | None
    process_ms: tuple[float, ...]
    process_speedups: tuple[float, ...]
    noise: tuple[float, float] | None
    """The standard deviations of a process's log speedup between processes and between rounds
    within one (None: recorded before they were kept)."""
    stored: Mapping[str, Any] = field(repr=False, compare=False)
    """The row as the study keeps it (what ``export`` writes)."""

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> ConfirmedRow:
        return cls(
            number=int(row["number"]),
            median_ms=float(row["median_ms"]),
            speedup=float(row["speedup"]) if "speedup" in row else None,
            ci=(float(row["ci_low"]), float(row["ci_high"])) if "ci_low" in row else None,
            process_ms=tuple(float(v) for v in row.get("process_ms") or ()),
            process_speedups=tuple(float(v) for v in row.get("process_speedups") or ()),
            noise=(float(row["process_sd"]), float(row["round_sd"])) if "round_sd" in row else None,
            stored=row,
        )


@dataclass(frozen=True)
class YoursConfirmed:
    """A configuration the winner is stated against (the user's own, or another engine's defaults)
    as the confirmation re-measured it, and every other one beside it."""

    number: int
    median_ms: float
    versus: tuple[ConfirmedRow, ...]

    def row(self, number: int) -> ConfirmedRow | None:
        """Trial ``number`` beside it, where the confirmation re-measured both."""
        return next((r for r in self.versus if r.number == number), None)


@dataclass(frozen=True)
class Confirmation:
    """The baseline and the finalists timed in interleaved rounds in fresh processes."""

    baseline: ConfirmedRow | None
    ranking: tuple[ConfirmedRow, ...]
    """The finalists, fastest first."""
    finalists: tuple[int, ...]
    """The trials it re-measured as the search's best (the user's own configuration is not one)."""
    rounds: int
    processes: int
    joint: bool
    """Its intervals hold for the finalists together (confirmations before that held each alone)."""
    yours: YoursConfirmed | None
    stopped: str | None
    """Why it ended early, where it did: its figures are what it measured until then."""
    engines: Mapping[str, YoursConfirmed] = field(default_factory=dict)
    """Each other engine's defaults (by engine, in a study of several engines), as ``yours``."""

    @classmethod
    def of(cls, stored: Mapping[str, Any] | None) -> Confirmation | None:
        """The confirmation a study keeps (None without one)."""
        if not stored:
            return None
        rows = (ConfirmedRow.of(r) for r in stored.get("ranking") or ())
        ranking = tuple(sorted(rows, key=lambda row: -(row.speedup or 0.0)))
        return cls(
            baseline=ConfirmedRow.of(stored["baseline"]) if stored.get("baseline") else None,
            ranking=ranking,
            finalists=tuple(int(n) for n in stored.get("finalists") or (r.number for r in ranking)),
            rounds=int(stored.get("rounds", 0)),
            processes=int(stored.get("processes", 1)),  # confirmations before there were several: one
            joint="level" in stored,
            yours=_against(stored["yours"]) if stored.get("yours") else None,
            stopped=stored.get("stopped") or None,
            engines={engine: _against(reference) for engine, reference in (stored.get("engines") or {}).items()},
        )

    @property
    def measurement(self) -> str:
        """What it is as evidence: ``confirmed`` from two processes or more, else ``indicative``."""
        return "confirmed" if self.processes >= MIN_PROCESSES else "indicative"

    @property
    def top(self) -> ConfirmedRow | None:
        """The fastest finalist (None where it ranked none)."""
        return self.ranking[0] if self.ranking else None

    @property
    def baseline_wins(self) -> bool:
        """The baseline measured faster than every finalist beyond their intervals (in any number
        of processes: from one, only indicative)."""
        top = self.top
        return top is not None and top.ci is not None and top.ci[1] < 1.0

    def verdict(self, row: ConfirmedRow) -> str:
        """What the row's interval supports (:func:`~.evidence.judge`)."""
        assert row.ci is not None
        return judge(row.ci[0], row.ci[1], self.processes)

    @property
    def rounds_each(self) -> int:
        """The rounds each process timed (on average)."""
        return max(self.rounds // max(self.processes, 1), 1)

    def widened_by(self, row: ConfirmedRow) -> str | None:
        """Which term set the row's interval: ``processes`` or ``rounds`` (:func:`~.evidence.widened_by`);
        None where the confirmation did not record them."""
        return None if row.noise is None or self.processes < MIN_PROCESSES else widened_by(*row.noise)

    def row(self, number: int) -> ConfirmedRow | None:
        """Trial ``number``'s row: the baseline or a finalist (None where it re-measured neither)."""
        rows = [self.baseline, *self.ranking] if self.baseline is not None else []
        return next((r for r in rows if r.number == number), None)


def _against(stored: Mapping[str, Any]) -> YoursConfirmed:
    return YoursConfirmed(
        int(stored["number"]), float(stored["median_ms"]), tuple(ConfirmedRow.of(r) for r in stored["versus"])
    )


def _rows(numbers: list[int], found: list[Speedup]) -> list[dict[str, Any]]:
    return [
        {
            "number": number,
            "median_ms": s.latency_ms,
            "process_ms": list(s.process_ms),
            "speedup": s.estimate,
            "ci_low": s.low,
            "ci_high": s.high,
            "process_speedups": list(s.process_ratios),
            "process_sd": s.between_sd,
            "round_sd": s.within_sd,
            "significant": significant(s.low, s.high, s.processes),
        }
        for number, s in zip(numbers, found, strict=True)
    ]


def summarize_rounds(
    numbers: list[int],
    medians: np.ndarray,
    processes: np.ndarray,
    yours: int | None = None,
    extras: int = 0,
    engines: dict[str, int] | None = None,
    planned: tuple[int, str | None] | None = None,
) -> dict[str, Any]:
    """Ranking and speedups (column 0 is the baseline) from the per-round medians and the process
    each round ran in: the record the study keeps (:data:`CONFIRMED_ATTR`). Where the user's own
    configuration (trial ``yours``) was re-measured, every other one's speedup over it too
    (``yours``); so for each other engine's defaults (``engines``: engine -> trial, under
    ``engines``); ``extras``: the last columns are no finalists (those), so they are not ranked;
    ``planned``: the processes planned and why it stopped early (None: it did not)."""
    found = speedups(medians, processes)
    rows = _rows(numbers, found)
    ranked = rows[1 : len(rows) - extras]
    result = {
        "baseline": rows[0],
        "ranking": sorted(ranked, key=lambda row: -row["speedup"]),
        "rounds": len(medians),
        "processes": found[0].processes,
        "level": LEVEL,
        "finalists": [row["number"] for row in ranked],
    }
    if yours is not None and yours != numbers[0]:
        result["yours"] = _versus(yours, numbers, medians, processes)
    measured = {engine: n for engine, n in (engines or {}).items() if n in numbers and n != numbers[0]}
    if measured:
        result["engines"] = {engine: _versus(n, numbers, medians, processes) for engine, n in measured.items()}
    if planned is not None:
        result["planned_processes"], result["stopped"] = planned
    return result


def _versus(number: int, numbers: list[int], medians: np.ndarray, processes: np.ndarray) -> dict[str, Any]:
    """Every other re-measured trial's speedup over trial ``number``."""
    column = numbers.index(number)
    order = [column, *[i for i in range(len(numbers)) if i != column]]
    versus = _rows([numbers[i] for i in order], speedups(medians[:, order], processes))
    return {"number": number, "median_ms": versus[0]["median_ms"], "versus": versus[1:]}


def record_confirmation(study: optuna.Study, record: dict[str, Any]) -> None:
    """Keep the re-measurement's record (:func:`summarize_rounds`) in the study."""
    study.set_user_attr(CONFIRMED_ATTR, record)


def recorded_confirmation(study: optuna.Study) -> dict[str, Any] | None:
    """The study's latest re-measurement record, as written (None: none yet); :meth:`Confirmation.of` reads it."""
    return study.user_attrs.get(CONFIRMED_ATTR)
