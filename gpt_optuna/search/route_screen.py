"""Which of TensorRT's build-route knobs matter, learnt from a few builds instead of one per value.

TensorRT 11.1+ offers about two hundred route knobs (``IBuilderConfig.all_build_routes``), of which
a few change a model's latency. trtexec's Global Performance Tuner sweeps them one value at a time
(``fast``), a build per value, once each. This screen builds random routes instead, every knob at
its default or one of its other values with even odds, and fits log latency to the knobs'
values by forward selection: the knob whose values explain the most of what is left is taken
while its F statistic clears :data:`F_MIN` (a bar for about two hundred knobs tested at once), so a
knob is kept on evidence against the noise, not on one lucky measurement. A fit is made after a
first batch and then every :data:`BATCH` builds, and the fit's fastest routes are built before
more random ones (:func:`next_route`). The screen ends once two fits in a row keep the same
knobs, or at one-at-a-time's count (:func:`build_cap`). The knobs kept, with their fitted effects,
are what a search over routes then searches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

F_MIN = 13.0
"""The F statistic a term must reach to be kept: p of about 0.001 for one value at 30 builds, less
with more. Over a hundred knobs a fit may still keep a knob that does nothing; that costs the
search over the kept knobs routes, not the answer."""
FIRST_BATCH = 32
MIN_FIRST_BATCH = 16
BATCH = 16
MAX_KEPT = 12
"""The most knobs (and, beside them, pairs) a screen keeps: a search over more is no longer small."""


@dataclass(frozen=True)
class RouteKnobValues:
    """A route knob and its values, its default first."""

    name: str
    values: tuple[str, ...]

    @property
    def default(self) -> str:
        return self.values[0]


Route = dict[str, str]
"""A knob's value by knob name; a knob left out is at its default."""
Pair = tuple[tuple[str, str], tuple[str, str]]
"""Two knobs' values, ``((knob, value), (knob, value))``."""


@dataclass(frozen=True)
class Screened:
    """What a screen found: each kept knob's fitted effect of each value against its default, as a
    latency ratio (0.95: 5 % faster), the residual spread of log latency, and the builds it took."""

    effects: dict[str, dict[str, float]]
    residual_sd: float
    builds: int
    pairs: dict[Pair, float] = field(default_factory=dict)
    """Two kept knobs' values that act together: the ratio beyond their own effects."""

    def predicted(self, route: Route) -> float:
        """The fit's latency ratio of ``route`` to the default route."""
        ratio = 1.0
        for knob, value in route.items():
            ratio *= self.effects.get(knob, {}).get(value, 1.0)
        for ((a, va), (b, vb)), effect in self.pairs.items():
            if route.get(a) == va and route.get(b) == vb:
                ratio *= effect
        return ratio


def random_routes(knobs: Sequence[RouteKnobValues], count: int, rng: np.random.Generator) -> list[Route]:
    """``count`` routes with every knob at its default or, with even odds, one of its other values."""
    routes = []
    for _ in range(count):
        route = {}
        for knob in knobs:
            if len(knob.values) > 1 and rng.random() < 0.5:
                route[knob.name] = knob.values[1 + int(rng.integers(len(knob.values) - 1))]
        routes.append(route)
    return routes


def _columns(knob: RouteKnobValues, routes: Sequence[Route]) -> np.ndarray:
    """One indicator column per non-default value of ``knob``."""
    return np.array([[route.get(knob.name) == value for value in knob.values[1:]] for route in routes], float)


def _gains(y: np.ndarray, design: np.ndarray, terms: dict[object, np.ndarray]) -> tuple[float, dict[object, float]]:
    """What ``design`` leaves of ``y`` (its residual sum of squares), and how much of that each
    term's columns would explain beside it."""
    u, singular, _ = np.linalg.svd(design, full_matrices=False)
    q = u[:, singular > 1e-9 * singular[0]]  # a basis of what the design spans (a never-drawn value adds nothing)
    rest = y - q @ (q.T @ y)
    gains = {}
    for key, columns in terms.items():
        apart = columns - q @ (q.T @ columns)
        gains[key] = float(rest @ (apart @ np.linalg.lstsq(apart, rest, rcond=None)[0]))
    return float(rest @ rest), gains


def _f_statistics(
    y: np.ndarray, design: np.ndarray, terms: dict[object, np.ndarray], noise_sd: float
) -> dict[object, tuple[float, int]]:
    """Each term's F statistic for joining ``design`` (against what would be left unexplained, never
    less than the measurement's own spread ``noise_sd``: a term smaller than the noise is not kept
    because a few builds happened to agree), with the degrees of freedom it would leave."""
    rss, gains = _gains(y, design, terms)
    found = {}
    for key, columns in terms.items():
        free = len(y) - design.shape[1] - columns.shape[1]
        rest = max((rss - gains[key]) / max(free, 1), noise_sd**2, 1e-18)
        found[key] = ((gains[key] / columns.shape[1]) / rest, free)
    return found


LOOKAHEAD = 8
"""Where no term alone clears the bar, the pairs of the terms this many best alone are tried together:
two large effects drawn together in a few builds can hide each other."""


def _forward(
    y: np.ndarray, design: np.ndarray, terms: dict[object, np.ndarray], limit: int, noise_sd: float
) -> tuple[list[tuple[object, int]], np.ndarray]:
    """Terms (groups of columns) added to ``design`` one at a time, the one whose columns explain
    most of what is left first, while its F statistic reaches :data:`F_MIN` (:func:`_f_statistics`),
    else two together where a pair of the :data:`LOOKAHEAD` best does; at most ``limit``; each
    term with where its columns start, and the design grown."""
    chosen: list[tuple[object, int]] = []
    left = dict(terms)
    while len(chosen) < limit and left:
        f = _f_statistics(y, design, left, noise_sd)
        ranked = sorted(left, key=lambda key: -f[key][0])
        taken = [ranked[0]] if f[ranked[0]][1] >= 2 and f[ranked[0]][0] >= F_MIN else []
        if not taken and len(chosen) + 2 <= limit:
            best = ranked[:LOOKAHEAD]
            pairs = {(a, b): np.hstack([left[a], left[b]]) for i, a in enumerate(best) for b in best[i + 1 :]}
            joint = _f_statistics(y, design, pairs, noise_sd) if pairs else {}
            pair = max(joint, key=lambda key: joint[key][0], default=None)
            if pair is not None and joint[pair][1] >= 2 and joint[pair][0] >= F_MIN:
                taken = list(pair)  # type: ignore[arg-type]
        if not taken:
            break
        for key in taken:
            chosen.append((key, design.shape[1]))
            design = np.hstack([design, left.pop(key)])
    return chosen, design


def fit(
    knobs: Sequence[RouteKnobValues], routes: Sequence[Route], latencies: Sequence[float], noise_sd: float = 0.0
) -> Screened:
    """Forward selection (:data:`F_MIN`) of the knobs whose values explain log latency (at most
    :data:`MAX_KEPT`), then of the pairs of their values that act together beyond their own effects."""
    y = np.log(np.asarray(latencies, float))
    by_name = {knob.name: knob for knob in knobs if len(knob.values) > 1}
    mains = {name: _columns(knob, routes) for name, knob in by_name.items()}
    kept, design = _forward(y, np.ones((len(y), 1)), dict(mains), MAX_KEPT, noise_sd)
    names = [str(name) for name, _ in kept]
    acting, design = _forward(y, design, _pair_columns(names, by_name, mains, routes), MAX_KEPT, noise_sd)
    starts: dict[str, list[int]] = {name: [start] for name, start in ((str(n), s) for n, s in kept)}
    for pair, start in acting:
        for knob, _ in pair:  # type: ignore[attr-defined]
            if knob not in names:  # its values' columns follow the pair's (another pair may repeat them)
                starts.setdefault(knob, []).append(start + 1)
    coefficients = np.linalg.lstsq(design, y, rcond=None)[0]
    effects = {
        name: {
            value: float(np.exp(sum(coefficients[start + i] for start in at)))
            for i, value in enumerate(by_name[name].values[1:])
        }
        for name, at in starts.items()
    }
    together = {pair: float(np.exp(coefficients[start])) for pair, start in acting}  # type: ignore[misc]
    residual = y - design @ coefficients
    residual_sd = float(np.sqrt(np.sum(residual**2) / max(len(y) - design.shape[1], 1)))
    return Screened(effects, residual_sd, len(y), together)  # type: ignore[arg-type]


def _pair_columns(
    names: list[str], by_name: dict[str, RouteKnobValues], mains: dict[str, np.ndarray], routes: Sequence[Route]
) -> dict[object, np.ndarray]:
    """A column per pair of values of a kept knob (``names``) and another knob, set where a route
    takes both; with a knob not kept, its own values' columns too (a knob that acts only with a
    kept one joins with them)."""
    partners = [*names, *(name for name in by_name if name not in names)]
    pairs: dict[object, np.ndarray] = {}
    for a in names:
        for b in partners:
            if b == a or (b in names and names.index(b) < names.index(a)):
                continue
            for va in by_name[a].values[1:]:
                for vb in by_name[b].values[1:]:
                    both = np.array([[route.get(a) == va and route.get(b) == vb] for route in routes], float)
                    first, second = sorted(((a, va), (b, vb)))
                    pairs[(first, second)] = both if b in names else np.hstack([both, mains[b]])
    return pairs


def one_at_a_time_builds(knobs: Sequence[RouteKnobValues]) -> int:
    """What trtexec's ``fast`` sweep builds: the default route and each other value of each knob."""
    return 1 + sum(len(knob.values) - 1 for knob in knobs)


def first_batch(knobs: Sequence[RouteKnobValues]) -> int:
    """The builds before the first fit: about one per value to fit, between 16 and :data:`FIRST_BATCH`."""
    return max(MIN_FIRST_BATCH, min(FIRST_BATCH, one_at_a_time_builds(knobs)))


def build_cap(knobs: Sequence[RouteKnobValues]) -> int:
    """The most builds a screen makes: :func:`one_at_a_time_builds` (or two batches, where the knobs
    are so few that one-at-a-time builds fewer: a fit needs more builds than it has values)."""
    return max(one_at_a_time_builds(knobs), FIRST_BATCH + BATCH)


@dataclass(frozen=True)
class Progress:
    """Where a screen stands after the routes measured so far: the fit at the last checkpoint
    (None before the first), and whether the screen is over."""

    found: Screened | None
    done: bool


FitCache = dict[int, tuple[tuple[object, ...], Screened]]
"""Fits by checkpoint, with the noise, routes and latencies each was fitted to."""


def progress(
    knobs: Sequence[RouteKnobValues],
    measured: Sequence[tuple[Route, float]],
    noise_sd: float,
    fits: FitCache | None = None,
) -> Progress:
    """The screen's state after ``measured`` (in the order built), fitted at its checkpoints (the
    first batch, then every :data:`BATCH`): over once two checkpoints in a row keep the same knobs
    and leave no more spread than the measurement's own (``noise_sd``: its relative standard
    deviation, :data:`EXPLAINED`), or at :func:`build_cap`. A function of what was measured alone,
    so that a resumed search finds the screen where it stood. ``fits`` keeps the checkpoints'
    fits between calls: one is fitted again only where what it was fitted to changed."""
    cap, checkpoint = build_cap(knobs), first_batch(knobs)
    found, previous = None, None
    fits = {} if fits is None else fits
    while checkpoint <= len(measured):
        upto = measured[:checkpoint]
        data = (noise_sd, *((route_key(r), t) for r, t in upto))
        if checkpoint not in fits or fits[checkpoint][0] != data:
            fits[checkpoint] = (data, fit(knobs, [r for r, _ in upto], [t for _, t in upto], noise_sd))
        found = fits[checkpoint][1]
        kept = set(found.effects)
        if (kept == previous and found.residual_sd <= EXPLAINED * noise_sd) or checkpoint >= cap:
            return Progress(found, True)
        previous = kept
        checkpoint = min(checkpoint + BATCH, cap)
    return Progress(found, False)


def next_route(
    knobs: Sequence[RouteKnobValues], found: Screened | None, taken: Callable[[Route], bool], rng: np.random.Generator
) -> Route:
    """The screen's next route: the last fit's fastest route (:func:`kept_routes`) not yet
    ``taken`` (built or being built), so that what the fit has learnt is built while it learns
    more; else a random route (:func:`random_routes`)."""
    if found is not None:
        for route in kept_routes(found, EXPLOITED):
            if not taken(route):
                return route
    route: Route = {}
    for _ in range(RANDOM_TRIES):  # a resumed screen draws the routes it built again
        route = random_routes(knobs, 1, rng)[0]
        if not taken(route):
            break
    return route


def screen(
    knobs: Sequence[RouteKnobValues],
    measure: Callable[[Route], float],
    rng: np.random.Generator,
    noise_sd: float,
) -> tuple[Screened, list[tuple[Route, float]]]:
    """Routes built and measured one after the other (``measure``: a route's latency;
    :func:`next_route`) until :func:`progress` says the screen is over; the last fit, and every
    route measured."""
    measured: list[tuple[Route, float]] = []
    built: set[str] = set()
    state, fits = Progress(None, False), {}
    while not state.done:
        route = next_route(knobs, state.found, lambda r: route_key(r) in built, rng)
        built.add(route_key(route))
        measured.append((route, measure(route)))
        state = progress(knobs, measured, noise_sd, fits)
    assert state.found is not None
    return state.found, measured


def route_key(route: Route) -> str:
    """A route as a hashable value, its order aside."""
    return repr(sorted(route.items()))


EXPLAINED = 1.5
"""A screen ends once what its fit leaves unexplained is within this factor of the measurement's
own spread: a larger rest is a knob not found yet."""
EXPLOITED = 2
"""The fit's fastest routes the screen builds after each checkpoint, before random ones."""
RANDOM_TRIES = 100
"""Random routes drawn before one that is taken is given (a screen of few knobs may have built them all)."""
REFINE_LIMIT = 64
"""The most routes of the kept knobs built after a screen."""


def kept_routes(screened: Screened, limit: int = REFINE_LIMIT) -> list[Route]:
    """Routes over the kept knobs' values (every other knob at its default), the fit's fastest
    first (:meth:`Screened.predicted`): all of them where they number ``limit`` or fewer (so what
    the kept knobs do together is measured, not assumed), else the fit's ``limit`` fastest."""
    routes: list[Route] = [{}]
    for knob, effects in screened.effects.items():
        grown = [dict(route) for route in routes]
        grown += [{**route, knob: value} for route in routes for value in effects]
        routes = sorted(grown, key=screened.predicted)[: max(limit, 1) * 4]
    return sorted(routes, key=screened.predicted)[:limit]


def chosen(
    measured: Sequence[tuple[Route, float]], again: Callable[[Route], float], top: int = 3, repeats: int = 2
) -> Route:
    """The route with the lowest mean latency among the ``top`` fastest measured, each measured
    ``repeats`` times more (``again``: another measurement of a built route), the mean of those
    alone: the luck that made a route look fastest does not pick the winner."""
    best: dict[str, tuple[Route, float]] = {}
    for route, latency in measured:
        key = route_key(route)
        if key not in best or latency < best[key][1]:
            best[key] = (route, latency)
    finalists = sorted(best.values(), key=lambda item: item[1])[:top]
    return min(finalists, key=lambda item: float(np.mean([again(item[0]) for _ in range(repeats)])))[0]
