"""The route screen on landscapes of known effects: it keeps the knobs that change latency, and
only those, in fewer builds than one value at a time, and a route's luck does not pick the winner."""

from __future__ import annotations

import numpy as np

from gpt_optuna.search.route_screen import (
    RouteKnobValues,
    chosen,
    fit,
    kept_routes,
    next_route,
    one_at_a_time_builds,
    progress,
    random_routes,
    screen,
)

NOISE = 0.005


def knobs(count: int) -> list[RouteKnobValues]:
    return [RouteKnobValues(f"k{i}", ("off", "on") if i % 3 else ("0", "1", "2")) for i in range(count)]


EFFECTS = {("k1", "on"): 0.94, ("k4", "on"): 1.2, ("k6", "2"): 0.95, ("k6", "1"): 1.04}
TOGETHER = {(("k1", "on"), ("k4", "on")): 0.75}  # k4 slows alone, and with k1 it helps


def truth(route: dict[str, str]) -> float:
    ratio = float(np.prod([EFFECTS.get(item, 1.0) for item in route.items()]))
    for (a, b), effect in TOGETHER.items():
        if route.get(a[0]) == a[1] and route.get(b[0]) == b[1]:
            ratio *= effect
    return ratio


def test_the_screen_keeps_the_knobs_that_change_latency_in_fewer_builds_than_one_at_a_time() -> None:
    space = knobs(90)
    noise = np.random.default_rng(7)
    found, measured = screen(space, lambda r: truth(r) * (1 + noise.normal(0, NOISE)), np.random.default_rng(0), NOISE)
    assert {"k1", "k4", "k6"} <= set(found.effects) and len(found.effects) <= 4  # a false keep costs routes only
    assert abs(found.effects["k1"]["on"] - 0.94) < 0.02
    assert set(TOGETHER) <= set(found.pairs)
    assert len(measured) == found.builds < one_at_a_time_builds(space) == 1 + 90 + 30
    best = truth({"k1": "on", "k4": "on", "k6": "2"})  # k4 slows alone: only its pair with k1 finds it
    assert min(truth(route) for route in kept_routes(found)[:3]) == best


def test_the_winner_is_the_lowest_mean_of_the_fastest_measured_again() -> None:
    lucky, steady = {"k0": "on"}, {"k1": "on"}
    again = {"k0": iter([1.10, 1.10]), "k1": iter([0.96, 0.96]), "": iter([1.0, 1.0])}
    measured = [(lucky, 0.90), (steady, 0.97), ({}, 1.0)]
    assert chosen(measured, lambda r: next(again[next(iter(r), "")])) == steady


def test_two_large_effects_drawn_together_do_not_hide_each_other() -> None:
    """k2 makes a route 0.6x, k5 1.6x; of sixteen routes six happen to set both, so neither alone
    explains enough of the rest to be kept: the pair is tried together."""
    space = [RouteKnobValues(f"k{i}", ("0", "1")) for i in range(12)]
    both = [(0, 1), (0, 0), (1, 0), (0, 0), (0, 0), (1, 0), (1, 0), (0, 0), *[(1, 1)] * 6, (1, 0), (0, 0)]
    routes = random_routes(space, len(both), np.random.default_rng(0))
    for route, (k2, k5) in zip(routes, both, strict=True):
        route.pop("k2", None), route.pop("k5", None)
        route |= {"k2": "1"} if k2 else {}
        route |= {"k5": "1"} if k5 else {}
    latencies = [0.6 ** ("k2" in r) * 1.6 ** ("k5" in r) * (1 + 1e-4 * (i % 3)) for i, r in enumerate(routes)]
    found = fit(space, routes, latencies, NOISE)
    assert set(found.effects) == {"k2", "k5"}
    assert abs(found.effects["k2"]["1"] - 0.6) < 0.01 and abs(found.effects["k5"]["1"] - 1.6) < 0.01


def test_the_screen_stands_where_its_measurements_put_it_and_builds_what_it_learnt() -> None:
    """A resumed search finds the screen where it stood: its state is a function of the routes
    measured, whatever fits were kept between calls; after a fit, the next route is the fit's
    fastest not yet built."""
    space = knobs(30)
    noise = np.random.default_rng(1)
    measured = [(r, truth(r) * (1 + noise.normal(0, NOISE))) for r in random_routes(space, 64, noise)]
    fits: dict = {}
    states = [progress(space, measured[:n], NOISE, fits) for n in range(1, len(measured) + 1)]
    for n in (15, 32, 50, 64):
        fresh = progress(space, measured[:n], NOISE)
        assert (fresh.done, fresh.found) == (states[n - 1].done, states[n - 1].found)
    assert states[14].found is None and not states[14].done  # before the first fit
    found = states[31].found
    assert found is not None and {"k1", "k4", "k6"} <= set(found.effects)
    best, second = kept_routes(found)[:2]
    assert next_route(space, found, lambda r: False, noise) == best
    assert next_route(space, found, lambda r: r == best, noise) == second
