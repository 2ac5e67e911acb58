"""The search's sampler, chosen by name (:func:`make_sampler`), wrapped so that it never proposes a
candidate the study already holds, nor a known failing one.

Optuna's samplers propose configurations already tried, often, in small categorical spaces, and
a failed trial teaches them little. :class:`FreshSampler` wraps any Optuna sampler: it asks the
wrapped sampler for a whole candidate (its relative proposal, completed knob by knob in the order
of the space, as Optuna itself would; a knob with one value takes it without a fit). Where the
study holds that candidate (evaluated, being evaluated or queued), it shares the graph transform
of a candidate whose transform failed, or it holds the settings that the candidates the engine
refused with one same error all share (and no candidate it ran has: their likely cause), the
nearest candidate no trial holds is taken instead: one knob changed, else (a space small enough
to list, :mod:`coverage`) the fewest knobs changed, else random candidates. A space with
screened knobs (TensorRT's build routes) has them screened first, every other candidate a screen
route, and then searched as far as the screen kept them (:mod:`~gpt_optuna.search.route_plan`).
The wrapped sampler is asked once a trial (its fit grows with the study, and a second answer
costs a second fit; on the replayed landscapes, asking again did not find the best sooner). A
listed space whose every candidate is held is covered: :meth:`FreshSampler.covered` says so before a trial
starts, and the search ends there.

What the study holds is read once per trial, through Optuna's own per-trial cache of the study's
trials (the one its samplers share), into a :class:`~gpt_optuna.search.ledger.StudyLedger`.

Several threads may sample at once (parallel workers): a proposal is reserved until its trial
ends, so that a second thread never proposes it while the first has not yet stored its params.
"""

from __future__ import annotations

import random
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial, TrialState

from gpt_optuna.core.errors import MissingDependencyError
from gpt_optuna.core.space import Candidate, Space
from gpt_optuna.graph.transforms import is_transform_knob
from gpt_optuna.search.coverage import Coverage
from gpt_optuna.search.ledger import Key, StudyLedger, key_of
from gpt_optuna.search.route_plan import SCREEN, RoutePlan
from gpt_optuna.study.optuna_internals import shared_trials
from gpt_optuna.study.trial_record import TrialRecord

RANDOM_TRIES = 200
"""Random candidates tried, in a space too large to list, before accepting a repeat."""
SOURCES = (SCREEN, "sampler", "neighbour", "nearest", "random", "repeat")
"""Where a proposal came from: the build-route screen (:mod:`~gpt_optuna.search.route_plan`), the
wrapped sampler, one knob changed, the fewest knobs changed (a listed space), a random candidate,
or a candidate the study holds (a covered space)."""


class FreshSampler(BaseSampler):
    """Wraps ``base`` so that each trial gets a candidate not seen in the study.

    ``transform_knobs`` names the knobs that decide a candidate's graph transform: a trial whose
    transform failed rules out every candidate with the same values of those knobs. ``ledger``
    holds what the study's trials hold.
    """

    def __init__(self, base: BaseSampler, space: Space, transform_knobs: Callable[[str], bool], seed: int | None):
        self.base = base
        self.space = space
        self._transform_knob = transform_knobs
        self._rng = random.Random(seed)
        self._lock = threading.RLock()  # the budget reads into the ledger from other lanes' threads
        self._reserved: dict[int, Key] = {}
        self.ledger = StudyLedger()
        self._failed_transforms: set[Key] = set()
        self._transforms_read = 0
        self.coverage = Coverage(space, self.ledger, self._ruled_out)
        self.sources: dict[int, str] = {}
        """Where each trial's candidate came from (:data:`SOURCES`), until the trial ends."""
        self.routes = RoutePlan(space, seed)
        """The screened knobs' values tried, as the screen has found them."""

    def reseed_rng(self) -> None:
        self.base.reseed_rng()
        self._rng.seed()

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return {k.name: CategoricalDistribution(k.choices) for k in self.space.knobs}

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if TrialRecord(trial).enqueued:  # an enqueued candidate: it is what it is
            return {}
        with self._lock:
            self.read(shared_trials(study))  # the read the wrapped sampler shares
            self.routes.update(self.ledger, self.sources)
            proposal, source = self._propose(study, trial)
            self.sources[trial.number] = source
            self._reserved[trial.number] = key_of(proposal)
            return proposal

    def read(self, trials: Sequence[FrozenTrial]) -> None:
        """Fold a read of the study's trials into the ledger and the coverage."""
        with self._lock:
            self.ledger.update(trials)
            self._catch_up()

    def _catch_up(self) -> None:
        """Bring the failed transforms and the coverage up to the ledger."""
        failures = self.ledger.transform_failures
        self._failed_transforms.update(self._transform_of(dict(key)) for key in failures[self._transforms_read :])
        self._transforms_read = len(failures)
        self.coverage.sync(self.ledger.rules)

    def covered(self) -> bool:
        """Whether no candidate is left to propose (in a listed space: every one held, running,
        queued or ruled out), as of the ledger's last read."""
        with self._lock:
            self._catch_up()
            return self.coverage.left(self._busy(None)) == 0

    def _busy(self, number: int | None) -> set[Key]:
        """The candidates running, queued or reserved by another thread (other than trial ``number``)."""
        return self.ledger.taken(number) | {key for n, key in self._reserved.items() if n != number}

    def _ruled_out(self, key: Key) -> bool:
        """Whether a candidate shares a failed transform or holds the likely cause of a refusal."""
        return self._transform_of(dict(key)) in self._failed_transforms or any(
            cause <= key for cause in self.ledger.refusal_causes()
        )

    def _propose(self, study: optuna.Study, trial: FrozenTrial) -> tuple[Candidate, str]:
        busy = self._busy(trial.number)
        suggested = dict(trial.params)  # single-valued knobs, or a retried trial's whole candidate

        def fits(candidate: Candidate) -> bool:
            return self._searched(candidate, suggested) and all(candidate.get(k) == v for k, v in suggested.items())

        def fresh(candidate: Candidate) -> bool:
            return new(candidate) and fits(candidate)

        def new(candidate: Candidate) -> bool:
            key = key_of(candidate)
            return not self.ledger.has_result(key) and key not in busy and not self._ruled_out(key)

        if self.routes.wants_screen(suggested):
            route = self.routes.screen_candidate(lambda c: not new(c), suggested)
            if new(route):
                return route, SCREEN
        first = self._ask(study, trial, suggested)  # once: a second answer costs a second fit
        if fresh(first):
            return first, "sampler"
        neighbour = next((c for c in self._neighbours(first, suggested) if fresh(c)), None)
        if neighbour is not None:
            return neighbour, "neighbour"
        if self.coverage.listed:
            nearest = self.coverage.nearest(first, busy, fits, self._rng)
            if nearest is not None:
                return nearest, "nearest"
        else:
            found = next((c for c in (self._complete(suggested) for _ in range(RANDOM_TRIES)) if fresh(c)), None)
            if found is not None:
                return found, "random"
        return (first if fits(first) else self.space.default(suggested)), "repeat"  # a covered space

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
            self.sources.pop(trial.number, None)
        self.base.after_trial(study, trial, state, values)

    def _ask(self, study: optuna.Study, trial: FrozenTrial, suggested: Candidate) -> Candidate:
        """One whole proposal of the wrapped sampler, as Optuna would assemble it around the
        values the trial already holds (a knob the search tries one value of takes it, unasked)."""
        relative_space = self.base.infer_relative_search_space(study, trial)
        relative = self.base.sample_relative(study, trial, relative_space)
        candidate: Candidate = {}
        for knob in self.space.knobs:
            if not knob.active(candidate):
                continue
            tried = self.routes.choices(knob)
            if knob.name in suggested:
                candidate[knob.name] = suggested[knob.name]
            elif len(tried) == 1:
                candidate[knob.name] = tried[0]
            elif knob.name in relative and knob.name in relative_space:
                candidate[knob.name] = relative[knob.name]
            else:
                distribution = CategoricalDistribution(knob.choices)
                candidate[knob.name] = self.base.sample_independent(study, trial, knob.name, distribution)
        return candidate

    def _searched(self, candidate: Candidate, suggested: Candidate) -> bool:
        """Whether every value the sampler chose is one the search tries (a ``[space]`` restriction
        keeps the engine's default among the choices for the baseline only)."""
        return all(
            candidate[k.name] in self.routes.choices(k)
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
                    for v in self.routes.choices(knob)
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
                    partial[knob.name] if knob.name in partial else self._rng.choice(self.routes.choices(knob))
                )
        return candidate


def make_sampler(name: str, seed: int | None, space: Space) -> FreshSampler:
    """TPE (multivariate, few start-up trials) by default; it handles several objectives too.

    Whichever it is, it proposes only candidates the study does not hold yet (:class:`FreshSampler`),
    reading the study into its ledger.
    """
    return FreshSampler(base_sampler(name, seed), space, is_transform_knob, seed)


def check_sampler(name: str) -> None:
    """A MissingDependencyError where the sampler needs a library that is not installed (GPSampler
    fits with PyTorch and SciPy), found without importing it."""
    import importlib.util

    if name == "gp":
        for module, library in (("torch", "PyTorch"), ("scipy", "SciPy")):
            if importlib.util.find_spec(module) is None:
                raise MissingDependencyError(f"{library} (needed by the GP sampler)", "gp")


def base_sampler(name: str, seed: int | None) -> optuna.samplers.BaseSampler:
    """The Optuna sampler of that name, as the search configures it."""
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
