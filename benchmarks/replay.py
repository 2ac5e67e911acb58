"""Trials each way of searching takes to a near-optimal configuration, on recorded landscapes.

The landscapes were measured exhaustively on a GPU (``benchmarks/landscapes/*.json``, written by
``record_landscapes.py``).

The tuner's strategies run through the real search: the study, its queue of baseline and seeds,
the samplers, the objective with its accuracy pruning and reuse of evaluated candidates, and the
trial loop. Only the worker process is replaced by a lookup of each candidate's recorded result
(build outcome, accuracy verdict, latency). Counted per run: the trials until the first feasible
one within 3 % of the landscape's fastest feasible configuration (the baseline is trial 1), and
whether its first 30 trials held one within 1 % (a run goes on until it knows both).

Strategies:
  random order   every configuration once, in a random order (the exact median of that sweep)
  grid           the baseline, each knob's other values one at a time, then the product of the
                 values that beat the baseline, best first (one knob at a time, then combined)
  optuna random  Optuna's RandomSampler as it is (it repeats candidates; a repeat costs a trial)
  default        the tuner's default (multivariate TPE, never a repeat) without seeds
  seeds          the default with its seeded candidate (every speed feature on)
  transfer only  the default with ``--warm-start auto`` from studies of the other landscapes
                 recorded on the same GPU with the same library versions (for a CPU landscape, on
                 the same processor)
  transfer       seeds and transfer
  misled only    the default with ``--warm-start auto`` from one earlier study that misleads: this
                 landscape with some binary knobs' values swapped at random (per run), as a study of
                 the same model (so it gives all its candidates at once), whose best are others here

Targets, per landscape: without seeds the default search at most 0.5x random order's median
trials; seeds and transfer at most 0.3x; transfer never worse than the same search without it; 90 %
of 30-trial runs of the tuner as a user starts it (seeds on) within 1 % of the fastest; and a
misleading earlier study no worse than none.

With ``--samplers``, also the default search without seeds with other samplers in TPE's place
(TPE with five start-up trials, TPE knob by knob, random without repeats, GPSampler where PyTorch
and SciPy are installed), per landscape.

    python -m benchmarks.replay [--seeds 50] [--landscapes DIR] [--within 0.03] [--trials 30 --close 0.01]
        [--samplers]
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import sys
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from math import comb
from pathlib import Path
from typing import Any

import optuna
from optuna.artifacts import FileSystemArtifactStore
from optuna.distributions import CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState

from gpt_optuna.backends.onnxruntime.backend import OnnxRuntimeBackend
from gpt_optuna.core.errors import MissingDependencyError
from gpt_optuna.core.measure_settings import MeasureSettings
from gpt_optuna.core.space import Candidate, CandidateKey, Space, Value, candidate_key
from gpt_optuna.graph.model_profile import ModelProfile
from gpt_optuna.protocol.accuracy import Verdict, parse_criterion
from gpt_optuna.protocol.jobs import EvaluateJob
from gpt_optuna.protocol.outcome import Outcome, TrialResult
from gpt_optuna.protocol.timing import LatencyStats
from gpt_optuna.search.config import TuneConfig
from gpt_optuna.search.lanes import TrialBudget, run_lanes
from gpt_optuna.search.objective import Lane, Objective
from gpt_optuna.search.sampling import FreshSampler, check_sampler, is_transform_knob, make_sampler
from gpt_optuna.search.transfer import TransferQueue
from gpt_optuna.study.record import FINGERPRINT_ATTR
from gpt_optuna.study.resume import open_study
from gpt_optuna.usecases.tune import first_candidates

STRATEGIES = ("random order", "grid", "optuna random", "default", "seeds", "transfer only", "transfer", "misled only")
WARM_STARTED = ("transfer only", "transfer", "misled only")
UNSEEDED_TARGET = 0.5
"""The default search without seeds: at most this times random order's median trials."""
SEEDED_TARGET = 0.3
"""Seeds and transfer: at most this times random order's median trials."""
SHARE_TARGET = 0.9
"""The share of short runs of the tuner as a user starts it (seeds on) that end close to the fastest."""


def _tpe(multivariate: bool, startup: int) -> Callable[[int], optuna.samplers.BaseSampler]:
    def make(seed: int) -> optuna.samplers.BaseSampler:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(
                seed=seed, multivariate=multivariate, n_startup_trials=startup, constant_liar=True
            )

    return make


def other_samplers() -> dict[str, Callable[[int], optuna.samplers.BaseSampler]]:
    """Base samplers compared with the default's (``--samplers``), each made from a seed: TPE with
    five start-up trials (the default before), TPE knob by knob, random without repeats, and
    GPSampler where PyTorch and SciPy are installed."""
    samplers = {
        "tpe, 5 start-up": _tpe(multivariate=True, startup=5),
        "tpe, knob by knob": _tpe(multivariate=False, startup=2),
        "random, no repeats": lambda seed: optuna.samplers.RandomSampler(seed=seed),
    }
    try:
        check_sampler("gp")
    except MissingDependencyError:
        return samplers
    return samplers | {"gp": lambda seed: optuna.samplers.GPSampler(seed=seed)}


@dataclass(frozen=True)
class RunResult:
    """One replayed run: the trials to the first hit, and whether the first ``trials`` held a close one."""

    trials_to_hit: int
    close_in_budget: bool


@dataclass
class Landscape:
    """One model's recorded space and the result of each of its configurations."""

    name: str
    gpu: str
    cpu: str
    versions: dict[str, str]
    criterion: str
    profile: ModelProfile
    space: Space
    results: dict[CandidateKey, TrialResult]

    @classmethod
    def read(cls, path: Path) -> Landscape:
        data = json.loads(path.read_text())
        results = {candidate_key(t["params"]): _result(t) for t in data["trials"]}
        space = Space.from_record(data["space"])
        cpu = data.get("cpu", "")  # recorded since the CPU landscapes
        profile = ModelProfile.from_record(data.get("profile"))
        if profile is None:
            raise SystemExit(f"{path} has no model profile (recorded before profiles were): record it again")
        return cls(data["model"], data["gpu"], cpu, data["versions"], data["criterion"], profile, space, results)

    def measured_like(self, other: Landscape) -> bool:
        """Whether ``other`` was recorded on the same GPU with the same library versions (on the
        same processor where there is no GPU): only then may a search of this one take
        configurations from it."""
        same = (self.gpu, self.versions) == (other.gpu, other.versions)
        return same and (self.on_gpu or self.cpu == other.cpu)

    @property
    def on_gpu(self) -> bool:
        return self.gpu != "cpu"  # the device a CPU landscape records

    def latency(self, candidate: Candidate) -> float | None:
        """The median latency of a feasible configuration; None for any other."""
        return _ok_ms(self.results[candidate_key(candidate)])

    def good_enough(self, within: float) -> Callable[[float | None], bool]:
        best = min(ms for r in self.results.values() if (ms := _ok_ms(r)) is not None)
        return lambda ms: ms is not None and ms <= best * (1 + within)

    def hits(self, good: Callable[[float | None], bool]) -> int:
        return sum(good(self.latency(dict(k))) for k in self.results)


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


def random_order_share(configurations: int, hits: int, trials: int) -> float:
    """The chance that the first ``trials`` of a random order hold a hit."""
    if trials >= configurations:
        return 1.0 if hits else 0.0
    return 1.0 - comb(configurations - hits, trials) / comb(configurations, trials)


def grid(landscape: Landscape) -> list[Candidate]:
    """The one-knob-at-a-time sweep around the baseline, then the product of its winners, best first."""
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
    return tried


def first_hit(landscape: Landscape, order: list[Candidate], hit: Callable[[float | None], bool]) -> int:
    """The trials of a fixed order until a hit (one more than the landscape holds: none)."""
    return next((i for i, c in enumerate(order, 1) if hit(landscape.latency(c))), len(landscape.results) + 1)


def misleading(landscape: Landscape, seed: int) -> Landscape:
    """``landscape`` with the values of some of its binary knobs swapped (at least one, picked by
    ``seed``; only those whose swap maps the recorded grid onto itself, not one that decides
    whether a knob of several values is searched): an earlier study of the same model whose best
    configurations are others here."""
    rng = random.Random(seed)

    def swap(key: CandidateKey, swapped: dict[str, tuple[Value, ...]]) -> CandidateKey:
        values = {n: swapped[n][1 - swapped[n].index(v)] if n in swapped else v for n, v in key}
        return candidate_key(landscape.space.fitted(values))  # a knob active only with the other value comes or goes

    binary = [  # as the landscape searched them
        k
        for k in landscape.space.knobs
        if len(k.search_choices) == 2
        and {swap(key, {k.name: k.search_choices}) for key in landscape.results} == landscape.results.keys()
    ]
    swapped = {k.name: k.search_choices for k in binary if rng.random() < 0.5} or {
        (k := rng.choice(binary)).name: k.search_choices
    }
    results = {swap(key, swapped): result for key, result in landscape.results.items()}
    return replace(landscape, name=f"{landscape.name}-misleading", results=results)


def earlier_study(storage: optuna.storages.BaseStorage, landscape: Landscape) -> None:
    """A finished study of ``landscape`` in ``storage``: its baseline, then every configuration."""
    study = optuna.create_study(storage=storage, study_name=landscape.name)
    study.set_user_attr(FINGERPRINT_ATTR, {"backend": "onnxruntime", "model_profile": landscape.profile.to_record()})
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
                user_attrs={"gpu": landscape.gpu, "baseline": k == baseline}
                | ({"latency": {"median_ms": ms}} if ms is not None else {}),
            )
        )


def search(
    landscape: Landscape,
    others: list[Landscape],
    strategy: str,
    seed: int,
    hit: Callable[[float | None], bool],
    close: Callable[[float | None], bool],
    trials: int,
    folder: Path,
    base: optuna.samplers.BaseSampler | None = None,
) -> RunResult:
    """Trials the tuner takes to a hit with ``strategy``, through its real search loop, and
    whether its first ``trials`` held a close one; ``base``: another sampler in the default's
    place (wrapped as the tuner wraps its own, never repeating a candidate)."""
    storage = optuna.storages.InMemoryStorage()
    earlier = [misleading(landscape, seed)] if strategy == "misled only" else others
    for other in earlier if strategy in WARM_STARTED else []:
        earlier_study(storage, other)
    space = landscape.space
    config = TuneConfig(
        model=folder / "model.onnx",
        accuracy=landscape.criterion,
        study_name=landscape.name,
        sampler="random" if strategy == "optuna random" else "tpe",
        seed=seed,
        no_seeds=strategy not in ("seeds", "transfer"),
        warm_start="auto" if strategy in WARM_STARTED else None,
    )
    if strategy == "optuna random":
        sampler: optuna.samplers.BaseSampler = optuna.samplers.RandomSampler(seed=seed)
    elif base is not None:
        sampler = FreshSampler(base, space, is_transform_knob, seed)
    else:
        sampler = make_sampler(config.sampler, seed, space)
    seeds, warm = first_candidates(config, space, landscape.profile, OnnxRuntimeBackend(), storage, landscape.gpu, [])
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
    fresh = sampler if isinstance(sampler, FreshSampler) else None
    objective = Objective(space, job, 600.0, FileSystemArtifactStore(str(folder)), sampler=fresh)
    lane = Lane(0, LookupWorker(landscape), None, landscape.gpu)
    cap = 3 * len(landscape.results)
    budget = TrialBudget(study, cap, None, sampler=fresh)
    transfer = TransferQueue.of(warm, budget.has_room)
    transfer.update(study)
    found: list[int] = []
    near: list[int] = []

    def on_trial(ended: optuna.Study, trial: FrozenTrial) -> None:
        transfer.update(ended)
        count = trial.number + 1
        if trial.state is TrialState.COMPLETE:
            if hit(trial.values[0]):
                found.append(count)
            if close(trial.values[0]):
                near.append(count)
        if found and (near or count >= trials):
            budget.stop()

    run_lanes(sampler, [lane], objective, budget, on_trial)
    return RunResult(min(found, default=cap + 1), min(near, default=cap + 1) <= trials)


def verdicts(name: str, medians: dict[str, float], shares: dict[str, float]) -> list[str]:
    """Each target met or not on one landscape, with its figures."""
    random = medians["random order"]
    checks = [
        (
            f"default without seeds {medians['default'] / random:.2f}x random order",
            medians["default"] <= UNSEEDED_TARGET * random,
            f"<= {UNSEEDED_TARGET}x",
        ),
        (
            f"seeds and transfer {medians['transfer'] / random:.2f}x",
            medians["transfer"] <= SEEDED_TARGET * random,
            f"<= {SEEDED_TARGET}x",
        ),
        (
            f"transfer only {medians['transfer only']:g} vs default {medians['default']:g} trials",
            medians["transfer only"] <= medians["default"],
            "no worse",
        ),
        (
            f"seeds and transfer {medians['transfer']:g} vs seeds {medians['seeds']:g} trials",
            medians["transfer"] <= medians["seeds"],
            "no worse",
        ),
        (
            f"misled only {medians['misled only']:g} vs default {medians['default']:g} trials",
            medians["misled only"] <= medians["default"],
            "no worse",
        ),
        (
            f"seeds: {shares['seeds']:.0%} of short runs close",
            shares["seeds"] >= SHARE_TARGET,
            f">= {SHARE_TARGET:.0%}",
        ),
    ]
    return [f"{name}: {text} ({target}): {'met' if met else 'NOT met'}" for text, met, target in checks]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=50, help="runs per strategy and landscape")
    parser.add_argument("--landscapes", type=Path, default=Path(__file__).resolve().parent / "landscapes")
    parser.add_argument("--within", type=float, default=0.03, help="a hit: this close to the fastest (0.03: 3 %%)")
    parser.add_argument("--trials", type=int, default=30, help="the short run's trials")
    parser.add_argument("--close", type=float, default=0.01, help="where a short run should end (0.01: 1 %%)")
    parser.add_argument("--samplers", action="store_true", help="also the default search with other samplers")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    landscapes = [Landscape.read(p) for p in sorted(args.landscapes.glob("*.json"))]
    if not landscapes:
        sys.exit(f"no landscapes in {args.landscapes}: record them with python -m benchmarks.record_landscapes")
    header = f"{'landscape':<14}{'configs':>8}{'hits':>6}" + "".join(f"{s:>15}" for s in STRATEGIES)
    lines = [
        f"median trials to within {args.within:.0%} of the fastest over {args.seeds} runs, and the share of "
        f"{args.trials}-trial runs that reached {args.close:.0%} of it",
        header,
    ]
    targets: list[str] = []
    compared: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for landscape in landscapes:
            hit, close = landscape.good_enough(args.within), landscape.good_enough(args.close)
            others = [o for o in landscapes if o is not landscape and o.measured_like(landscape)]
            configurations, hits = len(landscape.results), landscape.hits(hit)
            order = grid(landscape)
            medians: dict[str, float] = {
                "random order": random_order(configurations, hits),
                "grid": first_hit(landscape, order, hit),
            }
            shares: dict[str, float] = {
                "random order": random_order_share(configurations, landscape.hits(close), args.trials),
                "grid": float(first_hit(landscape, order, close) <= args.trials),
            }
            for strategy in STRATEGIES[2:]:
                runs = [
                    search(landscape, others, strategy, s, hit, close, args.trials, Path(tmp))
                    for s in range(args.seeds)
                ]
                medians[strategy] = statistics.median(r.trials_to_hit for r in runs)
                shares[strategy] = sum(r.close_in_budget for r in runs) / len(runs)
                print(
                    f"{landscape.name} {strategy}: {sorted(r.trials_to_hit for r in runs)}", file=sys.stderr, flush=True
                )
            lines.append(
                f"{landscape.name:<14}{configurations:>8}{hits:>6}"
                + "".join(f"{f'{medians[s]:g} / {shares[s]:.0%}':>15}" for s in STRATEGIES)
            )
            targets += verdicts(landscape.name, medians, shares)
            if args.samplers:
                compared.append(compare_samplers(landscape, medians, args.seeds, hit, close, args.trials, Path(tmp)))
    print("\n".join([*lines, "", "targets:", *targets]))
    if compared:
        names = ["default", *other_samplers()]
        print(f"\nthe default search without seeds, by sampler: median trials (x random order) over {args.seeds} runs")
        print(f"{'landscape':<20}" + "".join(f"{n:>20}" for n in names))
        print("\n".join(compared))


def compare_samplers(
    landscape: Landscape,
    medians: dict[str, float],
    seeds: int,
    hit: Callable[[float | None], bool],
    close: Callable[[float | None], bool],
    trials: int,
    folder: Path,
) -> str:
    """One landscape's row of the sampler table: the default search with each sampler in its
    place, median trials to a hit and the ratio to random order's."""
    found = {"default": medians["default"]}
    for name, make in other_samplers().items():
        runs = [search(landscape, [], "default", s, hit, close, trials, folder, make(s)) for s in range(seeds)]
        found[name] = statistics.median(r.trials_to_hit for r in runs)
    random = medians["random order"]
    return f"{landscape.name:<20}" + "".join(f"{f'{m:g} ({m / random:.2f}x)':>20}" for m in found.values())


if __name__ == "__main__":
    main()
