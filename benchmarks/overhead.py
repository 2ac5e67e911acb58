"""The tuner's own cost per trial: sampling, storage and the worker round trip.

Part 1 runs a study of a backend that does no work (the synthetic backend, no delay) to 500
trials with the default TPE sampler and SQLite storage, and reports the per-trial overhead near
10 and near 500 trials in the study. Overhead = trial wall time minus the time the worker spent
on the candidate itself (``eval_s``), split into sampling, worker round trip and the rest
(storage, objective bookkeeping). Part 2 runs the ONNX Runtime backend on the small CNN shipped
with the package and reports the overhead's share of trial wall time. Target: under 50 ms per
trial at 500 trials.

    python benchmarks/overhead.py [--trials 500] [--real-trials 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import optuna

import gpt_optuna.search.objective as objective_module
from gpt_optuna.core.space import Space
from gpt_optuna.search.config import TuneConfig, read_toml
from gpt_optuna.search.progress import Progress
from gpt_optuna.search.tune import tune

MODEL = Path(__file__).resolve().parent.parent / "gpt_optuna" / "data" / "small_cnn.onnx"
SYNTHETIC = "gpt_optuna.testing.synthetic:SyntheticBackend"


class Timings:
    """Per-trial timestamps and the time spent sampling and in the worker."""

    def __init__(self) -> None:
        self.sampling: dict[int, float] = {}
        self.round_trip: dict[int, float] = {}
        self.done_at: dict[int, float] = {}
        self.current = -1

    def clear(self) -> None:
        for table in (self.sampling, self.round_trip, self.done_at):
            table.clear()

    def install(self) -> None:
        suggest, run_evaluation = Space.suggest, objective_module.run_evaluation

        def timed_suggest(space: Space, trial: optuna.Trial):  # type: ignore[no-untyped-def]
            self.current = trial.number
            start = time.perf_counter()
            try:
                return suggest(space, trial)
            finally:
                self.sampling[trial.number] = time.perf_counter() - start

        def timed_run(worker, job, timeout, on_progress=lambda _: None):  # type: ignore[no-untyped-def]
            start = time.perf_counter()
            try:
                return run_evaluation(worker, job, timeout, on_progress)
            finally:
                self.round_trip[self.current] = time.perf_counter() - start

        Space.suggest = timed_suggest  # type: ignore[method-assign]
        objective_module.run_evaluation = timed_run  # type: ignore[assignment]


class Recorder(Progress):
    def __init__(self, timings: Timings) -> None:
        super().__init__(enabled=False)
        self.timings = timings

    def start(self, *args: object) -> None:
        self.timings.done_at[-1] = time.perf_counter()

    def note(self, text: str) -> None:
        pass

    def trial_done(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        self.timings.done_at[trial.number] = time.perf_counter()

    def finish(self, *args: object, **kwargs: object) -> None:
        pass


def run_study(config: TuneConfig, timings: Timings) -> list[optuna.trial.FrozenTrial]:
    tune(config, Recorder(timings), argv=[])
    return optuna.load_study(study_name=config.study_name, storage=config.storage).get_trials()


def per_trial(trials: list[optuna.trial.FrozenTrial], timings: Timings, numbers: range) -> dict[str, float]:
    """Mean milliseconds per trial over ``numbers``: wall, the worker's own work, and overhead parts."""
    rows = []
    for n in numbers:
        t = trials[n]
        wall = timings.done_at[n] - timings.done_at[n - 1]
        work = float(t.user_attrs.get("eval_s", 0.0)) if "reused_from" not in t.user_attrs else 0.0
        trip = timings.round_trip[n] - work if n in timings.round_trip else 0.0
        sampling = timings.sampling.get(n, 0.0)
        rows.append((wall, work, wall - work, sampling, trip, wall - work - sampling - trip))
    keys = ("wall", "work", "overhead", "sampling", "round_trip", "storage_and_rest")
    return {k: 1000 * statistics.fmean(r[i] for r in rows) for i, k in enumerate(keys)}


def show(label: str, figures: dict[str, float]) -> None:
    print(f"{label:<28}" + "  ".join(f"{k} {v:7.2f} ms" for k, v in figures.items()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=500)
    parser.add_argument("--real-trials", type=int, default=20)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    timings = Timings()
    timings.install()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        toml = Path(tmp) / "noop.toml"
        values = ", ".join(str(i) for i in range(60))
        toml.write_text(
            "[measure]\nbudget_s = 0.001\nmin_samples = 10\nwarmup_min = 1\n"
            f'[space]\nmode = ["ok"]\ndelay_us = [0]\nbuild_ms = [0]\na = [{values}]\nb = [{values}]\n'
        )
        config = TuneConfig(
            **read_toml(toml), model=MODEL, backend=SYNTHETIC, n_trials=args.trials, study_name="noop", seed=0
        )
        start = time.perf_counter()
        trials = run_study(config, timings)
        print(
            f"no-work backend, TPE, SQLite: {len(trials)} trials in {time.perf_counter() - start:.1f} s "
            f"({sum('reused_from' in t.user_attrs for t in trials)} reused)"
        )
        show("first trials (1-20):", per_trial(trials, timings, range(1, 21)))
        last = len(trials)
        near_end = per_trial(trials, timings, range(last - 20, last))
        show(f"near {last} trials ({last - 20}-{last - 1}):", near_end)

        timings.clear()
        real = TuneConfig(model=MODEL, n_trials=args.real_trials, study_name="real", seed=0)
        trials = run_study(real, timings)
        figures = per_trial(trials, timings, range(1, len(trials)))
        show(f"small CNN, ORT CPU ({len(trials)}):", figures)
        print(f"overhead share of trial wall time on the small CNN: {figures['overhead'] / figures['wall']:.1%}")
        verdict = "meets" if near_end["overhead"] < 50 else "MISSES"
        print(f"per-trial overhead at {last} trials: {near_end['overhead']:.1f} ms ({verdict} the 50 ms target)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
