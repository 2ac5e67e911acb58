"""Route search replayed on simulated landscapes: the builds each strategy needs to come within 1 %
of a landscape's fastest route, the tuner's screen (:mod:`gpt_optuna.search.route_screen`) beside
trtexec's Global Performance Tuner sweeps.

A landscape has about two hundred knobs of 2-4 values (the size of TensorRT 11.1's
``all_build_routes``); a few change latency (a value 1-6 % faster or 2-30 % slower), a few pairs
interact (a further -4 % to +10 % where both take given values), and every measurement carries
N(0, 0.5 %) noise (about +-1 %). A build is counted, a repeated measurement of a built route is
not. The strategies, as trtexec defines them:

- ``fast``: the default route and every other value of every knob, one at a time, each measured
  once; the winner by a strict ``<``.
- ``full``: every combination, each measured once (only for the small landscapes, where it is finite).
- ``mixed``: ``fast``, then every combination of the knobs whose one-off variant beat the default
  (their values that did; at most ten knobs, the largest gains), each measured once.
- ``tuner``: the screen (:func:`route_screen.screen`: random routes, and the last fit's fastest
  routes after each fit) until two fits keep the same knobs and explain all but the noise (the
  measurement's spread, which the tuner's timer knows), then the kept knobs' routes the fit ranks
  fastest (:func:`route_screen.kept_routes`), which stand for a study's search over the kept knobs.

Every strategy ends alike, as a study's confirmation ends a search: its five fastest routes
(``--confirm-top``'s default) are measured 15 times more (five processes of three rounds) and the
lowest mean of those is its winner.

A strategy's winner after each build is the fastest route it has measured so far; the builds it
needs are those after which that winner stays within 1 % of the landscape's fastest (the
noise-free latencies), "never" where its final winner is not. Prints one row per landscape and
the medians::

    python -m benchmarks.routes [--landscapes 20] [--small 10] [--seed 0]
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from gpt_optuna.protocol.timing import MIN_ROUNDS
from gpt_optuna.search import route_screen
from gpt_optuna.search.options import DEFAULT_PROCESSES, DEFAULT_TOP
from gpt_optuna.search.route_screen import Route, RouteKnobValues

NOISE_SD = 0.005
WITHIN = 1.01
MIXED_KEPT = 10
TIE = 1 + 1e-9
"""Two winners this close are one latency (routes that differ in knobs that do nothing, their
effects multiplied in another order)."""


@dataclass
class Landscape:
    """Knobs, the effect of each knob value and of each interacting pair, and a seeded noise."""

    knobs: list[RouteKnobValues]
    effects: dict[tuple[str, str], float]
    pairs: dict[tuple[tuple[str, str], tuple[str, str]], float]
    rng: np.random.Generator
    builds: int = 0
    seen: dict[str, float] = field(default_factory=dict)

    def truth(self, route: Route) -> float:
        ratio = 1.0
        for item in route.items():
            ratio *= self.effects.get(item, 1.0)
        for (a, b), effect in self.pairs.items():
            if route.get(a[0]) == a[1] and route.get(b[0]) == b[1]:
                ratio *= effect
        return ratio

    def build_and_measure(self, route: Route) -> float:
        self.builds += 1
        return self.measure_again(route)

    def measure_again(self, route: Route) -> float:
        return self.truth(route) * float(1 + self.rng.normal(0, NOISE_SD))

    def best(self) -> float:
        """The fastest route's latency (exhaustively for a small landscape, else over the routes
        of the knobs with effects, the others at their defaults: they change nothing)."""
        active = sorted({k for k, _ in self.effects} | {k for pair in self.pairs for k, _ in pair})
        values = [next(k.values for k in self.knobs if k.name == name) for name in active]
        return min(self.truth(dict(zip(active, combo, strict=True))) for combo in itertools.product(*values))


def landscape(seed: int, knobs: int, active: int, pairs: int) -> Landscape:
    rng = np.random.default_rng(seed)
    made = [
        RouteKnobValues(f"k{i}", tuple(f"v{j}" for j in range(int(rng.choice([2, 2, 3, 4]))))) for i in range(knobs)
    ]
    effects: dict[tuple[str, str], float] = {}
    for knob in rng.choice(len(made), active, replace=False):
        for value in made[knob].values[1:]:
            helps = rng.random() < 0.5
            effects[(made[knob].name, value)] = 1 - rng.uniform(0.01, 0.06) if helps else 1 + rng.uniform(0.02, 0.30)
    interacting: dict[tuple[tuple[str, str], tuple[str, str]], float] = {}
    for _ in range(pairs):
        a, b = rng.choice(len(made), 2, replace=False)
        va, vb = made[a].values[1:][int(rng.integers(len(made[a].values) - 1))], made[b].values[-1]
        interacting[((made[a].name, va), (made[b].name, vb))] = 1 + rng.uniform(-0.04, 0.10)
    return Landscape(made, effects, interacting, np.random.default_rng(seed + 10_000))


Trace = list[tuple[Route, float]]
"""A strategy's builds in order: each route and the latency it is judged by when built."""


def fast(land: Landscape) -> Trace:
    trace = [({}, land.build_and_measure({}))]
    for knob in land.knobs:
        trace += [({knob.name: v}, land.build_and_measure({knob.name: v})) for v in knob.values[1:]]
    return trace


def full(land: Landscape) -> Trace:
    names = [k.name for k in land.knobs]
    trace = []
    for combo in itertools.product(*(k.values for k in land.knobs)):
        route = {n: v for n, v, k in zip(names, combo, land.knobs, strict=True) if v != k.default}
        trace.append((route, land.build_and_measure(route)))
    return trace


def mixed(land: Landscape) -> Trace:
    trace = fast(land)
    default = trace[0][1]
    gains: dict[str, list[tuple[str, float]]] = {}
    for route, latency in trace[1:]:
        ((name, value),) = route.items()
        if latency < default:
            gains.setdefault(name, []).append((value, latency))
    if len(gains) < 2:
        return trace
    kept = sorted(gains, key=lambda n: min(t for _, t in gains[n]))[:MIXED_KEPT]
    built = {route_screen.route_key(r) for r, _ in trace}
    for combo in itertools.product(*([None, *(v for v, _ in gains[n])] for n in kept)):
        route = {n: v for n, v in zip(kept, combo, strict=True) if v is not None}
        if route_screen.route_key(route) not in built:
            trace.append((route, land.build_and_measure(route)))
    return trace


def tuner(land: Landscape, seed: int) -> Trace:
    design = np.random.default_rng(seed)
    screened, trace = route_screen.screen(land.knobs, land.build_and_measure, design, NOISE_SD)
    built = {route_screen.route_key(r) for r, _ in trace}
    for route in route_screen.kept_routes(screened):
        if route_screen.route_key(route) not in built:
            trace.append((route, land.build_and_measure(route)))
    return trace


def builds_to_reach(
    trace: Trace, truth: Callable[[Route], float], best: float, final: Route | None = None
) -> int | None:
    """The builds after which the winner so far (lowest latency measured) stays within 1 % of
    ``best``, its last winner being ``final`` where the strategy picks it otherwise; None: never."""
    winners, incumbent = [], (None, float("inf"))
    for route, latency in trace:
        if latency < incumbent[1]:
            incumbent = (route, latency)
        winners.append(incumbent[0])
    if final is not None:
        winners[-1] = final
    if truth(winners[-1] or {}) > WITHIN * best:
        return None
    reached = len(winners)
    while reached > 1 and truth(winners[reached - 2] or {}) <= WITHIN * best:
        reached -= 1
    return reached


@dataclass(frozen=True)
class Row:
    name: str
    best: float
    results: dict[str, tuple[int, int | None, float]]
    """Strategy -> (builds made, builds to come within 1 %, the last winner's noise-free latency)."""


def replay(name: str, seed: int, make: Callable[[], Landscape], strategies: tuple[str, ...]) -> Row:
    """Each strategy on a fresh copy of the landscape, every one ending alike: its fastest routes
    measured again as a study's confirmation measures its finalists, and the lowest mean of those
    kept (:func:`route_screen.chosen`)."""
    results = {}
    best = make().best()
    for strategy in strategies:
        land = make()
        if strategy == "tuner":
            trace = tuner(land, seed)
        else:
            trace = {"fast": fast, "full": full, "mixed": mixed}[strategy](land)
        final = route_screen.chosen(trace, land.measure_again, DEFAULT_TOP, DEFAULT_PROCESSES * MIN_ROUNDS)
        results[strategy] = (land.builds, builds_to_reach(trace, land.truth, best, final), land.truth(final))
    return Row(name, best, results)


def cell(result: tuple[int, int | None, float] | None, best: float) -> str:
    if result is None:
        return "-"
    builds, reach, last = result
    return f"{reach if reach is not None else 'never'} of {builds} ({last / best:.3f}x)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--landscapes", type=int, default=20, help="landscapes of about 200 knobs")
    parser.add_argument("--small", type=int, default=10, help="landscapes of 8 knobs, where full is finite")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rows = []
    for i in range(args.small):
        seed = args.seed + 1000 + i
        make = lambda s=seed: landscape(s, 8, 3, 1)  # noqa: E731
        rows.append(replay(f"small-{i}", seed, make, ("fast", "full", "mixed", "tuner")))
    for i in range(args.landscapes):
        seed = args.seed + i
        make = lambda s=seed: landscape(s, 200, 8, 3)  # noqa: E731
        rows.append(replay(f"large-{i}", seed, make, ("fast", "mixed", "tuner")))
    strategies = ("fast", "full", "mixed", "tuner")
    print("builds to come within 1 % of the fastest route, of the builds made (the last winner / the fastest)")
    print("| landscape | " + " | ".join(strategies) + " |")
    print("| --- " * (len(strategies) + 1) + "|")
    for row in rows:
        print(f"| {row.name} | " + " | ".join(cell(row.results.get(s), row.best) for s in strategies) + " |")
    for size in ("small", "large"):
        these = [r for r in rows if r.name.startswith(size)]
        medians = {}
        for s in strategies:
            reached = [r.results[s][1] for r in these if s in r.results]
            if reached:
                finite = [x if x is not None else float("inf") for x in reached]
                medians[s] = float(np.median(finite))
        if not these:
            continue
        worse = sum(r.results["tuner"][2] > r.results["mixed"][2] * TIE for r in these)
        beyond = sum(r.results["tuner"][2] > r.results["mixed"][2] * WITHIN for r in these)
        text = ", ".join(f"{s} {m:g}" for s, m in medians.items())
        ratio = (
            "n/a (mixed's median is never)"
            if medians["mixed"] == float("inf")
            else f"{medians['tuner'] / medians['mixed']:.2f}"
        )
        print(
            f"{size}: median builds to within 1 %: {text}; tuner / mixed {ratio}; landscapes where the"
            f" tuner's winner is slower than mixed's: {worse} of {len(these)}, by over 1 %: {beyond}"
        )


if __name__ == "__main__":
    main()
