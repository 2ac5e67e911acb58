"""The replay benchmark: its closed-form random-order median, and a short replay of the recorded
landscapes through the tuner's search loop."""

from __future__ import annotations

import itertools
import statistics
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
from replay import Landscape, random_order  # noqa: E402

from gpt_optuna.core.space import candidate_key  # noqa: E402


def test_random_order_median_matches_every_order_of_a_small_space() -> None:
    for configurations, hits in ((6, 1), (6, 2), (7, 3), (8, 8)):
        firsts = [
            next(i for i, c in enumerate(order, 1) if c < hits)
            for order in itertools.permutations(range(configurations))
        ]
        assert random_order(configurations, hits) == statistics.median_low(firsts)


def test_the_recorded_landscapes_are_complete_grids() -> None:
    for path in sorted((BENCHMARKS / "landscapes").glob("*.json")):
        landscape = Landscape.read(path)
        assert sorted(landscape.results) == sorted(candidate_key(c) for c in landscape.space.every_candidate())
        assert landscape.space.default() in [dict(k) for k in landscape.results]


def test_a_short_replay_runs_every_strategy_on_every_landscape() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "replay.py"), "--seeds", "2"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()]
    names = sorted(p.stem for p in (BENCHMARKS / "landscapes").glob("*.json"))
    table = {row[0]: row[1:] for row in rows if row and row[0] in names}
    assert sorted(table) == names
    assert all(len(values) == 9 and all(float(v) >= 1 for v in values[2:]) for values in table.values())
