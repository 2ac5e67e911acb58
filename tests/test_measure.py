"""The latency statistics on real timed workloads: stopping rule, flagging, interleaving, the confirmation."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import optuna
import pytest
from conftest import SYNTHETIC

from gpt_optuna.cli import main
from gpt_optuna.core.measure_settings import MeasureSettings
from gpt_optuna.remeasure.finalists import confirm, template_from_study
from gpt_optuna.results.summary_text import format_confirmed
from gpt_optuna.study.evidence import speedups
from gpt_optuna.study.summary import StudySummary
from gpt_optuna.worker.measure import interleaved_rounds, measure_with, median_rel_ci


def busy(ms: float) -> float:
    start = time.perf_counter()
    end = start + ms / 1000
    while time.perf_counter() < end:
        pass
    return (time.perf_counter() - start) * 1000


def test_a_steady_workload_stops_as_soon_as_the_median_is_known() -> None:
    stats = measure_with(lambda: busy(0.2), MeasureSettings(target_rel_ci=0.05, budget_s=5.0))
    assert stats.stable and stats.rel_ci <= 0.05
    assert stats.samples <= 200  # far from what 5 s would allow
    assert 0.18 < stats.median_ms < 0.4
    assert stats.p10_ms <= stats.median_ms <= stats.p90_ms


def test_a_noisy_workload_is_flagged_when_the_budget_runs_out() -> None:
    rng = np.random.default_rng(0)
    stats = measure_with(
        lambda: busy(float(rng.lognormal(-2.0, 1.2))), MeasureSettings(target_rel_ci=0.001, budget_s=0.3)
    )
    assert not stats.stable and stats.rel_ci > 0.001
    assert stats.cv > 0.3


def test_median_confidence_interval_shrinks_with_samples() -> None:
    rng = np.random.default_rng(0)
    assert median_rel_ci(1 + 0.1 * rng.standard_normal(1000)) < median_rel_ci(1 + 0.1 * rng.standard_normal(50))


def drifting(base_ms: float, start: float, slope: float):  # noqa: ANN201 - a timer
    """A workload that slows down as time passes (a machine heating up, a neighbour starting)."""
    return lambda: busy(base_ms * (1 + slope * (time.monotonic() - start)))


def test_interleaving_keeps_the_ranking_where_sequential_measurement_gets_it_wrong() -> None:
    start = time.monotonic()
    slow, fast = drifting(1.0, start, 1.0), drifting(0.9, start, 1.0)  # fast is 10 % faster, always
    sequential_slow = np.median([slow() for _ in range(150)])
    sequential_fast = np.median([fast() for _ in range(150)])
    assert sequential_fast > sequential_slow  # measured later, under more drift: the ranking flips

    start = time.monotonic()
    slow, fast = drifting(1.0, start, 1.0), drifting(0.9, start, 1.0)
    rounds = interleaved_rounds([slow, fast], rounds=30, block=5)
    _, found = speedups(rounds, np.zeros(len(rounds)))
    assert 1.0 < found.low <= found.estimate <= found.high
    assert 1.03 < found.estimate < 1.25


@pytest.mark.slow
def test_finalists_are_confirmed_interleaved_and_best_follows_the_confirmed_ranking(
    tmp_path: Path, cnn_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "tune.toml"
    config.write_text(
        '[measure]\nbudget_s = 0.1\n[space]\nmode = "ok"\ndelay_us = [200, 100, 50]\nbuild_ms = [0]\n'
        'a = [0]\nb = [0]\nc = ["x"]\n'
    )
    argv = ["tune", str(cnn_path), "--backend", SYNTHETIC, "--config", str(config), "--quiet", "--n-trials", "8"]
    assert main([*argv, "--confirm-top", "2", "--confirm-processes", "3"]) == 0
    out = capsys.readouterr().out
    assert "interleaved rounds in 3 fresh processes" in out
    study = optuna.load_study(study_name="cnn-syntheticbackend", storage="sqlite:///studies/cnn-syntheticbackend.db")
    confirmed = study.user_attrs["confirmed"]
    delays = {t.number: t.params["delay_us"] for t in study.get_trials()}
    assert delays[confirmed["baseline"]["number"]] == 200
    assert confirmed["processes"] == 3 and len(confirmed["baseline"]["process_ms"]) == 3
    assert [delays[row["number"]] for row in confirmed["ranking"]] == [50, 100]
    for row in confirmed["ranking"]:
        assert row["speedup"] > 1.0 and row["ci_low"] <= row["speedup"] <= row["ci_high"]
        assert len(row["process_speedups"]) == 3
    assert main(["best", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert delays[record["number"]] == 50 and record["speedup"] == confirmed["ranking"][0]["speedup"]
    template = template_from_study(study)  # on demand, the protocol the search used
    assert template.settings == MeasureSettings(budget_s=0.1) and template.workdir.name == study.study_name
    assert main(["confirm", "--top", "1", "--processes", "1"]) == 0  # on demand, from the study alone
    reloaded = optuna.load_study(study_name="cnn-syntheticbackend", storage="sqlite:///studies/cnn-syntheticbackend.db")
    assert len(reloaded.user_attrs["confirmed"]["ranking"]) == 1
    single = capsys.readouterr().out
    assert "in 1 fresh process (baseline trial" in single and "one process only: indicative, not confirmed" in single
    # under a deadline none runs past it: a process that would not fit (as long as the longest one so far) is
    # not started, one that runs into it is stopped, and the processes measured make the result
    said: list[str] = []
    log = tmp_path / "confirm.log"
    deadline = time.monotonic() + 8
    result = confirm(study, template, log, 1, 50, said.append, deadline=deadline)
    assert time.monotonic() < deadline + 2  # the last process's kill and join
    assert result is not None and 1 <= result["processes"] < 50, said
    stopped = result["stopped"]
    assert stopped == "no time left before --timeout" or stopped.endswith("ran into --timeout"), said


def test_a_confirmation_recorded_without_per_process_figures_still_prints() -> None:
    row = {"median_ms": 1.0, "speedup": 2.0, "ci_low": 1.9, "ci_high": 2.1, "significant": True}
    recorded = {"baseline": {**row, "number": 0, "median_ms": 2.0}, "ranking": [{**row, "number": 3}], "rounds": 30}
    lines = format_confirmed(StudySummary("s", {}, 0, None, None, confirmed=recorded))
    assert lines[0] == "confirmed in 30 interleaved rounds in 1 fresh process (baseline trial 0: 2 ms):"
    assert lines[1] == "  trial 3: 1 ms, speedup 2.000x [95% CI 1.900-2.100]"


def test_the_confirmed_interval_holds_the_speedup_it_is_shown_beside() -> None:
    """Rounds so steady that every resampled ratio equals the estimate, but for float rounding."""
    from gpt_optuna.study.confirmation import summarize_rounds

    base = [2.0001, 2.0001, 2.0, 2.0, 2.0, 2.0001]
    candidate = [1.0003, 1.0003, 1.0003, 1.0, 1.0001, 1.0003]
    rounds = np.stack([base, candidate], axis=1)
    confirmed = summarize_rounds([0, 1], rounds, np.repeat(np.arange(2), 3))
    (row,) = confirmed["ranking"]
    assert row["ci_low"] <= row["speedup"] <= row["ci_high"] and row["significant"]
    assert row["speedup"] == pytest.approx(confirmed["baseline"]["median_ms"] / row["median_ms"])
