"""What the search knows of its study's trials, kept up to date at the cost of the new ones only.

Every trial of a search used to rescan the whole study several times: for the trial budget, the
sampler's seen candidates, an earlier result of the same candidate and the time a trial takes.
:class:`StudyLedger` folds each finished trial in once, as it appears in a read of the study, and
holds what those questions need; a read gives it every trial, but only the unfinished ones and
those it has not folded yet are looked at.
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict, deque
from collections.abc import Mapping, Sequence
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from gpt_optuna.study.taxonomy import is_interrupted, trial_status
from gpt_optuna.study.trial_record import TrialRecord

Key = frozenset[tuple[str, Any]]
"""A candidate as a hashable, order-independent value."""
RECENT = 5
"""Evaluated trials whose time says how long the next one may take (those that did one-off work
for later ones, such as an fp16 sensitivity ranking, left out)."""


def key_of(candidate: Mapping[str, Any]) -> Key:
    return frozenset(candidate.items())


def trial_key(trial: FrozenTrial) -> Key:
    """The trial's candidate: its parameters, or a queued trial's fixed ones."""
    return key_of(TrialRecord(trial).candidate)


def refusal_causes(refused: Mapping[str, list[Key]], ran: list[Key]) -> list[Key]:
    """Per error the engine refused two or more candidates with, the settings they all share,
    where no candidate the engine ran has them all: a candidate holding them would be refused too."""
    shared = (frozenset.intersection(*candidates) for candidates in refused.values() if len(candidates) > 1)
    return [cause for cause in shared if cause and not any(cause <= other for other in ran)]


class StudyLedger:
    """The study's trials folded into what the search asks of them, read by :meth:`update`.

    Several threads (the lanes of one tuner) may share it.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._prefix = 0
        """Trials below this number are all finished and folded in."""
        self._folded: set[int] = set()
        """Finished trials at or above ``_prefix`` folded in."""
        self._retried: set[int] = set()
        self._own: dict[int, Key] = {}
        """Trials holding their own result: candidate by trial number."""
        self._trials: dict[int, FrozenTrial] = {}
        self._holders: Counter[Key] = Counter()
        """How many trials hold each candidate's own result."""
        self._first: dict[Key, FrozenTrial] = {}
        self._open: dict[int, FrozenTrial] = {}
        """The running and queued trials of the last read."""
        self._spans: deque[float] = deque(maxlen=RECENT)
        self.transform_failures: list[Key] = []
        """Candidates whose graph transform failed, in the order they were folded."""
        self.refused: dict[str, list[Key]] = defaultdict(list)
        """Candidates the engine refused, by its error."""
        self.ran: list[Key] = []
        """Candidates the engine built and ran (feasible or not)."""
        self._causes: list[Key] | None = []
        self.held_log: list[Key] = []
        """Each candidate as a trial first held its result, in that order (a reader keeps its place)."""
        self.unfolded = 0
        """Trials whose result was taken back (a retry named them): readers of ``held_log`` start again."""
        self.rules = 0
        """Grows whenever the candidates ruled out may have changed (a failed transform, a refusal)."""

    def update(self, trials: Sequence[FrozenTrial]) -> None:
        """Fold in a read of the study (its trials by number, as Optuna returns them)."""
        with self._lock:
            self._open = {}
            for trial in trials[self._prefix :]:
                for number in TrialRecord(trial).retry_history:
                    self._retry(number)
                if not trial.state.is_finished():
                    self._open[trial.number] = trial
                elif trial.number not in self._folded:
                    self._fold(trial)
            while self._prefix in self._folded:
                self._folded.discard(self._prefix)
                self._prefix += 1

    def add(self, trial: FrozenTrial) -> None:
        """Fold in a trial seen to end here (its state as Optuna told it), before the next read."""
        with self._lock:
            if trial.state.is_finished() and trial.number >= self._prefix and trial.number not in self._folded:
                self._open.pop(trial.number, None)
                self._fold(trial)

    def _fold(self, trial: FrozenTrial) -> None:
        self._folded.add(trial.number)
        if is_interrupted(trial, self._retried):
            return  # its candidate is queued again: a retry holds it
        key = trial_key(trial)
        self._own[trial.number] = key
        self._trials[trial.number] = trial
        if not self._holders[key]:
            self.held_log.append(key)
        self._holders[key] += 1
        first = self._first.get(key)
        if first is None or first.number > trial.number:
            self._first[key] = trial
        record = TrialRecord(trial)
        outcome = record.outcome
        if outcome == "transform_error":
            self.transform_failures.append(key)
            self.rules += 1
        elif outcome == "build_error":
            self.refused[record.failure or ""].append(key)
            self._causes, self.rules = None, self.rules + 1
        elif trial_status(trial, self._retried) in ("feasible", "infeasible"):
            self.ran.append(key)
            if self._causes and any(cause <= key for cause in self._causes):
                self._causes = [cause for cause in self._causes if not cause <= key]
                self.rules += 1
        start, end = trial.datetime_start, trial.datetime_complete
        if start is not None and end is not None and not (record.reused or record.marked_interrupted or record.one_off):
            self._spans.append((end - start).total_seconds())

    def _retry(self, number: int) -> None:
        """A retry names trial ``number``: it was interrupted, whatever it holds."""
        if number in self._retried:
            return
        self._retried.add(number)
        key = self._own.pop(number, None)
        if key is None:
            return
        self.unfolded += 1
        self._holders[key] -= 1
        del self._trials[number]
        if not self._holders[key]:
            del self._holders[key]
        if self._first.get(key) is not None and self._first[key].number == number:
            del self._first[key]
            if self._holders[key]:
                self._first[key] = self._trials[min(n for n, k in self._own.items() if k == key)]

    def taken(self, exclude: int | None = None) -> set[Key]:
        """The candidates of the running and queued trials (other than trial ``exclude``); with
        :meth:`has_result`, every candidate the study holds."""
        with self._lock:
            return {trial_key(t) for n, t in self._open.items() if n != exclude}

    def has_result(self, key: Key) -> bool:
        """Whether a trial holds the candidate's own result."""
        return key in self._holders

    def evaluated(self, key: Key) -> FrozenTrial | None:
        """The first trial that holds the candidate's own result."""
        with self._lock:
            return self._first.get(key)

    def proposed(self) -> tuple[dict[int, FrozenTrial], dict[int, FrozenTrial]]:
        """The trials that say where their candidate came from (:attr:`TrialRecord.proposed_by`):
        those holding their own result, and those running or queued, by number."""
        with self._lock:
            held = {n: self._trials[n] for n in sorted(self._own) if TrialRecord(self._trials[n]).proposed_by}
            waiting = {n: t for n, t in sorted(self._open.items()) if TrialRecord(t).proposed_by}
            return held, waiting

    def refusal_causes(self) -> list[Key]:
        """The settings that the candidates the engine refused with one same error all share, where
        no candidate it ran has them (:func:`refusal_causes`)."""
        with self._lock:
            if self._causes is None:
                self._causes = refusal_causes(self.refused, self.ran)
            return self._causes

    def running(self, before: int | None = None) -> list[FrozenTrial]:
        """The running trials (numbered below ``before``)."""
        with self._lock:
            return [
                t for n, t in self._open.items() if (before is None or n < before) and t.state is TrialState.RUNNING
            ]

    def counts(self) -> tuple[int, int, int]:
        """Trials holding their own result (what counts towards ``--n-trials``), running, and waiting."""
        with self._lock:
            states = Counter(t.state for t in self._open.values())
            return len(self._own), states[TrialState.RUNNING], states[TrialState.WAITING]

    def longest_recent_s(self) -> float:
        """How long the next trial may take: the longest of the last evaluated ones, one-off work left
        out (0 before any)."""
        with self._lock:
            return max(self._spans, default=0.0)
