"""The route screen on landscapes of known effects: it keeps the knobs that change latency, and
only those, in fewer builds than one value at a time, and a route's luck does not pick the winner."""

from __future__ import annotations

import numpy as np

from gpt_optuna.search.route_screen import (
    RouteKnobValues,
    chosen,
    kept_routes,
    one_at_a_time_builds,
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
