"""A study's outcome read from its trials: the baseline, the winner, their figures and stability."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from gpt_optuna.core.engine_spec import is_composition, trial_engine
from gpt_optuna.study.confirmation import Confirmation, YoursConfirmed, recorded_confirmation
from gpt_optuna.study.evidence import significant
from gpt_optuna.study.record import StudyRecord, recorded_host, recorded_measure, recorded_space
from gpt_optuna.study.recovery import orphans
from gpt_optuna.study.taxonomy import (
    STATUSES,
    baseline_trial,
    engine_default_trials,
    failure_causes,
    is_interrupted,
    own_results,
    retried_numbers,
    search_ranking,
    trial_status,
    your_trial,
)
from gpt_optuna.study.trial_record import TrialRecord


def finished_count(study: optuna.Study) -> int:
    """Trials that count towards --n-trials: evaluated ones, not interrupted ones."""
    return len(own_results(study.get_trials(deepcopy=False)))


def first_value(trial: FrozenTrial) -> float | None:
    """The trial's first objective: latency (or build time in a dry run), in any number of objectives."""
    return trial.values[0] if trial.values else None


@dataclass(frozen=True)
class Figures:
    """A trial's latency beside the baseline's, both from one named measurement, and their ratio:
    where the trial was a finalist, the finalists' interleaved re-measurement with a 95 % interval
    (``confirmed`` from two processes or more, ``indicative`` from one), else ``search``."""

    number: int
    measurement: str
    latency_ms: float | None
    baseline_ms: float | None
    ci: tuple[float, float] | None = None
    """The bootstrap 95 % interval of the speedup (confirmed finalists only)."""
    process_ms: tuple[float, ...] = ()
    """The trial's median in each confirmation process."""
    processes: int = 0
    """The confirmation processes the figures come from (0: the search's)."""

    @property
    def speedup(self) -> float | None:
        """``baseline_ms / latency_ms``: the ratio of the two figures shown beside it."""
        return self.baseline_ms / self.latency_ms if self.baseline_ms and self.latency_ms else None

    @property
    def significant(self) -> bool:
        """Confirmed, and the interval lies above 1.0: a real improvement over the baseline."""
        return self.ci is not None and significant(self.ci[0], self.ci[1], self.processes)


@dataclass(frozen=True)
class Stability:
    """How many of the search's latency measurements missed their precision target."""

    unstable: int
    measured: int
    target: float
    """The target: the median's 95 % half-width as a fraction of it."""
    worst: float
    """The largest half-width among the unstable ones."""
    winner_unstable: bool
    on_gpu: bool
    """Measured on a GPU (else on the CPU), for the advice."""


@dataclass(frozen=True)
class StudySummary:
    """What status, best, the report, export and the end of tune say about a study: one winner,
    one pair of latencies of one measurement, and their ratio.

    Where the finalists were confirmed, the confirmation decides: its top finalist, or the baseline
    itself when the baseline was significantly faster than every finalist; the latencies are the
    confirmed medians. Otherwise the fastest feasible trial of the search, with search latencies.
    """

    name: str
    counts: dict[str, int]
    """Trials per status of :func:`trial_status`."""
    reused: int
    baseline: FrozenTrial | None
    best: FrozenTrial | None
    dry_run: bool = False
    confirmed: dict[str, Any] | None = None
    """The confirmation as the study keeps it (:attr:`confirmation` reads it)."""
    failures: tuple[tuple[int, str], ...] = ()
    """(count, cause) of the failed candidates."""
    warm_started: tuple[str, ...] = ()
    """``STUDY:TRIAL`` of each trial a warm start queued."""
    allow_io_change: bool = False
    """The study let candidates change the model's input and output dtypes (``--allow-io-change``)."""
    stability: Stability | None = None
    orphaned: tuple[int, ...] = ()
    """RUNNING trials whose tuner on this host is gone (a killed run, a full disk): the next run
    fails them and retries their candidates."""
    trials: tuple[FrozenTrial, ...] = ()
    """Every trial of the study, by number."""
    stale_confirmation: dict[str, Any] | None = None
    """A recorded confirmation that no longer speaks for the study: trials measured since it
    entered the search's top, so its finalists are not the best any more."""
    host_tuned: tuple[tuple[str, Any, str], ...] = ()
    """(knob, value, why) of each setting the winner changed whose best value depends on the host
    it was measured on."""
    host_warnings: tuple[str, ...] = ()
    """What the look at the host before the search found (load, other GPU work, clocks)."""
    yours: FrozenTrial | None = None
    """The trial of the user's own configuration (``--baseline-config``), where there is one."""
    backend: str | None = None
    """The study's backend spec (several engines: a comma list)."""
    engine_defaults: tuple[tuple[str, FrozenTrial], ...] = ()
    """(engine, trial) of each other engine's defaults, in a study of several engines."""

    def engine(self, trial: FrozenTrial) -> str | None:
        """The engine ``trial`` ran, in a study of several engines; None in a study of one."""
        return trial_engine(self.backend, trial.params) if is_composition(self.backend) else None

    @property
    def unit(self) -> str:
        return "s to build" if self.dry_run else "ms"

    @property
    def baseline_search_value(self) -> float | None:
        """The baseline's figure in the search: its latency (measured even when infeasible), or build time."""
        if self.baseline is None:
            return None
        if self.dry_run:
            return first_value(self.baseline)
        return TrialRecord(self.baseline).latency_ms

    @cached_property
    def confirmation(self) -> Confirmation | None:
        """The finalists' re-measurement that speaks for the study (None without one)."""
        return Confirmation.of(self.confirmed)

    def figures(self, trial: FrozenTrial) -> Figures:
        """The trial's figures beside the baseline's: confirmed where it was a finalist (or is the
        confirmed baseline), else the search's."""
        confirmation = self.confirmation
        row = confirmation.row(trial.number) if confirmation is not None else None
        if confirmation is None or row is None or confirmation.baseline is None:
            return Figures(trial.number, "search", first_value(trial), self.baseline_search_value)
        base = confirmation.baseline.median_ms
        which = confirmation.measurement
        return Figures(trial.number, which, row.median_ms, base, row.ci, row.process_ms, confirmation.processes)

    def versus_yours(self, trial: FrozenTrial) -> Figures | None:
        """The trial's figures beside the user's own configuration's (``baseline_ms`` is theirs),
        from the confirmation where it re-measured both, else the search's; None without one, or
        where either has no latency."""
        if self.yours is None or trial.number == self.yours.number:
            return None
        if self.baseline is not None and self.yours.number == self.baseline.number:
            return self.figures(trial)
        confirmation = self.confirmation
        return self._versus(self.yours, None if confirmation is None else confirmation.yours, trial)

    def versus_engine(self, engine: str, trial: FrozenTrial) -> Figures | None:
        """The trial's figures beside ``engine``'s defaults (``baseline_ms`` is theirs), as
        :meth:`versus_yours`; None where the study has no such trial, or it is ``trial``."""
        reference = dict(self.engine_defaults).get(engine)
        if reference is None or trial.number == reference.number:
            return None
        confirmation = self.confirmation
        return self._versus(reference, None if confirmation is None else confirmation.engines.get(engine), trial)

    def _versus(self, reference: FrozenTrial, confirmed: YoursConfirmed | None, trial: FrozenTrial) -> Figures | None:
        """The trial beside ``reference``: re-measured together (``confirmed``), else the search's."""
        confirmation = self.confirmation
        row = confirmed.row(trial.number) if confirmed else None
        if confirmation is not None and confirmed is not None and row is not None:
            theirs_ms, which, processes = confirmed.median_ms, confirmation.measurement, confirmation.processes
            return Figures(trial.number, which, row.median_ms, theirs_ms, row.ci, row.process_ms, processes)
        latency, theirs = TrialRecord(trial).latency_ms, TrialRecord(reference).latency_ms
        if latency is None or theirs is None:
            return None
        return Figures(trial.number, "search", latency, theirs)

    def your_latency(self) -> tuple[float | None, str]:
        """The user's own configuration's latency (ms) and the measurement it comes from: the
        confirmation where it re-measured it, else the search's (None without one)."""
        confirmation = self.confirmation
        if confirmation is not None and confirmation.yours is not None:
            return confirmation.yours.median_ms, confirmation.measurement
        return (None if self.yours is None else TrialRecord(self.yours).latency_ms), "search"

    def beats_yours(self, trial: FrozenTrial) -> bool:
        """Whether ``trial`` is faster than the user's own configuration by the study's evidence:
        beyond the confirmation's interval where it re-measured both, else in the search."""
        figures = self.versus_yours(trial)
        if figures is None or figures.speedup is None:
            return False
        if figures.ci is None:
            return figures.measurement == "search" and figures.speedup > 1.0
        return figures.significant

    @cached_property
    def winner(self) -> Figures | None:
        """The winner's figures (None before any feasible trial)."""
        return None if self.best is None else self.figures(self.best)

    @property
    def measurement(self) -> str:
        """Which measurement the figures come from: ``confirmed``, ``indicative`` or ``search``."""
        return self.winner.measurement if self.winner is not None else "search"

    @property
    def baseline_value(self) -> float | None:
        """The baseline's latency in the measurement the winner is judged by."""
        return self.winner.baseline_ms if self.winner is not None else self.baseline_search_value

    @property
    def best_value(self) -> float | None:
        """The winner's latency (or build time) in that same measurement."""
        return self.winner.latency_ms if self.winner is not None else None

    @property
    def speedup(self) -> float | None:
        """``baseline_value / best_value``: the ratio of the two figures shown beside it."""
        return self.winner.speedup if self.winner is not None else None

    @property
    def baseline_wins(self) -> bool:
        """The baseline is the winner: the confirmation measured it faster than every finalist
        beyond their intervals, or (unconfirmed) no feasible candidate was faster in the search."""
        return bool(self.best is not None and self.baseline is not None and self.best.number == self.baseline.number)

    @cached_property
    def verdict(self) -> str:
        """What the study found, in one word (:func:`gpt_optuna.study.evidence.judge` where the
        finalists were re-measured): ``faster`` (confirmed, beyond its interval), ``inconclusive``
        (the processes disagreed too much to decide), ``not_significant`` (no gain worth having),
        ``baseline`` (keep the default configuration), ``indicative`` (one process only),
        ``unconfirmed`` (search figures only), ``none`` (no feasible candidate yet) or ``dry_run``."""
        if self.dry_run:
            return "dry_run"
        winner, confirmation = self.winner, self.confirmation
        if winner is None:
            return "none"
        top = confirmation.top if confirmation is not None else None
        if winner.measurement == "search" or confirmation is None or top is None:
            return "baseline" if self.baseline_wins else "unconfirmed"
        return confirmation.verdict(top)

    @property
    def keeps_default(self) -> bool:
        """The verdict recommends the default configuration: nothing measured beats it for sure."""
        return self.verdict in ("baseline", "not_significant", "inconclusive")

    @cached_property
    def decided(self) -> FrozenTrial | None:
        """The trial the study recommends deploying: the baseline where the verdict keeps the
        default configuration, else the winner (None before any feasible trial); where the user
        gave their own configuration, theirs unless that one is shown faster than it."""
        decided = self.baseline if self.keeps_default and self.baseline is not None else self.best
        feasible = self.yours is not None and self.yours.state is TrialState.COMPLETE
        if not feasible or decided is None or self.beats_yours(decided):
            return decided
        return self.yours

    @property
    def io_changes(self) -> dict[str, dict[str, list[str]]]:
        """The winner's input and output dtypes that differ from the model's (``--allow-io-change``)."""
        return TrialRecord(self.best).io_changes if self.best is not None else {}


def stability(trials: Sequence[FrozenTrial], target: float, winner: FrozenTrial | None) -> Stability | None:
    """The search's measurements that missed the precision target (None where none was measured)."""
    records = [TrialRecord(t) for t in trials]
    measured = [r for r in records if r.latency is not None and not r.reused]
    if not measured:
        return None
    unstable = [r for r in measured if not r.latency_stable]
    worst = max((r.latency_rel_ci for r in unstable), default=0.0)
    flagged = winner is not None and any(r.number == winner.number for r in unstable)
    on_gpu = any((r.gpu or "cpu") != "cpu" for r in measured)
    return Stability(len(unstable), len(measured), target, worst, flagged, on_gpu)


def covers(confirmation: Confirmation, trials: Sequence[FrozenTrial], baseline: FrozenTrial | None) -> bool:
    """Whether a recorded confirmation still speaks for the study: it re-measured the study's
    baseline and what are still the search's best candidates (as many as it re-measured)."""
    finalists = confirmation.finalists
    if baseline is None or confirmation.baseline is None or confirmation.baseline.number != baseline.number:
        return False
    ranked = [t.number for t in search_ranking(list(trials)) if t.number != baseline.number]
    return set(ranked[: len(finalists)]) == set(finalists)


def host_tuned(
    study: optuna.Study, best: FrozenTrial | None, baseline: FrozenTrial | None
) -> list[tuple[str, Any, str]]:
    """(knob, value, why) of each host-sensitive setting (see ``Knob.host_sensitive``) in which
    ``best`` differs from the baseline."""
    if best is None or baseline is None or best.number == baseline.number:
        return []
    knobs = recorded_space(study) or []
    return [
        (k["name"], best.params[k["name"]], k["host_sensitive"])
        for k in knobs
        if k.get("host_sensitive")
        and k["name"] in best.params
        and best.params[k["name"]] != baseline.params.get(k["name"], k["default"])
    ]


def summarize_study(study: optuna.Study) -> StudySummary:
    trials = study.get_trials(deepcopy=False)
    retried = retried_numbers(trials)
    counts = dict.fromkeys(STATUSES, 0) | Counter(trial_status(t, retried) for t in trials)
    complete = [t for t in trials if t.state is TrialState.COMPLETE and t.values]
    best = min(complete, key=lambda t: (t.values[0], t.number)) if complete else None
    baseline = baseline_trial(trials)
    confirmed, stale = recorded_confirmation(study), None
    confirmation = Confirmation.of(confirmed)
    if confirmation is not None and not covers(confirmation, trials, baseline):
        confirmed, stale, confirmation = None, confirmed, None
    if confirmation is not None and confirmation.top is not None:  # the interleaved re-measurement decides the winner
        assert confirmation.baseline is not None
        best = trials[confirmation.baseline.number if confirmation.baseline_wins else confirmation.top.number]
    record = StudyRecord.read(study)
    return StudySummary(
        name=study.study_name,
        counts=counts,
        reused=sum(1 for t in trials if TrialRecord(t).reused),
        baseline=baseline,
        best=best,
        dry_run=record.dry_run,
        confirmed=confirmed,
        failures=tuple(failure_causes(trials)),
        warm_started=tuple(
            source
            for t in trials
            if (source := TrialRecord(t).warm_start_from) is not None
            and not is_interrupted(t, retried)  # a retry counts once
        ),
        allow_io_change=record.allow_io_change,
        stability=stability(trials, recorded_measure(study).target_rel_ci, best),
        orphaned=orphans(study, trials),
        trials=tuple(trials),
        stale_confirmation=stale,
        host_tuned=tuple(host_tuned(study, best, baseline)),
        host_warnings=tuple((recorded_host(study) or {}).get("warnings", [])),
        yours=your_trial(trials),
        backend=record.backend,
        engine_defaults=tuple(engine_default_trials(trials).items()),
    )
