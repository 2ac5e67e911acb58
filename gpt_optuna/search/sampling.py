"""The search's sampler, chosen by name (:func:`make_sampler`), wrapped so that it never proposes a
candidate the study already holds, nor a known failing one.

Optuna's samplers propose configurations already tried, often, in small categorical spaces, and
a failed trial teaches them little. :class:`FreshSampler` wraps any Optuna sampler: it lets the
wrapped sampler propose a whole candidate (its relative proposal, completed knob by knob in the
order of the space, as Optuna itself would), and when that candidate was evaluated, is being
evaluated or waits in the queue, shares the graph transform of a candidate whose transform
failed, or holds the settings that the candidates the engine refused with one same error all
share (and no candidate it ran has: their likely cause), it asks again; then tries the
proposal's neighbours (one knob changed), then random candidates. Only when none is fresh (a
covered space) does the wrapped proposal stand, and the objective reuses the earlier result.

Several threads may sample at once (parallel workers): a proposal is reserved until its trial
ends, so that a second thread never proposes it while the first has not yet stored its params.
"""

from __future__ import annotations

import random
import threading
import warnings
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial, TrialState

from gpt_optuna.core.errors import MissingDependencyError
from gpt_optuna.core.space import Candidate, Space
from gpt_optuna.graph.transforms import is_transform_knob
from gpt_optuna.study.taxonomy import is_interrupted, retried_numbers, trial_status

ASKS = 4
"""Proposals asked of the wrapped sampler before looking elsewhere."""
RANDOM_TRIES = 200
"""Random candidates tried before accepting a repeat."""


Key = frozenset[tuple[str, Any]]


def _key(candidate: Candidate) -> Key:
    return frozenset(candidate.items())


def refusal_causes(refused: Mapping[str, list[Key]], ran: list[Key]) -> list[Key]:
    """Per error the engine refused two or more candidates with, the settings they all share,
    where no candidate the engine ran has them all: a candidate holding them would be refused too."""
    causes = []
    for candidates in refused.values():
        shared = frozenset.intersection(*candidates) if len(candidates) > 1 else frozenset()
        if shared and not any(shared <= other for other in ran):
            causes.append(shared)
    return causes


class FreshSampler(BaseSampler):
    """Wraps ``base`` so that each trial gets a candidate not seen in the study.

    ``transform_knobs`` names the knobs that decide a candidate's graph transform: a trial whose
    transform failed rules out every candidate with the same values of those knobs.
    """

    def __init__(self, base: BaseSampler, space: Space, transform_knobs: Callable[[str], bool], seed: int | None):
        self.base = base
        self.space = space
        self._transform_knob = transform_knobs
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._reserved: dict[int, Key] = {}

    def reseed_rng(self) -> None:
        self.base.reseed_rng()
        self._rng.seed()

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return {k.name: CategoricalDistribution(k.choices) for k in self.space.knobs}

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if "fixed_params" in trial.system_attrs:  # an enqueued candidate: it is what it is
            return {}
        with self._lock:
            proposal = self._propose(study, trial)
            self._reserved[trial.number] = _key(proposal)
            return proposal

    def _propose(self, study: optuna.Study, trial: FrozenTrial) -> Candidate:
        taken, failed_transforms, causes = self._seen(study, trial.number)
        taken |= {key for number, key in self._reserved.items() if number != trial.number}
        suggested = dict(trial.params)  # single-valued knobs, or a retried trial's whole candidate

        def fresh(candidate: Candidate) -> bool:
            key = _key(candidate)
            return (
                key not in taken
                and self._transform_of(candidate) not in failed_transforms
                and not any(cause <= key for cause in causes)
                and self._searched(candidate, suggested)
            )

        first = proposal = self._ask(study, trial, suggested)
        for _ in range(ASKS - 1):
            if fresh(proposal):
                return proposal
            proposal = self._ask(study, trial, suggested)
        if fresh(proposal):
            return proposal
        others = [*self._neighbours(first, suggested), *(self._complete(suggested) for _ in range(RANDOM_TRIES))]
        repeat = next((c for c in [first, *others] if self._searched(c, suggested)), first)  # a covered space
        return next((candidate for candidate in others if fresh(candidate)), repeat)

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        return self.base.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.base.before_trial(study, trial)

    def after_trial(
        self, study: optuna.Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None
    ) -> None:
        with self._lock:
            self._reserved.pop(trial.number, None)
        self.base.after_trial(study, trial, state, values)

    def _ask(self, study: optuna.Study, trial: FrozenTrial, suggested: Candidate) -> Candidate:
        """One whole proposal of the wrapped sampler, as Optuna would assemble it around the
        values the trial already holds."""
        relative_space = self.base.infer_relative_search_space(study, trial)
        relative = self.base.sample_relative(study, trial, relative_space)
        candidate: Candidate = {}
        for knob in self.space.knobs:
            if not knob.active(candidate):
                continue
            if knob.name in suggested:
                candidate[knob.name] = suggested[knob.name]
            elif knob.name in relative and knob.name in relative_space:
                candidate[knob.name] = relative[knob.name]
            else:
                distribution = CategoricalDistribution(knob.choices)
                candidate[knob.name] = self.base.sample_independent(study, trial, knob.name, distribution)
        return candidate

    def _seen(self, study: optuna.Study, number: int) -> tuple[set[Key], set[Key], list[Key]]:
        """Candidates the study holds (any state but interrupted), the failed transforms, and the
        causes of the engine's refusals (:func:`refusal_causes`)."""
        taken, failed = set(), set()
        refused: dict[str, list[Key]] = defaultdict(list)
        ran: list[Key] = []
        trials = study.get_trials(deepcopy=False)
        retried = retried_numbers(trials)
        for other in trials:
            if other.number == number or is_interrupted(other, retried):
                continue  # an interrupted trial's retry is queued with the same parameters
            params = other.params or other.system_attrs.get("fixed_params", {})  # queued: not started yet
            taken.add(_key(params))
            outcome = other.user_attrs.get("outcome")
            if outcome == "transform_error":
                failed.add(self._transform_of(params))
            elif outcome == "build_error":
                refused[str(other.user_attrs.get("failure", ""))].append(_key(params))
            elif trial_status(other, retried) in ("feasible", "infeasible"):
                ran.append(_key(params))
        return taken, failed, refusal_causes(refused, ran)

    def _searched(self, candidate: Candidate, suggested: Candidate) -> bool:
        """Whether every value the sampler chose is one the search tries (a ``[space]`` restriction
        keeps the engine's default among the choices for the baseline only)."""
        return all(
            candidate[k.name] in k.search_choices
            for k in self.space.knobs
            if k.name in candidate and k.name not in suggested
        )

    def _transform_of(self, candidate: Candidate) -> Key:
        return frozenset((k, v) for k, v in candidate.items() if self._transform_knob(k))

    def _neighbours(self, candidate: Candidate, suggested: Candidate) -> list[Candidate]:
        """Candidates that differ from ``candidate`` in one knob not yet suggested (knobs that
        this makes active take random values)."""
        found = []
        for knob in self.space.knobs:
            if knob.name in candidate and knob.name not in suggested:
                found += [
                    self._complete({**candidate, knob.name: v})
                    for v in knob.search_choices
                    if v != candidate[knob.name]
                ]
        self._rng.shuffle(found)
        return found

    def _complete(self, partial: Candidate) -> Candidate:
        """The active knobs at ``partial``'s values, the others at random values."""
        candidate: Candidate = {}
        for knob in self.space.knobs:
            if knob.active(candidate):
                candidate[knob.name] = (
                    partial[knob.name] if knob.name in partial else self._rng.choice(knob.search_choices)
                )
        return candidate


def make_sampler(name: str, seed: int | None, space: Space) -> optuna.samplers.BaseSampler:
    """TPE (multivariate, few start-up trials) by default; it handles several objectives too.

    Whichever it is, it proposes only candidates the study does not hold yet (:class:`FreshSampler`).
    """
    return FreshSampler(_base_sampler(name, seed), space, is_transform_knob, seed)


def check_sampler(name: str) -> None:
    """A MissingDependencyError where the sampler needs a library that is not installed (GPSampler
    fits with PyTorch and SciPy), found without importing it."""
    import importlib.util

    if name == "gp":
        for module, library in (("torch", "PyTorch"), ("scipy", "SciPy")):
            if importlib.util.find_spec(module) is None:
                raise MissingDependencyError(f"{library} (needed by the GP sampler)", "gp")


def _base_sampler(name: str, seed: int | None) -> optuna.samplers.BaseSampler:
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "gp":
        check_sampler(name)
        return optuna.samplers.GPSampler(seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        # constant liar: a running trial counts as a bad result, so parallel workers spread out;
        # two start-up trials (the baseline and the seed, where seeded): on the replayed landscapes
        # five made TPE little better than random order (benchmarks/replay.py, docs/benchmarks.md)
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=2, constant_liar=True)
