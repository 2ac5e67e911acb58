"""The tuner's cost per trial as its study grows, beside plain Optuna's TPE on the same storage.

One study of the synthetic backend (a 10,800-candidate space: delays of 0-89 us and three inert
knobs) is grown by ``tune`` to each size in turn (each run resumes it with a larger trial target)
beside a plain Optuna study with the same distributions, the same SQLite settings and the sampler
the tuner wraps (``--sampler``: TPE as the tuner configures it, or random), seeded, grown by
``study.optimize`` with an objective that returns at once. The last trials before each size are
grown in ``--rounds`` alternating rounds, the tuner's then plain Optuna's (a busy host slows both
alike), and each row gives, over those trials (the first of each round left out: it carries the
start of a run), the median of the tuner's overhead per trial (its wall time less the worker's own
work, as ``overhead.py`` measures it), the median of plain Optuna's time per trial, their ratio,
how long ``gpt-optuna status`` and ``best`` take on the tuner's study then (the whole command, the
interpreter's start and imports included; the median of three runs) and of ``status`` the part
that reads the study (opening it and its summary in words, in this process); each stage says where
its candidates came from. Then a search of a 20-candidate space asked for 100 trials, and resumed:
where each ends.

    python -m benchmarks.long_run [--sizes 10,100,1000,5000] [--window 20] [--rounds 4] [--sampler tpe|random]
"""

from __future__ import annotations

import argparse
import math
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

import gpt_optuna
from benchmarks.overhead import MODEL, SYNTHETIC, Recorder, Timings, per_trial
from gpt_optuna.core.space import Space
from gpt_optuna.search.config import TuneConfig, read_toml
from gpt_optuna.search.sampling import base_sampler
from gpt_optuna.study.record import SPACE_ATTR
from gpt_optuna.study.storage import open_storage, storage_file
from gpt_optuna.study.trial_record import PROPOSED_ATTR
from gpt_optuna.usecases.tune import tune

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
    it), grown beside the tuner's, with an objective that returns at once."""

    def __init__(self, url: str, space: Space, sampler: str) -> None:
        self.study = optuna.create_study(storage=open_storage(url), sampler=base_sampler(sampler, 0))
        self.space = space

    def grow(self, size: int) -> list[float]:
        """Grow the study to ``size`` trials; the milliseconds of each trial but the first."""

        def objective(trial: optuna.Trial) -> float:
            return float(self.space.suggest(trial)["delay_us"])

        ended = [time.perf_counter()]
        callbacks = [lambda _, __: ended.append(time.perf_counter())]
        self.study.optimize(objective, n_trials=size - len(self.study.trials), callbacks=callbacks)
        return [1000 * (b - a) for a, b in zip(ended[1:-1], ended[2:], strict=True)]


def grow_tuner(config: TuneConfig, size: int) -> list[float]:
    """Grow the tuner's study to ``size`` trials; the overhead of each trial of this run but the first."""
    timings = Timings()
    path = storage_file(str(config.storage))
    first = len(read(config).get_trials(deepcopy=False)) if path is not None and path.is_file() else 0
    tune(replace(config, n_trials=size), Recorder(timings))
    return overhead_ms(read(config), timings, range(first + 1, size))


def read(config: TuneConfig) -> optuna.Study:
    """The tuner's study, opened as its readers open it."""
    return optuna.load_study(study_name=config.study_name, storage=open_storage(config.storage, read_only=True))


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
    parser.add_argument("--window", type=int, default=20, help="trials timed before each size (at most)")
    parser.add_argument("--rounds", type=int, default=4, help="alternating rounds the timed trials are grown in")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    # each round grows both studies by this many trials, the first of which is not timed
    per_round = [
        min(math.ceil(args.window / args.rounds) + 1, (b - a) // args.rounds)
        for a, b in zip([0, *sizes[:-1]], sizes, strict=True)
    ]
    if min(per_round) < 2:
        parser.error(f"each size must exceed the one before it by {2 * args.rounds} trials or more")
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    os.chdir(tempfile.mkdtemp(prefix="long-run-"))
    Path("tune.toml").write_text(SPACE.format(delays=", ".join(map(str, range(90)))))
    values = read_toml(Path("tune.toml"))
    config = TuneConfig(
        model=MODEL, backend=SYNTHETIC, confirm_top=0, seed=0, study_name="long", sampler=args.sampler, **values
    )
    where = ["--storage", str(config.storage), "--study-name", "long"]
    plain: PlainOptuna | None = None
    rows = []
    for size, step in zip(sizes, per_round, strict=True):
        start = size - args.rounds * step
        grow_tuner(config, start)
        space = Space.from_record(read(config).user_attrs[SPACE_ATTR])
        plain = plain or PlainOptuna("sqlite:///plain.db", space, args.sampler)
        plain.grow(start)
        tuner, plain_ms = [], []
        for end in range(start + step, size + 1, step):  # alternating: the host as it is now for both
            tuner += grow_tuner(config, end)
            plain_ms += plain.grow(end)
        status = command_s("status", *where)
        figures = (statistics.median(tuner), statistics.median(plain_ms), len(tuner))
        rows.append((size, *figures, status, command_s("best", *where), reading_ms(str(config.storage), "long")))
        print(f"{size} trials: the tuner {figures[0]:.1f} ms per trial; {sources(read(config), size)}", flush=True)
    print(f"\n trials  timed  tuner ms/trial  plain {args.sampler} ms/trial  ratio  status s  best s  reading ms")
    for size, tuner_ms, optuna_ms, timed, status_s, best_s, read_ms in rows:
        print(
            f"{size:>7}  {timed:>5}  {tuner_ms:>14.1f}  {optuna_ms:>18.1f}  {tuner_ms / optuna_ms:>5.2f}"
            f"  {status_s:>8.2f}  {best_s:>6.2f}  {read_ms:>10.1f}"
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
