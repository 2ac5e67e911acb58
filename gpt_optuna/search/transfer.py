"""The warm start's candidates queued one at a time, so that an earlier study whose configuration
loses here stops giving any, and one whose configuration wins gives the rest it holds back.

The best configurations of earlier studies (:func:`gpt_optuna.search.seeds.warm_start`, ranked)
are tried right after the baseline and the seeds, one after another: each is queued once the one
before it has ended. A candidate that loses to this study's baseline (no faster, infeasible, or
not made at all) shows that its study's findings do not carry over to this model, and the rest of
that study's candidates are not tried; the search samples instead. One that beats the baseline
shows that they do: the candidates its study held back (a study of a less alike model offers
fewer at first) are tried next. A resumed study goes on where its runs left: what they tried is
judged again and not queued twice. Nothing is queued once the search has no room for another
trial.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

import optuna
from optuna.trial import FrozenTrial, TrialState

from gpt_optuna.core.space import Candidate, candidate_key
from gpt_optuna.search.seeds import WARM_LIMIT
from gpt_optuna.study.record import WARM_START_ATTR, source_study
from gpt_optuna.study.taxonomy import baseline_trial, is_interrupted, measured_latency_ms, retried_numbers


class TransferQueue:
    """The warm-start candidates (ranked, each with its ``STUDY:TRIAL``) not yet queued, those each
    earlier study holds back until one of its candidates wins here (``reserve``), and the earlier
    studies stopped because one of their candidates lost here. ``room`` says whether the search
    will start another trial; ``note`` is told when a study is stopped with candidates left, or
    gives the ones it held back. At most :data:`WARM_LIMIT` candidates are tried in all."""

    def __init__(
        self,
        candidates: list[tuple[Candidate, str]],
        room: Callable[[], bool] = lambda: True,
        note: Callable[[str], None] = lambda _: None,
        reserve: Mapping[str, list[tuple[Candidate, str]]] | None = None,
    ) -> None:
        self.pending = list(candidates)
        self.reserve = {name: list(rest) for name, rest in (reserve or {}).items()}
        self.room = room
        self.note = note
        self.stopped: dict[str, str] = {}
        """Earlier study -> the source of its candidate that lost here."""
        self._lock = threading.Lock()

    def update(self, study: optuna.Study, _ended: FrozenTrial | None = None) -> None:
        """Judge the warm-start candidates that ended (in any process), and queue the next one
        where none is waiting or running. Called as the search starts and as each trial ends."""
        with self._lock:
            trials = study.get_trials(deepcopy=False)
            self._drop_tried(trials)
            retried = retried_numbers(trials)
            baseline = baseline_trial(trials)
            base = None if baseline is None else measured_latency_ms(baseline)
            warm = [t for t in trials if WARM_START_ATTR in t.user_attrs]
            for trial in warm:
                self._judge(trial, base, retried, len(warm))
            if not any(t.state in (TrialState.WAITING, TrialState.RUNNING) for t in warm):
                self._queue_next(study)

    def _judge(self, trial: FrozenTrial, base: float | None, retried: set[int], tried: int) -> None:
        """Where ``trial`` holds its result: if it lost to the baseline (its latency ``base``, None
        while unmeasured), stop its study; if it beat it, give the candidates its study held back,
        as many as the limit leaves (``tried``: the warm-start trials so far)."""
        if trial.state in (TrialState.WAITING, TrialState.RUNNING) or is_interrupted(trial, retried):
            return  # no result yet: a retry will have one
        ms = measured_latency_ms(trial) if trial.state is TrialState.COMPLETE else None
        lost = trial.state is not TrialState.COMPLETE or (base is not None and ms is not None and ms >= base)
        source = str(trial.user_attrs[WARM_START_ATTR])
        if not lost:
            if base is not None and ms is not None:  # it beat the baseline
                self._release(source, tried)
            return
        study = source_study(source)
        if study not in self.stopped:
            self.stopped[study] = source
            left = sum(1 for _, other in self.pending if source_study(other) == study)
            left += len(self.reserve.pop(study, []))
            if left:
                are = "is" if left == 1 else "are"
                self.note(
                    f"warm start: {source} lost to the baseline here; the other {left} of {study} {are} not tried"
                )

    def _release(self, source: str, tried: int) -> None:
        """Give the candidates the study of ``source`` held back, next in line."""
        held = self.reserve.pop(source_study(source), None)
        if not held:
            return
        given = held[: max(0, WARM_LIMIT - tried - len(self.pending))]
        self.pending[:0] = given
        if given:
            self.note(
                f"warm start: {source} beat the baseline here; {len(given)} more of {source_study(source)} follow"
            )

    def _drop_tried(self, trials: list[FrozenTrial]) -> None:
        """Forget the candidates the study holds already (tried, or the same configuration)."""
        there = {candidate_key(t.params or t.system_attrs.get("fixed_params", {})) for t in trials}
        tried = {t.user_attrs[WARM_START_ATTR] for t in trials if WARM_START_ATTR in t.user_attrs}
        self.pending = [(c, s) for c, s in self.pending if s not in tried and candidate_key(c) not in there]
        self.reserve = {
            name: [(c, s) for c, s in held if s not in tried and candidate_key(c) not in there]
            for name, held in self.reserve.items()
        }

    def _queue_next(self, study: optuna.Study) -> None:
        """Queue the best candidate left from a study not stopped."""
        self.pending = [(c, s) for c, s in self.pending if source_study(s) not in self.stopped]
        if self.pending and self.room():
            candidate, source = self.pending.pop(0)
            study.enqueue_trial(candidate, user_attrs={WARM_START_ATTR: source})
