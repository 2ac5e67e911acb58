"""How --timeout plans its ending: the re-measurement kept, how it is scaled down, the word at the
start where it cannot fit, and a trial's cost without one-off work (estimates only: no host's
speed); and one short run that re-measures or says at its start that it cannot."""

from __future__ import annotations

import datetime
import re
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from conftest import SYNTHETIC, synthetic_config
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial

from gpt_optuna.core.measure_settings import MeasureSettings
from gpt_optuna.protocol.timing import MIN_ROUNDS, ROUNDS, block_for
from gpt_optuna.remeasure.finalists import process_seconds, warm_up_seconds
from gpt_optuna.search.ledger import StudyLedger
from gpt_optuna.study.trial_record import ONE_OFF
from gpt_optuna.usecases.time_budget import (
    CONFIRM_SHARE,
    FINISH_S,
    MIN_PROCESSES,
    STOP_S,
    EndingReserve,
    plan_confirmation,
    reserve_s,
    smallest_confirmation,
    smallest_timeout_s,
)

CLI = [sys.executable, "-m", "gpt_optuna.cli"]
SETTINGS = MeasureSettings()
START_S = 5.0


def trial(value: int, latency_ms: float, build_s: float, baseline: bool = False, **attrs: object) -> object:
    return create_trial(
        state=TrialState.COMPLETE,
        params={"x": value},
        distributions={"x": CategoricalDistribution(tuple(range(10)))},
        value=latency_ms,
        user_attrs={
            "latency": {"median_ms": latency_ms, "stable": True},
            "build_s": build_s,
            "gpu": "cpu",
            "outcome": "ok",
            **({"baseline": True} if baseline else {}),
            **attrs,
        },
    )


def study_of(latency_ms: float, finalists: int, build_s: float = 1.0) -> optuna.Study:
    """A study with a baseline and ``finalists`` faster candidates, each built in ``build_s``."""
    study = optuna.create_study()
    study.add_trial(trial(0, latency_ms, build_s, baseline=True))
    for k in range(finalists):
        study.add_trial(trial(k + 1, latency_ms * (0.9 - 0.1 * k), build_s))
    return study


def seconds(study: optuna.Study, top: int, rounds: int) -> float:
    """One process's estimate for the baseline and the ``top`` best."""
    trials = study.get_trials()
    return process_seconds([trials[0], *sorted(trials[1:], key=lambda t: t.values[0])[:top]], SETTINGS, START_S, rounds)


def test_a_round_lasts_as_long_for_a_100_ms_model_as_for_a_1_ms_one() -> None:
    assert block_for([100.0]) == 1 and block_for([1.0]) == 100 and block_for([]) >= 1
    slow, fast = study_of(100.0, 1), study_of(1.0, 1)
    rounds_slow = seconds(slow, 1, ROUNDS) - seconds(slow, 1, 0)
    rounds_fast = seconds(fast, 1, ROUNDS) - seconds(fast, 1, 0)
    assert rounds_slow == pytest.approx(rounds_fast, rel=0.1)


def test_a_slow_models_warm_up_counts_the_launches_it_takes_at_least() -> None:
    launches = SETTINGS.warmup_min + max(SETTINGS.min_samples, SETTINGS.block)
    assert warm_up_seconds(1.0, SETTINGS) == pytest.approx(min(1.0, SETTINGS.budget_s))
    assert warm_up_seconds(500.0, SETTINGS) == pytest.approx(launches * 0.5)


def test_the_smallest_re_measurement_is_the_best_finalist_in_two_processes_of_the_fewest_rounds() -> None:
    study = study_of(20.0, 3)
    smallest = smallest_confirmation(study, 3, SETTINGS, START_S)
    assert smallest is not None
    assert (smallest.top, smallest.processes, smallest.rounds) == (1, MIN_PROCESSES, MIN_ROUNDS)
    assert smallest.total_s == pytest.approx(MIN_PROCESSES * seconds(study, 1, MIN_ROUNDS))
    alone = optuna.create_study()  # only the baseline measured: a finalist as costly stands in
    alone.add_trial(trial(0, 20.0, 1.0, baseline=True))
    stand_in = smallest_confirmation(alone, 3, SETTINGS, START_S)
    assert stand_in is not None and stand_in.total_s == pytest.approx(smallest.total_s, rel=0.05)
    assert smallest_confirmation(optuna.create_study(), 3, SETTINGS, START_S) is None  # nothing measured yet


def test_the_search_keeps_the_smallest_re_measurement_however_short_the_timeout() -> None:
    study = study_of(100.0, 3, build_s=4.0)
    smallest = smallest_confirmation(study, 3, SETTINGS, START_S)
    whole = plan_confirmation(study, 3, 3, SETTINGS, None, START_S)
    assert smallest is not None and whole is not None and whole.total_s > smallest.total_s
    short = smallest.total_s / CONFIRM_SHARE / 2  # a quarter of it is half the smallest
    assert reserve_s(smallest, whole, short) == pytest.approx(smallest.total_s + STOP_S + FINISH_S)
    long = 10 * whole.total_s / CONFIRM_SHARE
    assert reserve_s(smallest, whole, long) == pytest.approx(whole.total_s + STOP_S + FINISH_S)
    between = (whole.total_s + smallest.total_s) / 2 / CONFIRM_SHARE
    assert reserve_s(smallest, whole, between) == pytest.approx(CONFIRM_SHARE * between + STOP_S + FINISH_S)


def test_a_short_ending_drops_finalists_then_rounds_then_processes_before_it_skips() -> None:
    study = study_of(20.0, 3, build_s=2.0)
    plan = lambda left: plan_confirmation(study, 3, 3, SETTINGS, left, START_S)  # noqa: E731
    full = plan(None)
    assert full is not None and (full.top, full.processes, full.rounds) == (3, 3, ROUNDS)
    assert plan(full.total_s) == full
    fewer = plan(full.total_s - 0.01)
    assert fewer is not None and (fewer.top, fewer.processes, fewer.rounds) == (2, 3, ROUNDS)
    least_rounds = 3 * seconds(study, 1, MIN_ROUNDS)
    shorter = plan(least_rounds)
    assert shorter is not None and (shorter.top, shorter.processes, shorter.rounds) == (1, 3, MIN_ROUNDS)
    two = plan(least_rounds - 0.01)
    assert two is not None and two.processes == MIN_PROCESSES and two.total_s <= least_rounds
    assert plan(MIN_PROCESSES * seconds(study, 1, MIN_ROUNDS) - 0.01) is None  # below the smallest: skipped


def test_a_timeout_that_cannot_hold_the_smallest_says_so_once_with_one_that_would_and_searches_on() -> None:
    study = study_of(100.0, 1, build_s=4.0)
    said: list[str] = []
    smallest = smallest_confirmation(study, 3, SETTINGS, START_S)
    assert smallest is not None
    left = smallest.total_s / 2
    reserve = EndingReserve(study, 3, 3, SETTINGS, 60.0, time.monotonic() + left, lambda: 6.0, said.append, START_S)
    assert reserve() == FINISH_S and reserve() == FINISH_S  # the search runs to the deadline
    assert reserve.holds is False and len(said) == 1
    assert "--timeout 60s cannot hold the finalists' re-measurement" in said[0]
    enough = int(re.search(r"--timeout (\d+)s or more would hold it", said[0])[1])
    used = 60.0 - left  # a finalist is measured: no trial more is needed
    assert enough >= smallest_timeout_s(used, 0.0, smallest) >= used + smallest.total_s + FINISH_S


def test_a_re_measurement_that_grows_past_the_time_left_is_said_as_soon_as_it_does() -> None:
    """Before a finalist, the baseline stands in for it and one more trial is counted; a finalist
    that builds far slower grows the smallest re-measurement beyond what is left: said then."""
    study = optuna.create_study()
    study.add_trial(trial(0, 10.0, 0.1, baseline=True))
    said: list[str] = []
    before = smallest_confirmation(study, 3, SETTINGS, START_S)
    assert before is not None
    left = before.total_s + FINISH_S + 5.0
    reserve = EndingReserve(study, 3, 3, SETTINGS, 60.0, time.monotonic() + left, lambda: 1.0, said.append, START_S)
    assert reserve() >= before.total_s + FINISH_S and reserve.holds is True and said == []
    study.add_trial(trial(1, 5.0, 30.0))  # a finalist that took 30 s to build
    assert reserve() == FINISH_S and reserve.holds is False and len(said) == 1
    assert "after one more trial" not in said[0]
    assert reserve() == FINISH_S and len(said) == 1  # said once


def test_a_timeout_that_holds_it_keeps_it_and_says_nothing() -> None:
    study = study_of(1.0, 1)
    said: list[str] = []
    reserve = EndingReserve(study, 3, 3, SETTINGS, 600.0, time.monotonic() + 550.0, lambda: 2.0, said.append, START_S)
    smallest = smallest_confirmation(study, 3, SETTINGS, START_S)
    assert smallest is not None and reserve() >= smallest.total_s + FINISH_S
    assert reserve.holds is True and said == []
    before = EndingReserve(
        optuna.create_study(), 3, 3, SETTINGS, 60.0, time.monotonic() + 1.0, lambda: 9.0, said.append
    )
    assert before() == FINISH_S and before.holds is None and said == []  # judged once the baseline is measured


def test_slow_builds_kept_for_the_end_still_fit_once_a_trial_is_stopped_at_the_search_end() -> None:
    """Each candidate builds in 12 s (a compile), so the smallest re-measurement outgrows the
    share of a 150 s --timeout and is what the search keeps. A trial still compiling as the
    search's time is up is stopped there, which takes a moment: what is left then still holds the
    smallest re-measurement, rebuilds of both candidates in each process counted."""
    study = study_of(1.7, 3, build_s=12.0)
    smallest = smallest_confirmation(study, 5, SETTINGS, START_S)
    assert smallest is not None and smallest.total_s > CONFIRM_SHARE * 150.0
    assert smallest.total_s >= MIN_PROCESSES * (START_S + 2 * 12.0)  # two rebuilds in each process
    left = 88.0  # 62 s of the 150 s spent, as a trial ends
    said: list[str] = []
    reserve = EndingReserve(study, 5, 5, SETTINGS, 150.0, time.monotonic() + left, lambda: 15.0, said.append, START_S)
    kept = reserve()
    assert reserve.holds is True and said == [] and kept >= smallest.total_s + FINISH_S
    stopping_s = 1.0  # the next trial, given the search's time left, ran into it and was stopped
    at_plan = kept - stopping_s - FINISH_S  # what the re-measurement is planned in (less the finish)
    plan = plan_confirmation(study, 5, 5, SETTINGS, at_plan, START_S)
    assert plan is not None and plan.total_s <= at_plan
    assert kept - smallest.total_s - FINISH_S >= STOP_S > stopping_s


def test_a_trial_that_did_one_off_work_does_not_set_a_trials_cost() -> None:
    ledger = StudyLedger()
    trials = [trial(0, 10.0, 1.0, baseline=True), trial(1, 9.0, 1.0, **{ONE_OFF: "fp16 sensitivity ranking"})]
    trials.append(trial(2, 8.0, 1.0))
    for number, (t, span) in enumerate(zip(trials, (3.0, 30.0, 4.0), strict=True)):
        t.number = number
        t.datetime_complete = t.datetime_start + datetime.timedelta(seconds=span)
    ledger.update(trials)
    assert ledger.longest_recent_s() == pytest.approx(4.0)


@pytest.mark.slow
def test_a_timeout_too_short_for_two_processes_says_so_at_its_start_with_one_that_would_hold_them(
    cnn_path: Path, tmp_path: Path
) -> None:
    """Each candidate builds for two seconds: two processes that build two each do not fit in what
    a 15 s --timeout leaves after the baseline. The run says so as the baseline is measured (or,
    were the host fast enough, re-measures in two processes) and searches on."""
    config = synthetic_config(tmp_path, 'mode = "ok"\ndelay_us = [100, 50, 0]\nbuild_ms = [2000]')
    storage = f"sqlite:///{tmp_path / 'budget.db'}"
    argv = [*CLI, "tune", str(cnn_path), "--backend", SYNTHETIC, "--config", str(config), "--timeout", "15s"]
    argv += ["--n-trials", "1000", "--storage", storage, "--study-name", "budget"]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    study = optuna.load_study(study_name="budget", storage=storage)
    confirmed = study.user_attrs.get("confirmed")
    said = re.search(r"--timeout 15s cannot hold the finalists' re-measurement.*--timeout (\d+)s or more", done.stderr)
    if said is None:
        assert confirmed is not None and confirmed["processes"] >= MIN_PROCESSES, done.stderr
    else:  # as the baseline was measured, before the search went on
        assert "trial 2 (" not in done.stderr[: said.start()] and int(said[1]) > 15, done.stderr
        assert len(study.trials) >= 2 and (confirmed is None or confirmed["processes"] >= MIN_PROCESSES)


def test_a_build_timed_again_from_its_caches_is_what_a_confirmation_process_pays() -> None:
    cold, warm = trial(1, 1.0, 60.0), trial(1, 1.0, 60.0, rebuild_s=4.0)
    assert process_seconds([warm], SETTINGS, START_S) == pytest.approx(
        process_seconds([cold], SETTINGS, START_S) - 56.0
    )
