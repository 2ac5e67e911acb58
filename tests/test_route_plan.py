"""The build-route screen inside a real search: a synthetic engine with twelve screened route knobs,
two of which change its latency, tuned with a real worker and SQLite storage. The screen's routes
run at the engine's defaults, the sampler's own candidates leave every route knob at its default
until the screen is over and then try only the kept knobs, and a resumed search reads the screen
back from the study instead of screening again."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from conftest import save, synthetic_config

from gpt_optuna.cli import main
from gpt_optuna.core.space import Space
from gpt_optuna.search.ledger import StudyLedger
from gpt_optuna.search.route_plan import SCREEN, RoutePlan
from gpt_optuna.study.trial_record import TrialRecord
from gpt_optuna.testing.small_cnn import small_cnn
from gpt_optuna.testing.synthetic import ROUTE_EFFECTS

BACKEND = "gpt_optuna.testing.synthetic:RoutedSyntheticBackend"
NAME = "cnn-routedsyntheticbackend"
ROUTES = [f"route.r{i}" for i in range(12)]
ACTING = {name for name, _ in ROUTE_EFFECTS}


def tune(folder: Path, trials: int) -> int:
    model = save(small_cnn(), folder / "cnn.onnx")
    # the default delay (200 us) left out: the screen runs the first delay the search tries
    config = synthetic_config(folder, 'mode = "ok"\nbuild_ms = [0]\ndelay_us = [100, 50]\na = [0]\nb = [0]\nc = ["x"]')
    args = ["--config", str(config), "--n-trials", str(trials), "--confirm-top", "0", "--seed", "3"]
    return main(["tune", str(model), "--backend", BACKEND, *args])


def study_trials(folder: Path) -> tuple[list[optuna.trial.FrozenTrial], RoutePlan]:
    """The study's trials, and the route plan a sampler reads from them."""
    study = optuna.load_study(study_name=NAME, storage=f"sqlite:///{folder / 'studies' / f'{NAME}.db'}")
    trials = study.get_trials(deepcopy=False)
    ledger = StudyLedger()
    ledger.update(trials)
    plan = RoutePlan(Space.from_record(study.user_attrs["space_record"]), None)
    plan.update(ledger, {})
    return trials, plan


def test_a_search_screens_the_route_knobs_then_tries_only_those_that_matter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert tune(tmp_path, 90) == 0
    said = capsys.readouterr().err
    trials, plan = study_trials(tmp_path)
    assert plan.state.done and plan.state.found is not None
    kept = set(plan.state.found.effects)
    assert kept >= ACTING, kept
    (line,) = [line for line in said.splitlines() if line.startswith("route screen: ")]
    assert all(name in line for name in ACTING) and f"of {len(ROUTES)} route knobs change latency" in line
    screens = [t for t in trials if TrialRecord(t).proposed_by == SCREEN]
    assert 16 <= len(screens) <= 48  # the first fit's builds at least, the cap at most
    for trial in screens:  # a route on the settings the search tries first
        assert trial.params["delay_us"] == 100 and any(trial.params[r] != "0" for r in ROUTES)
    others = [t for t in trials if t.number and TrialRecord(t).proposed_by not in (SCREEN, None)]
    assert others and all(t.params[r] == "0" for t in others for r in ROUTES if r not in kept)
    during = [t for t in trials if t.number and t.number <= screens[-1].number]
    assert all(t.params[r] == "0" for t in during if t not in screens for r in ROUTES)  # routes wait for the screen
    taking_turns = [TrialRecord(t).proposed_by == SCREEN for t in during]
    assert taking_turns == [i % 2 == 0 for i in range(len(during))]
    best = min((t for t in trials if t.values), key=lambda t: t.values[0])
    assert (best.params["delay_us"], best.params["route.r2"], best.params["route.r5"]) == (50, "1", "0")

    assert tune(tmp_path, 100) == 0  # resumed: the screen is read back, not made again
    again, _ = study_trials(tmp_path)
    assert [t.number for t in again if TrialRecord(t).proposed_by == SCREEN] == [t.number for t in screens]
    assert any(line.startswith("route screen: ") for line in capsys.readouterr().err.splitlines())


def screen_trial(routes: dict[str, str], number: int, **attrs: object) -> optuna.trial.FrozenTrial:
    """A finished screen trial of the routed synthetic space, as a study holds one."""
    params = {name: routes.get(name, "0") for name in ROUTES}
    trial = optuna.trial.create_trial(
        params=params,
        distributions={name: optuna.distributions.CategoricalDistribution(("0", "1")) for name in ROUTES},
        user_attrs={"proposed_by": SCREEN, **attrs},
        state=optuna.trial.TrialState.PRUNED,
    )
    trial.number = number
    return trial


def routed_space() -> Space:
    from gpt_optuna.core.space import Knob

    return Space([Knob("level", (3, 5), 3), *(Knob(r, ("0", "1"), "0", screened=True) for r in ROUTES)])


def test_the_space_listing_says_which_knobs_are_screened() -> None:
    rows = routed_space().table().splitlines()
    assert all(("screened first" in row) == row.startswith("route.") for row in rows[:-1])


@pytest.mark.parametrize("outcome", ["build_error", "dry_run"])
def test_a_screen_whose_builds_measure_nothing_ends_instead_of_waiting_for_them(outcome: str) -> None:
    """Builds that all fail (a route TensorRT refuses) or a dry run that times nothing: the screen
    ends with every route knob at its default, and the sampler searches the rest."""
    space = routed_space()
    plan = RoutePlan(space, 0)
    attrs = {"outcome": outcome, "failure": "refused"} if outcome == "build_error" else {"outcome": outcome}
    trials = [screen_trial({"route.r1": "1"}, n, **attrs) for n in range(60)]
    for count in (10, 16):
        ledger = StudyLedger()
        ledger.update(trials[:count])
        plan.update(ledger, {})
        assert plan.state.done == (count == 16)
    assert all(plan.choices(k) == (k.default,) for k in space.knobs if k.screened)
    assert not plan.wants_screen({})


def test_screen_routes_keep_the_users_space_and_a_resumed_screen_builds_no_route_twice() -> None:
    space = routed_space().with_overrides({"level": [5], "route.r3": ["0", "1"]})
    plan = RoutePlan(space, 0)
    assert "route.r3" not in {k.name for k in plan.knobs}  # listed in [space]: searched as listed
    built: set[tuple] = set()
    for _ in range(20):
        candidate = plan.screen_candidate(lambda c: tuple(sorted(c.items())) in built, {})
        assert candidate["level"] == 5  # the user's [space], not the engine's default
        built.add(tuple(sorted(candidate.items())))
    again = RoutePlan(space, 0)  # a resumed search, seeded alike, draws the same routes first
    candidate = again.screen_candidate(lambda c: tuple(sorted(c.items())) in built, {})
    assert tuple(sorted(candidate.items())) not in built
