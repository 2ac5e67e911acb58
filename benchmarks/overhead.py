"""The tuner's own cost per trial: sampling, storage and the worker round trip.

Part 1 runs a study of a backend that does no work (the synthetic backend, no delay) to 500
trials with the default TPE sampler and SQLite storage, and reports the per-trial overhead near
10 and near 500 trials in the study. Overhead = trial wall time minus the time the worker spent
on the candidate itself (``eval_s``), split where the worker's result reached the tuner: before
(sampling, the worker round trip) and after (storing the result), timed by the tuner's own
progress callbacks, nothing of the tuner patched; the sampler's own proposal time is timed apart,
on a copy of the study's trials. Part 2 runs
the ONNX Runtime backend on the small CNN shipped with the package and reports the overhead's
share of trial wall time. Target: under 50 ms per trial at 500 trials.

    python -m benchmarks.overhead [--trials 500] [--real-trials 20]
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

from gpt_optuna.core.space import Candidate, Space
from gpt_optuna.protocol.outcome import TrialResult
from gpt_optuna.search.config import TuneConfig, read_toml
from gpt_optuna.search.sampling import make_sampler
from gpt_optuna.study.record import SPACE_ATTR
from gpt_optuna.usecases.progress import Progress
from gpt_optuna.usecases.tune import tune
from gpt_optuna.worker.self_test import TINY_MODEL

MODEL = TINY_MODEL
SYNTHETIC = "gpt_optuna.testing.synthetic:SyntheticBackend"


class Timings:
    """Per-trial timestamps in the tuner: when each trial's result arrived from the worker, and
    when the trial was stored as done."""

    def __init__(self) -> None:
        self.result_at: dict[int, float] = {}
        self.done_at: dict[int, float] = {}

    def clear(self) -> None:
        self.result_at.clear()
        self.done_at.clear()


class Recorder(Progress):
    """The tuner's own progress callbacks, timestamping each trial."""

    def __init__(self, timings: Timings) -> None:
        super().__init__(enabled=False)
        self.timings = timings

    def start(self, *args: object) -> None:
        self.timings.done_at[-1] = time.perf_counter()

    def note(self, text: str) -> None:
        pass

    def result(self, number: int, candidate: Candidate, result: TrialResult | None) -> None:
        self.timings.result_at[number] = time.perf_counter()

    def trial_done(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        self.timings.done_at[trial.number] = time.perf_counter()


def run_study(config: TuneConfig, timings: Timings) -> optuna.Study:
    tune(config, Recorder(timings))
    return optuna.load_study(study_name=config.study_name, storage=config.storage)


def sampling_ms(study: optuna.Study, sampler_name: str, number: int, folder: Path) -> float:
    """Milliseconds the study's sampler takes to propose a trial after the first ``number`` trials:
    a copy of those trials in a fresh SQLite study, asked once to warm it up (that proposal is
    failed), then asked again and timed, every knob suggested."""
    space = Space.from_record(study.user_attrs[SPACE_ATTR])
    storage = f"sqlite:///{folder / f'sampling-{number}.db'}"
    copy = optuna.create_study(storage=storage, sampler=make_sampler(sampler_name, 0, space))
    copy.add_trials(study.get_trials(deepcopy=False)[:number])
    warm_up = copy.ask()
    space.suggest(warm_up)
    copy.tell(warm_up, state=optuna.trial.TrialState.FAIL)
    start = time.perf_counter()
    space.suggest(copy.ask())
    return 1000 * (time.perf_counter() - start)


def per_trial(study: optuna.Study, timings: Timings, numbers: range) -> dict[str, float]:
    """Mean milliseconds per trial over ``numbers``: wall, the worker's own work, and the overhead
    split at the moment the worker's result reached the tuner: before it (sampling, sending the job,
    receiving the result) and after it (storing the result, ending the trial)."""
    trials = study.get_trials(deepcopy=False)
    rows = []
    for n in numbers:
        t = trials[n]
        wall = timings.done_at[n] - timings.done_at[n - 1]
        work = float(t.user_attrs.get("eval_s", 0.0)) if "reused_from" not in t.user_attrs else 0.0
        arrived = timings.result_at.get(n, timings.done_at[n])
        rows.append((wall, work, wall - work, arrived - timings.done_at[n - 1] - work, timings.done_at[n] - arrived))
    keys = ("wall", "work", "overhead", "to_result", "after_result")
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
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        folder = Path(tmp)
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
        study = run_study(config, timings)
        trials = study.get_trials(deepcopy=False)
        print(
            f"no-work backend, TPE, SQLite: {len(trials)} trials in {time.perf_counter() - start:.1f} s "
            f"({sum('reused_from' in t.user_attrs for t in trials)} reused)"
        )
        first = range(1, min(21, len(trials)))
        show(f"first trials ({first.start}-{first.stop - 1}):", per_trial(study, timings, first))
        last = len(trials)
        window = range(max(1, last - 20), last)
        near_end = per_trial(study, timings, window)
        show(f"near {last} trials ({window.start}-{window.stop - 1}):", near_end)
        for number in sorted({first.stop - 1, last - 1}):
            took = sampling_ms(study, config.sampler, number, folder)
            print(f"the sampler's proposal after {number} trials (a copy of the study, SQLite): {took:.1f} ms")

        timings.clear()
        real = TuneConfig(model=MODEL, n_trials=args.real_trials, study_name="real", seed=0)
        study = run_study(real, timings)
        figures = per_trial(study, timings, range(1, len(study.trials)))
        show(f"small CNN, ORT CPU ({len(study.trials)}):", figures)
        print(f"overhead share of trial wall time on the small CNN: {figures['overhead'] / figures['wall']:.1%}")
        verdict = "meets" if near_end["overhead"] < 50 else "MISSES"
        print(f"per-trial overhead at {last} trials: {near_end['overhead']:.1f} ms ({verdict} the 50 ms target)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
