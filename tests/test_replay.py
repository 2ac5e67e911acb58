"""The replay benchmark: its closed-form random-order median, and a short replay of the recorded
landscapes through the tuner's search loop."""

from __future__ import annotations

import itertools
import re
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.replay import STRATEGIES, Landscape, misleading, random_order, random_order_share
from gpt_optuna.core.space import candidate_key

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"


def test_random_order_median_matches_every_order_of_a_small_space() -> None:
    for configurations, hits in ((6, 1), (6, 2), (7, 3), (8, 8)):
        firsts = [
            next(i for i, c in enumerate(order, 1) if c < hits)
            for order in itertools.permutations(range(configurations))
        ]
        assert random_order(configurations, hits) == statistics.median_low(firsts)


def test_random_order_share_matches_every_order_of_a_small_space() -> None:
    for configurations, hits, trials in ((6, 1, 2), (6, 2, 3), (7, 3, 1), (5, 1, 5), (5, 0, 3)):
        orders = list(itertools.permutations(range(configurations)))
        held = sum(any(c < hits for c in order[:trials]) for order in orders)
        assert abs(random_order_share(configurations, hits, trials) - held / len(orders)) < 1e-12


def test_the_recorded_landscapes_are_complete_grids() -> None:
    for path in sorted((BENCHMARKS / "landscapes").glob("*.json")):
        landscape = Landscape.read(path)
        assert sorted(landscape.results) == sorted(candidate_key(c) for c in landscape.space.every_candidate())
        assert landscape.space.default() in [dict(k) for k in landscape.results]


def test_a_misleading_study_holds_the_same_configurations_with_other_results() -> None:
    for path in sorted((BENCHMARKS / "landscapes").glob("*.json")):
        landscape = Landscape.read(path)
        for seed in range(10):
            misled = misleading(landscape, seed)
            assert sorted(misled.results) == sorted(landscape.results)  # every configuration, each once
            fastest = min(landscape.results, key=lambda k: landscape.latency(dict(k)) or float("inf"))
            assert misled.results != landscape.results and misled.profile == landscape.profile
            assert misled.name != landscape.name and fastest in misled.results


def test_a_short_replay_runs_every_strategy_on_every_landscape() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.replay", "--seeds", "2", "--samplers"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    names = sorted(p.stem for p in (BENCHMARKS / "landscapes").glob("*.json"))
    strategies, _, samplers = done.stdout.partition("by sampler")
    table = {}
    for line in strategies.splitlines():
        name, _, rest = line.partition(" ")
        if name in names:
            cells = re.findall(r"(\d+(?:\.\d+)?) / (\d+)%", rest)
            table[name] = [(float(trials), int(share)) for trials, share in cells]
    assert sorted(table) == names
    by_sampler = {line.split()[0]: re.findall(r"\d+(?:\.\d+)? \((\d+\.\d+)x\)", line) for line in samplers.splitlines()}
    header = samplers.splitlines()[1]
    assert all(len(by_sampler[name]) == len(re.split(r"\s{2,}", header.strip())) - 1 for name in names)
    for cells in table.values():  # each strategy: a median number of trials and a share of short runs
        assert len(cells) == len(STRATEGIES)
        assert all(trials >= 1 and 0 <= share <= 100 for trials, share in cells)
    verdicts = [line for line in done.stdout.splitlines() if line.endswith(("met", "NOT met"))]
    assert len(verdicts) == 6 * len(names)


def test_a_search_takes_from_landscapes_of_its_gpu_and_versions_and_on_the_cpu_of_its_processor() -> None:
    from dataclasses import replace

    gpu = Landscape.read(BENCHMARKS / "landscapes" / "mobilenetv2.json")
    assert gpu.measured_like(replace(gpu, cpu="another processor"))  # the GPU decides, the processor not
    assert not gpu.measured_like(replace(gpu, gpu="another GPU"))
    assert not gpu.measured_like(replace(gpu, versions={**gpu.versions, "onnxruntime": "0.1"}))
    cpu = Landscape.read(BENCHMARKS / "landscapes" / "mobilenetv2-cpu.json")
    assert not cpu.measured_like(replace(cpu, cpu="another processor")) and not cpu.measured_like(gpu)
