"""A search's screened knobs (TensorRT 11.1+'s build routes): screened first for the few that change
latency, then searched beside the other knobs.

The screened knobs (:attr:`~gpt_optuna.core.space.Knob.screened`) are too many to search as
dimensions of their own, and few of them matter. Until the screen is over
(:func:`~gpt_optuna.search.route_screen.progress`), screen routes and the sampler's own
candidates take turns: a screen route is the settings the search tries first (where the knobs
apply) with the route :func:`~gpt_optuna.search.route_screen.next_route` gives; the sampler's own
candidates keep every screened knob at its default meanwhile. Once it is over, the search tries the kept knobs' values
beside the other knobs, and the other screened knobs stay at their defaults. The screen is read
from the study's trials (those proposed by :data:`SCREEN`, in number order), so a resumed or
joined search finds it where it stood.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
from optuna.trial import FrozenTrial

from gpt_optuna.core.log import LOGGER
from gpt_optuna.core.space import Candidate, Knob, Space, Value
from gpt_optuna.search.ledger import StudyLedger
from gpt_optuna.search.route_screen import (
    FitCache,
    Progress,
    Route,
    RouteKnobValues,
    build_cap,
    first_batch,
    fit,
    next_route,
    progress,
)
from gpt_optuna.study.taxonomy import trial_status
from gpt_optuna.study.trial_record import TrialRecord

SCREEN = "screen"
"""The source (``proposed_by``) of a screen route's trial."""
NOISE_FLOOR = 0.005
"""The least relative spread a build's latency is taken to have: a measurement's own confidence
interval leaves out how builds of one route differ."""
MEASURED = ("feasible", "infeasible")
"""The trials whose latency a fit takes (:func:`~gpt_optuna.study.taxonomy.trial_status`): an
engine that built and ran."""


def _screened(space: Space) -> list[Knob]:
    """The knobs screened: marked so, with values to try, and not restricted by ``[space]`` (the
    values a user lists are searched as they are)."""
    return [k for k in space.knobs if k.screened and k.searched is None and len(k.choices) > 1]


class RoutePlan:
    """Which values of the screened knobs the search tries, and the screen's next route."""

    def __init__(self, space: Space, seed: int | None) -> None:
        self.space = space
        knobs = _screened(space)
        self.knobs = [RouteKnobValues(k.name, tuple(str(v) for v in (k.default, *_others(k)))) for k in knobs]
        self._values = {k.name: {str(v): v for v in k.choices} for k in knobs}
        self._defaults = {k.name: k.default for k in knobs}
        self._base = {
            k.name: k.default if k.default in k.search_choices else k.search_choices[0]
            for k in space.knobs
            if k.name not in self._values
        }
        """The screen's other settings: each knob's default where the search tries it, else the
        first value it tries (a ``[space]`` list without the default)."""
        self._where = _conditions_met(knobs[0]) if knobs else {}
        self._rng = np.random.default_rng(seed)
        self._fits: FitCache = {}
        self.state = Progress(None, False)
        self.screens = 0
        """The screen's trials: measured, failed, running, queued or being proposed."""
        self.sampled = 0
        """The trials the sampler proposed otherwise, as counted in :attr:`screens`."""
        self._told = False

    def update(self, ledger: StudyLedger, proposing: Mapping[int, str]) -> None:
        """Read the screen's trials: the fit of those measured, in number order, up to the first
        still running (a trial that ends late does not change a fit already made). ``proposing``:
        the source of each trial this process proposed whose source the study may not hold yet.
        The screen is over too where its every build ended and it may make no more (the fit of
        what was measured), or where its first batch measured nothing (a dry run, or a route
        every build of which fails): it has nothing to learn from."""
        if not self.knobs:
            return
        held, waiting = ledger.proposed()
        sources = {n: str(TrialRecord(t).proposed_by) for n, t in (*held.items(), *waiting.items())}
        sources.update(proposing)
        self.screens = sum(source == SCREEN for source in sources.values())
        self.sampled = len(sources) - self.screens
        open_screens = [n for n, source in sources.items() if source == SCREEN and n not in held]
        measured, spreads = self._measured(held, min(open_screens, default=None))
        first = spreads[: first_batch(self.knobs)]  # fixed once measured: a fit made stays made
        noise = max(NOISE_FLOOR, float(np.median(first)) if first else 0.0)
        self.state = progress(self.knobs, measured, noise, self._fits)
        if not self.state.done and not open_screens:
            self._end_without_more(measured, noise)
        if self.state.done and not self._told:
            self._told = True
            LOGGER.info(self.summary(len(measured)))

    def _measured(
        self, held: Mapping[int, FrozenTrial], before: int | None
    ) -> tuple[list[tuple[Route, float]], list[float]]:
        """The screen's measured routes with their latencies, in number order up to trial ``before``
        (None: every one), and each one's spread (its interval's half width over 1.96)."""
        measured: list[tuple[Route, float]] = []
        spreads = []
        for number, trial in held.items():
            record = TrialRecord(trial)
            if record.proposed_by != SCREEN:
                continue
            if before is not None and number > before:
                break
            if trial_status(trial) in MEASURED and record.latency_ms:
                # the route as the screen writes routes: its knobs at their defaults left out
                route = {k: str(v) for k, v in trial.params.items() if k in self._values and v != self._defaults[k]}
                measured.append((route, record.latency_ms))
                spreads.append(record.latency_rel_ci / 1.96)
        return measured, spreads

    def _end_without_more(self, measured: list[tuple[Route, float]], noise: float) -> None:
        """End the screen, none of whose builds is open, where it may make no more (the fit of what
        was measured) or its first batch measured nothing."""
        ended = self.screens
        if ended >= build_cap(self.knobs):
            found = fit(self.knobs, [r for r, _ in measured], [t for _, t in measured], noise) if measured else None
            self.state = Progress(found, True)
        elif ended >= first_batch(self.knobs) and not measured:
            self.state = Progress(None, True)

    def summary(self, builds: int) -> str:
        """One line on what the screen found."""
        found = self.state.found
        if found is None or not found.effects:
            return f"route screen: {builds} builds; no route knob changes latency beyond the noise: all stay at default"
        kept = ", ".join(
            f"{name}={value} {ratio:.3g}x"
            for name, effects in found.effects.items()
            for value, ratio in effects.items()
        )
        return (
            f"route screen: {builds} builds; {len(found.effects)} of {len(self.knobs)} route knobs change latency:"
            f" {kept}; the search now tries their values, the others stay at their defaults"
        )

    def choices(self, knob: Knob) -> tuple[Value, ...]:
        """The values of ``knob`` the sampler's own candidates may take now."""
        if knob.name not in self._values:
            return knob.search_choices
        found = self.state.found
        if not self.state.done or found is None or knob.name not in found.effects:
            return (knob.default,)
        return knob.choices

    def wants_screen(self, fixed: Candidate) -> bool:
        """Whether the next candidate is a screen route: the screen is not over, it has not every
        build it may make under way, it has had no more trials than the sampler's own (so they
        take turns), and the trial holds no values of the screened knobs already (``fixed``)."""
        return (
            bool(self.knobs)
            and not self.state.done
            and self.screens < build_cap(self.knobs)
            and self.screens <= self.sampled
            and not any(name in fixed for name in self._values)
        )

    def screen_candidate(self, taken: Callable[[Candidate], bool], fixed: Candidate) -> Candidate:
        """The screen's next route (:func:`next_route`) as a candidate: the settings the search
        tries first (each knob's default where it is tried) where the screened knobs apply, with
        the values the trial holds already (``fixed``); ``taken``: a candidate the study holds,
        runs or queues."""

        def candidate(route: Route) -> Candidate:
            values = {name: self._values[name][value] for name, value in route.items()}
            return self.space.default({**self._base, **self._where, **fixed, **values})

        return candidate(next_route(self.knobs, self.state.found, lambda r: taken(candidate(r)), self._rng))


def _others(knob: Knob) -> list[Value]:
    return [v for v in knob.choices if v != knob.default]


def _conditions_met(knob: Knob) -> dict[str, Value]:
    """Values of the knobs a screened knob's conditions read that make it apply (the first such):
    the screened knobs of a space share their conditions (TensorRT's routes: its engine chosen)."""
    fixed: dict[str, Value] = {}
    for condition in knob.conditions:
        fixed.update(zip(condition.parents, condition.combos()[0], strict=True))
    return fixed
