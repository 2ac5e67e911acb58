"""The warm start's candidates queued one at a time, so that an earlier study whose configuration
loses here stops giving any, and one whose configuration wins gives the rest it holds back.

The best configurations of earlier studies (:func:`gpt_optuna.search.seeds.warm_start`, ranked)
are tried right after the baseline and the seeds, one after another: each is queued once the one
before it has ended. A candidate that loses to this study's baseline (no faster, infeasible, or
not made at all) shows that its study's findings do not carry over to this model, and the rest of
that study's candidates are not tried; the search samples instead. So does one that wins by less
than its gain in its own study asks for (more of it from a study of a more alike model:
:data:`~gpt_optuna.search.seeds.REPLICATION`). One that beats the baseline by as much shows that
they do carry over: the candidates its study held back (a study of a less alike model offers
fewer at first) are tried next. A resumed study goes on where its runs left: what they tried is
judged again and not queued twice. Nothing is queued once the search has no room for another
trial.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

import optuna
from optuna.trial import FrozenTrial, TrialState

from gpt_optuna.core.space import Candidate, CandidateKey, candidate_key
from gpt_optuna.search.seeds import WARM_LIMIT, WarmStart
from gpt_optuna.study.taxonomy import baseline_trial, is_interrupted, retried_numbers
from gpt_optuna.study.trial_record import WARM_START_ATTR, TrialRecord, source_study


class TransferQueue:
    """The warm-start candidates (ranked, each with its ``STUDY:TRIAL``) not yet queued, those each
    earlier study holds back until one of its candidates wins here (``reserve``), which earlier
    studies offered each configuration (``offered_by``: a win or a loss counts for each of them),
    the studies whose candidate won here and those stopped because one lost. ``room`` says
    whether the search will start another trial; ``note`` is told when a study is stopped with
    candidates left, or gives the ones it held back. At most :data:`WARM_LIMIT` distinct
    candidates are tried in all."""

    def __init__(
        self,
        candidates: list[tuple[Candidate, str]],
        room: Callable[[], bool] = lambda: True,
        note: Callable[[str], None] = lambda _: None,
        reserve: Mapping[str, list[tuple[Candidate, str]]] | None = None,
        offered_by: Mapping[CandidateKey, tuple[str, ...]] | None = None,
        expected: Mapping[str, float] | None = None,
        trust: Mapping[str, float] | None = None,
    ) -> None:
        self.pending = list(candidates)
        self.reserve = {name: list(rest) for name, rest in (reserve or {}).items()}
        self.offered_by = dict(offered_by or {})
        self.expected = dict(expected or {})
        self.trust = dict(trust or {})
        self.room = room
        self.note = note
        self.won: list[str] = []
        """Earlier studies whose candidate beat the baseline here, in that order."""
        self.stopped: dict[str, str] = {}
        """Earlier study -> the source of its candidate that lost here."""
        self._lock = threading.Lock()

    @classmethod
    def of(
        cls, warm: WarmStart, room: Callable[[], bool] = lambda: True, note: Callable[[str], None] = lambda _: None
    ) -> TransferQueue:
        """The queue of a warm start's candidates."""
        return cls(warm.candidates, room, note, warm.reserve, warm.offered_by, warm.expected, warm.trust)

    def update(self, study: optuna.Study, _ended: FrozenTrial | None = None) -> None:
        """Judge the warm-start candidates that ended (in any process), and queue the next one
        where none is waiting or running. Called as the search starts and as each trial ends; once
        no candidate is left to queue, it reads nothing."""
        with self._lock:
            if not self.pending and not any(self.reserve.values()):  # nothing left to judge a result for
                return
            trials = study.get_trials(deepcopy=False)
            self._drop_tried(trials)
            retried = retried_numbers(trials)
            baseline = baseline_trial(trials)
            base = None if baseline is None else TrialRecord(baseline).latency_ms
            warm = [t for t in trials if TrialRecord(t).warm_start_from is not None]
            room = WARM_LIMIT - len({TrialRecord(t).warm_start_from for t in warm})  # a retry is the same one
            for trial in warm:
                self._judge(trial, base, retried, room)
            if room > 0 and not any(t.state in (TrialState.WAITING, TrialState.RUNNING) for t in warm):
                self._queue_next(study)

    def _judge(self, trial: FrozenTrial, base: float | None, retried: set[int], room: int) -> None:
        """Where ``trial`` holds its result: if it lost to the baseline (its latency ``base``, None
        while unmeasured), stop each study that offered it; if it beat it, the candidates they held
        back come next (``room``: how many more the limit leaves)."""
        if trial.state in (TrialState.WAITING, TrialState.RUNNING) or is_interrupted(trial, retried):
            return  # no result yet: a retry will have one
        ms = TrialRecord(trial).latency_ms if trial.state is TrialState.COMPLETE else None
        lost = trial.state is not TrialState.COMPLETE or (base is not None and ms is not None and ms >= base)
        if not lost and (base is None or ms is None):
            return  # judged once the baseline is measured
        source = str(TrialRecord(trial).warm_start_from)
        gain, expected = (base / ms if base and ms else 0.0), self.expected.get(source, 1.0)
        if lost:
            why = "lost to the baseline here"
        elif gain < expected:  # it wins, but its study's findings do not carry over as far as they should
            why = f"gained {gain:.2f}x here, under the {expected:.2f}x its gain in its study asks for"
        else:
            why = ""
        for study in self.studies(trial.params, source):
            if study in self.stopped or (not why and study in self.won):
                continue
            if why:
                self._stop(study, source, why)
            else:
                self._follow(study, source, room)

    def _stop(self, study: str, source: str, why: str) -> None:
        """Stop ``study``, whose candidate ``source`` did not carry over (``why``): said where it held more."""
        self.stopped[study] = source
        left = sum(1 for c, other in self.pending if study in self.studies(c, other) and self._given_up(c, other))
        left += len(self.reserve.pop(study, []))
        if left:
            rest = f"the other {left} of {study} {'is' if left == 1 else 'are'} not tried"
            self.note(f"warm start: {source} {why}; {rest}")

    def _follow(self, study: str, source: str, room: int) -> None:
        """Let the candidates ``study`` held back follow, its ``source`` having beaten the baseline."""
        self.won.append(study)
        given = min(len(self.reserve.get(study, [])), room)
        if given:
            follow = "follows" if given == 1 else "follow"
            self.note(f"warm start: {source} beat the baseline here; {given} more of {study} {follow}")

    def _drop_tried(self, trials: list[FrozenTrial]) -> None:
        """Forget the candidates the study holds already (tried, or the same configuration)."""
        there = {candidate_key(TrialRecord(t).candidate) for t in trials}
        tried = {source for t in trials if (source := TrialRecord(t).warm_start_from) is not None}

        def left(candidates: list[tuple[Candidate, str]]) -> list[tuple[Candidate, str]]:
            return [(c, s) for c, s in candidates if s not in tried and candidate_key(c) not in there]

        self.pending = left(self.pending)
        self.reserve = {name: left(held) for name, held in self.reserve.items()}

    def studies(self, candidate: Candidate, source: str) -> tuple[str, ...]:
        """The earlier studies that offered ``candidate`` (its ``source``'s where none is known)."""
        return self.offered_by.get(candidate_key(candidate), ()) or (source_study(source),)

    def _given_up(self, candidate: Candidate, source: str) -> bool:
        """Whether every study that offered ``candidate`` is stopped: it is not tried."""
        return all(name in self.stopped for name in self.studies(candidate, source))

    def _queue_next(self, study: optuna.Study) -> None:
        """Queue the next candidate: of those left from a study not stopped and those the studies
        that won here held back, the most trusted (``trust``), what was held back first among equals."""
        self.pending = [(c, s) for c, s in self.pending if not self._given_up(c, s)]
        released = [held for name in self.won for held in self.reserve.get(name, [])]
        line = sorted(released + self.pending, key=lambda offer: -self.trust.get(offer[1], 0.0))
        if line and self.room():
            candidate, source = line[0]
            for held in (self.pending, *self.reserve.values()):
                if line[0] in held:
                    held.remove(line[0])
            study.enqueue_trial(candidate, user_attrs={WARM_START_ATTR: source})
