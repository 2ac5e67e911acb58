"""Trials each way of searching takes to a near-optimal configuration, on recorded landscapes.

The landscapes were measured exhaustively on a GPU (``benchmarks/landscapes/*.json``, written by
``record_landscapes.py``).

The tuner's strategies run through the real search: the study, its queue of baseline and seeds,
the samplers, the objective with its accuracy pruning and reuse of evaluated candidates, and the
trial loop. Only the worker process is replaced by a lookup of each candidate's recorded result
(build outcome, accuracy verdict, latency). Counted per run: the trials until the first feasible
one within 3 % of the landscape's fastest feasible configuration (the baseline is trial 1).

Strategies:
  random order   every configuration once, in a random order (the exact median of that sweep)
  grid           the baseline, each knob's other values one at a time, then the product of the
                 values that beat the baseline, best first (one knob at a time, then combined)
  optuna random  Optuna's RandomSampler as it is (it repeats candidates; a repeat costs a trial)
  default        the tuner's default (multivariate TPE, never a repeat) without seeds
  seeds          the default with its seeded candidate (every speed feature on)
  transfer only  the default with ``--warm-start auto`` from studies of the other landscapes
                 recorded on the same GPU (or none) and processor with the same library versions
  transfer       seeds and transfer

    python benchmarks/replay.py [--seeds 50] [--landscapes DIR] [--within 0.03]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from math import comb
from pathlib import Path
from typing import Any

import optuna
from optuna.artifacts import FileSystemArtifactStore
from optuna.distributions import CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState

from gpt_optuna.backends.onnxruntime.backend import OnnxRuntimeBackend
from gpt_optuna.core.space import Candidate, CandidateKey, Space, Value, candidate_key
from gpt_optuna.evaluation.accuracy import Verdict, parse_criterion
from gpt_optuna.evaluation.jobs import EvaluateJob
from gpt_optuna.evaluation.measure import LatencyStats, MeasureSettings
from gpt_optuna.evaluation.outcome import Outcome, TrialResult
from gpt_optuna.search.config import TuneConfig
from gpt_optuna.search.lanes import TrialBudget, run_lanes
from gpt_optuna.search.objective import Lane, Objective
from gpt_optuna.search.sampling import make_sampler
from gpt_optuna.search.tune import first_candidates
from gpt_optuna.study.record import FINGERPRINT_ATTR
from gpt_optuna.study.resume import open_study

STRATEGIES = ("random order", "grid", "optuna random", "default", "seeds", "transfer only", "transfer")
TARGET_RATIO = 0.4
"""The target: transfer at most this times random order's median trials, and never above grid."""


@dataclass
class Landscape:
    """One model's recorded space and the result of each of its configurations."""

    name: str
    gpu: str
    cpu: str
    versions: dict[str, str]
    criterion: str
    space: Space
    results: dict[CandidateKey, TrialResult]

    @classmethod
    def read(cls, path: Path) -> Landscape:
        data = json.loads(path.read_text())
        results = {candidate_key(t["params"]): _result(t) for t in data["trials"]}
        space = Space.from_record(data["space"])
        cpu = data.get("cpu", "")  # recorded since the CPU landscapes
        return cls(data["model"], data["gpu"], cpu, data["versions"], data["criterion"], space, results)

    def measured_like(self, other: Landscape) -> bool:
        """Whether ``other`` was recorded on the same GPU (or none) and processor with the same
        library versions: only then may a search of this one take configurations from it."""
        return (self.gpu, self.cpu, self.versions) == (other.gpu, other.cpu, other.versions)

    def latency(self, candidate: Candidate) -> float | None:
        """The median latency of a feasible configuration; None for any other."""
        return _ok_ms(self.results[candidate_key(candidate)])

    def good_enough(self, within: float) -> Callable[[float | None], bool]:
        best = min(ms for r in self.results.values() if (ms := _ok_ms(r)) is not None)
        return lambda ms: ms is not None and ms <= best * (1 + within)


def _ok_ms(result: TrialResult) -> float | None:
    return result.latency.median_ms if result.outcome is Outcome.OK and result.latency else None


def _result(trial: dict[str, Any]) -> TrialResult:
    """The TrialResult the worker returned for a recorded trial."""
    outcome = Outcome(trial["outcome"])
    verdict = None
    if trial["accuracy"] is not None:
        constraint = trial["constraints"].get("accuracy", 0.0)
        verdict = Verdict(outcome is Outcome.OK, trial["detail"], trial["accuracy"], constraint)
    latency = LatencyStats(**trial["latency"]) if trial["latency"] else None
    return TrialResult(outcome, trial["detail"], latency, verdict, trial["build_s"])


class LookupWorker:
    """Stands in for the worker process: answers each evaluation job with the recorded result."""

    def __init__(self, landscape: Landscape) -> None:
        self.landscape = landscape

    def run(
        self, job: EvaluateJob, timeout: float | None, on_progress: Callable[[str], None] = lambda _: None
    ) -> TrialResult:
        return self.landscape.results[candidate_key(job.candidate)]


def random_order(configurations: int, hits: int) -> int:
    """The median trials to the first hit when every configuration is tried once in a random
    order: the least k with P(no hit in k) = C(n - h, k) / C(n, k) <= 1/2."""
    return next(
        k for k in range(1, configurations + 1) if comb(configurations - hits, k) * 2 <= comb(configurations, k)
    )


def grid(landscape: Landscape, hit: Callable[[float | None], bool]) -> int:
    """Trials of the one-knob-at-a-time sweep, then the product of its winners, until a hit."""
    space = landscape.space
    baseline = space.default()
    tried: list[Candidate] = [baseline]
    base_ms = landscape.latency(baseline)
    winners: dict[str, list[tuple[float, Value]]] = {}
    for knob in space.knobs:
        for value in knob.search_choices:
            if value == knob.default or knob.name not in baseline:
                continue
            candidate = space.fitted({**baseline, knob.name: value})
            tried.append(candidate)
            ms = landscape.latency(candidate)
            if ms is not None and (base_ms is None or ms < base_ms):
                winners.setdefault(knob.name, []).append((ms, value))
    names = list(winners)
    choices = [[v for _, v in sorted(winners[n])] + [baseline[n]] for n in names]
    for values in itertools.product(*choices):
        candidate = space.fitted({**baseline, **dict(zip(names, values, strict=True))})
        if candidate not in tried:
            tried.append(candidate)
    return next((i for i, c in enumerate(tried, 1) if hit(landscape.latency(c))), len(landscape.results) + 1)


def earlier_study(storage: optuna.storages.BaseStorage, landscape: Landscape) -> None:
    """A finished study of ``landscape`` in ``storage``: its baseline, then every configuration."""
    study = optuna.create_study(storage=storage, study_name=landscape.name)
    study.set_user_attr(FINGERPRINT_ATTR, {"backend": "onnxruntime"})
    distributions = {k.name: CategoricalDistribution(k.choices) for k in landscape.space.knobs}
    baseline = candidate_key(landscape.space.default())
    for k in sorted(landscape.results, key=lambda k: k != baseline):
        result, params = landscape.results[k], dict(k)
        ms = _ok_ms(result)
        study.add_trial(
            optuna.trial.create_trial(
                state=TrialState.COMPLETE if ms is not None else TrialState.PRUNED,
                value=ms,
                params=params,
                distributions={n: distributions[n] for n in params},
                user_attrs={"gpu": landscape.gpu, "baseline": k == baseline},
            )
        )


def search(
    landscape: Landscape,
    others: list[Landscape],
    strategy: str,
    seed: int,
    hit: Callable[[float | None], bool],
    folder: Path,
) -> int:
    """Trials the tuner takes to a hit with ``strategy``, through its real search loop."""
    storage = optuna.storages.InMemoryStorage()
    if strategy.startswith("transfer"):
        for other in others:
            earlier_study(storage, other)
    space = landscape.space
    config = TuneConfig(
        model=folder / "model.onnx",
        accuracy=landscape.criterion,
        study_name=landscape.name,
        sampler="random" if strategy == "optuna random" else "tpe",
        seed=seed,
        no_seeds=strategy not in ("seeds", "transfer"),
        warm_start="auto" if strategy.startswith("transfer") else None,
    )
    sampler = (
        optuna.samplers.RandomSampler(seed=seed)
        if strategy == "optuna random"
        else make_sampler(config.sampler, seed, space)
    )
    seeds = first_candidates(config, space, OnnxRuntimeBackend(), storage, landscape.gpu, [])
    study, _ = open_study(storage, landscape.name, sampler, {"backend": "onnxruntime"}, space.default(), 1, seeds)
    job = EvaluateJob(  # the lookup reads the candidate alone: no model, inputs or reference files
        backend="onnxruntime",
        model=None,
        candidate={},
        workdir=folder,
        shapes={},
        feeds_path=folder,
        reference_path=folder,
        criterion=parse_criterion(landscape.criterion),
        settings=MeasureSettings(),
    )
    objective = Objective(space, job, 600.0, FileSystemArtifactStore(str(folder)))
    lane = Lane(0, LookupWorker(landscape), None, landscape.gpu)
    cap = 3 * len(landscape.results)
    budget = TrialBudget(study, cap, None)
    found: list[int] = []

    def on_trial(_: optuna.Study, trial: FrozenTrial) -> None:
        if trial.state is TrialState.COMPLETE and hit(trial.values[0]):
            found.append(trial.number + 1)
            budget.stop()

    run_lanes(landscape.name, storage, sampler, [lane], objective, budget, on_trial)
    return min(found, default=cap + 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=50, help="runs per strategy and landscape")
    parser.add_argument("--landscapes", type=Path, default=Path(__file__).resolve().parent / "landscapes")
    parser.add_argument("--within", type=float, default=0.03, help="a hit: this close to the fastest (0.03: 3 %%)")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    landscapes = [Landscape.read(p) for p in sorted(args.landscapes.glob("*.json"))]
    if not landscapes:
        sys.exit(f"no landscapes in {args.landscapes}: record them with benchmarks/record_landscapes.py")
    header = f"{'landscape':<14}{'configs':>8}{'hits':>6}" + "".join(f"{s:>15}" for s in STRATEGIES)
    lines = [f"median trials to within {args.within:.0%} of the fastest, over {args.seeds} runs", header]
    verdicts = []
    with tempfile.TemporaryDirectory() as tmp:
        for landscape in landscapes:
            hit = landscape.good_enough(args.within)
            others = [o for o in landscapes if o is not landscape and o.measured_like(landscape)]
            hits = sum(hit(landscape.latency(dict(k))) for k in landscape.results)
            medians: dict[str, float] = {
                "random order": random_order(len(landscape.results), hits),
                "grid": grid(landscape, hit),
            }
            for strategy in STRATEGIES[2:]:
                runs = [search(landscape, others, strategy, s, hit, Path(tmp)) for s in range(args.seeds)]
                medians[strategy] = statistics.median(runs)
                print(f"{landscape.name} {strategy}: {sorted(runs)}", file=sys.stderr, flush=True)
            lines.append(
                f"{landscape.name:<14}{len(landscape.results):>8}{hits:>6}"
                + "".join(f"{medians[s]:>15g}" for s in STRATEGIES)
            )
            ratio = medians["transfer"] / medians["random order"]
            met = ratio <= TARGET_RATIO and medians["transfer"] <= medians["grid"]
            verdicts.append(
                f"{landscape.name}: transfer {ratio:.2f}x random order, {medians['transfer']:g} vs grid "
                f"{medians['grid']:g} trials: {'met' if met else 'NOT met'}"
            )
    print("\n".join([*lines, "", f"target (transfer <= {TARGET_RATIO}x random order, <= grid):", *verdicts]))


if __name__ == "__main__":
    main()
