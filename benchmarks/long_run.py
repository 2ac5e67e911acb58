"""The tuner's cost per trial as its study grows, beside plain Optuna's TPE on the same storage.

One study of the synthetic backend (a 10,800-candidate space: delays of 0-89 us and three inert
knobs) is grown by ``tune`` to each size in turn (each stage resumes it with a larger trial
target), and right after each stage, in the same run, a plain Optuna study with the same
distributions, the same SQLite settings and the sampler the tuner wraps (``--sampler``: TPE as the
tuner configures it, or random), seeded, is grown by ``study.optimize`` to the same size with an
objective that returns at once (side by side: a busy host slows both alike). Each row
gives, over the last ``--window`` trials before that size, the tuner's overhead per trial (its
wall time less the worker's own work, as ``overhead.py`` measures it), plain Optuna's time per
trial and their ratio (both the median of the window), how long ``gpt-optuna status`` and
``best`` take on the tuner's study then (the whole command, the interpreter's start and imports
included; the median of three runs), and of ``status`` the part that reads the study (opening it
and its summary in words, in this process); each stage says where its candidates came from. Then
a search of a 20-candidate space asked for 100 trials, and resumed: where each ends.

    python benchmarks/long_run.py [--sizes 10,100,1000,5000] [--window 20] [--sampler tpe|random]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import optuna
from overhead import MODEL, SYNTHETIC, Recorder, Timings, per_trial

import gpt_optuna
from gpt_optuna.core.space import Space
from gpt_optuna.search.config import TuneConfig, read_toml
from gpt_optuna.search.sampling import base_sampler
from gpt_optuna.search.tune import tune
from gpt_optuna.study.record import PROPOSED_ATTR, SPACE_ATTR
from gpt_optuna.study.storage import open_storage

SPACE = """[measure]
budget_s = 0.005
min_samples = 3
[space]
mode = "ok"
build_ms = [0]
delay_us = [{delays}]
a = [0, 1, 2, 3, 4]
"""
"""90 delays x 5 x 8 (b) x 3 (c): 10,800 candidates."""
SMALL_SPACE = SPACE.replace("[{delays}]", "[0, 1, 2, 3, 4]").replace(
    "a = [0, 1, 2, 3, 4]", 'a = [0, 1]\nb = [0, 1]\nc = ["x"]'
)
"""5 delays x 2 x 2 x 1: 20 candidates."""


class PlainOptuna:
    """A plain Optuna study of the same space, storage settings and sampler (as the tuner configures
    it), grown stage by stage beside the tuner's, with an objective that returns at once."""

    def __init__(self, url: str, space: Space, sampler: str) -> None:
        self.study = optuna.create_study(storage=open_storage(url), sampler=base_sampler(sampler, 0))
        self.space = space
        self.ended: list[float] = [time.perf_counter()]

    def grow(self, size: int, window: int) -> float:
        """Grow the study to ``size`` trials; milliseconds per trial, the median of the last ``window``."""

        def objective(trial: optuna.Trial) -> float:
            return float(self.space.suggest(trial)["delay_us"])

        self.ended.append(time.perf_counter())  # the stage's first trial starts here
        callbacks = [lambda _, __: self.ended.append(time.perf_counter())]
        self.study.optimize(objective, n_trials=size - len(self.study.trials), callbacks=callbacks)
        gaps = [b - a for a, b in zip(self.ended[-window - 1 : -1], self.ended[-window:], strict=True)]
        return 1000 * statistics.median(gaps)


def overhead_ms(study: optuna.Study, timings: Timings, numbers: range) -> list[float]:
    """The tuner's overhead in each trial: its wall time less the worker's own work (``eval_s``)."""
    return [per_trial(study, timings, range(n, n + 1))["overhead"] for n in numbers]


def command_s(*args: str) -> float:
    """Seconds a ``gpt-optuna`` command takes, start to end: the median of three runs."""
    runs = []
    for _ in range(3):
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "gpt_optuna.cli", *args], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def reading_ms(storage: str, name: str) -> float:
    """Milliseconds ``status`` spends on the study itself, in this process: opening it, its summary
    in words (the median of three)."""
    runs = []
    for _ in range(3):
        start = time.perf_counter()
        str(gpt_optuna.load(storage, name))
        runs.append(time.perf_counter() - start)
    return 1000 * statistics.median(runs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,100,1000,5000", help="study sizes, comma-separated, increasing")
    parser.add_argument("--sampler", default="tpe", choices=("tpe", "random"), help="the sampler of both searches")
    parser.add_argument("--window", type=int, default=20, help="trials before each size whose median is shown")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    # a stage's window holds its own trials but the first (whose time includes the tuner's start)
    windows = [min(args.window, b - a - 1) for a, b in zip([0, *sizes[:-1]], sizes, strict=True)]
    if min(windows) < 1:
        parser.error("each size must exceed the one before it by 2 trials or more")
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    os.chdir(tempfile.mkdtemp(prefix="long-run-"))
    Path("tune.toml").write_text(SPACE.format(delays=", ".join(map(str, range(90)))))
    values = read_toml(Path("tune.toml"))
    config = TuneConfig(
        model=MODEL, backend=SYNTHETIC, confirm_top=0, seed=0, study_name="long", sampler=args.sampler, **values
    )
    where = ["--storage", str(config.storage), "--study-name", "long"]
    timings, rows, plain = Timings(), [], None
    for size, window in zip(sizes, windows, strict=True):
        timings.clear()
        tune(replace(config, n_trials=size), Recorder(timings))
        study = optuna.load_study(study_name="long", storage=config.storage)
        tuner = statistics.median(overhead_ms(study, timings, range(size - window, size)))
        space, came_from = Space.from_record(study.user_attrs[SPACE_ATTR]), sources(study, size)
        del study  # its copy of the trials would weigh on the next searches' memory
        plain = plain or PlainOptuna("sqlite:///plain.db", space, args.sampler)
        plain_ms = plain.grow(size, window)  # right after the tuner's stage: the host as it is now
        status = command_s("status", *where)
        rows.append((size, tuner, plain_ms, status, command_s("best", *where), reading_ms(str(config.storage), "long")))
        print(f"{size} trials: the tuner {tuner:.1f} ms per trial; {came_from}", flush=True)
    print(f"\n trials  tuner ms/trial  plain {args.sampler} ms/trial  ratio  status s  best s  reading ms")
    for size, tuner, optuna_ms, status_s, best_s, read_ms in rows:
        ratio = tuner / optuna_ms
        print(
            f"{size:>7}  {tuner:>14.1f}  {optuna_ms:>18.1f}  {ratio:>5.2f}  {status_s:>8.2f}  {best_s:>6.2f}"
            f"  {read_ms:>10.1f}"
        )
    print(covered_space(config))
    return 0


def sources(study: optuna.Study, size: int) -> str:
    """Where the candidates of the trials before ``size`` came from, in shares."""
    found = Counter(str(t.user_attrs.get(PROPOSED_ATTR, "queued")) for t in study.get_trials(deepcopy=False)[:size])
    return ", ".join(f"{source} {count / size:.0%}" for source, count in found.most_common())


def covered_space(config: TuneConfig) -> str:
    """A search of a 20-candidate space asked for 100 trials, then resumed: where each ends."""
    Path("small.toml").write_text(SMALL_SPACE)
    small = replace(config, study_name="small", storage=None, **read_toml(Path("small.toml")))
    first = tune(replace(small, n_trials=100), Recorder(Timings()))
    again = tune(replace(small, n_trials=200), Recorder(Timings()))
    study = optuna.load_study(study_name="small", storage=small.storage)
    held = len({tuple(sorted(t.params.items())) for t in study.get_trials(deepcopy=False)})
    reused = sum("reused_from" in t.user_attrs for t in study.get_trials(deepcopy=False))
    return (
        f"\na space of {held - 1} candidates asked for 100 trials: {first.done} trials (the baseline and each"
        f" candidate once, {reused} repeats): {first.note}; resumed for 200: {again.done - first.done} more"
        f" trials: {again.note}"
    )


if __name__ == "__main__":
    sys.exit(main())
