"""Kill the tuner with SIGKILL at random moments, again and again, on one study; then check that
nothing was lost or corrupted.

Each round starts ``gpt-optuna tune`` on the same study (a synthetic backend, so the rounds are
quick and the kill lands anywhere: in the sampler, the worker, a storage write, between a trial's
result and its completion), kills its whole process group after a random delay, and reads the
study. A last run without a kill finishes the study. Then: no COMPLETE trial lost between rounds,
no trial left RUNNING, trial numbers contiguous, SQLite's integrity check ok, and every candidate
whose trial was interrupted holds its own result in a later trial (none copied a failure).

    python -m benchmarks.faults [--kills 20] [--max-delay 3.0] [--seed 0]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
from optuna.trial import TrialState

from gpt_optuna.study.taxonomy import has_own_result, is_interrupted, retried_numbers
from gpt_optuna.worker.self_test import TINY_MODEL

MODEL = TINY_MODEL
SYNTHETIC = "gpt_optuna.testing.synthetic:SyntheticBackend"
STUDY = "faults"


def tune(folder: Path, trials: int) -> subprocess.Popen[bytes]:
    config = folder / "tune.toml"
    config.write_text(
        '[measure]\nbudget_s = 0.02\nmin_samples = 5\n[space]\nmode = ["ok", "noisy"]\ndelay_us = [0, 50, 100]\n'
        "build_ms = [0, 30, 100]\n"
    )
    argv = [sys.executable, "-m", "gpt_optuna.cli", "tune", str(MODEL), "--backend", SYNTHETIC]
    argv += ["--config", str(config), "--study-name", STUDY, "--n-trials", str(trials), "--quiet", "--confirm-top", "0"]
    return subprocess.Popen(argv, cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)


def read(folder: Path) -> list[optuna.trial.FrozenTrial]:
    db = folder / "studies" / f"{STUDY}.db"
    if not db.is_file():
        return []
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as connection:
        if not connection.execute("SELECT 1 FROM sqlite_master WHERE name = 'studies'").fetchone():
            return []  # killed before the database had its tables
    storage = f"sqlite:///file:{db}?mode=ro&uri=true"
    try:
        return optuna.load_study(study_name=STUDY, storage=storage).get_trials()
    except KeyError:  # killed before the study was created
        return []


def integrity(folder: Path) -> str:
    with contextlib.closing(sqlite3.connect(folder / "studies" / f"{STUDY}.db")) as connection:
        return str(connection.execute("PRAGMA integrity_check").fetchone()[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--max-delay", type=float, default=3.0, help="longest wait before a kill, seconds")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    rng = random.Random(args.seed)
    lost: list[int] = []
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for kill in range(1, args.kills + 1):
            complete_before = {t.number for t in read(folder) if t.state is TrialState.COMPLETE}
            run = tune(folder, trials=4 * kill + 4)
            delay = rng.uniform(0.2, args.max_delay)
            time.sleep(delay)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.pid, signal.SIGKILL)
            run.wait()
            trials = read(folder)
            complete = {t.number for t in trials if t.state is TrialState.COMPLETE}
            lost += sorted(complete_before - complete)
            rows.append((kill, delay, run.returncode, len(trials), len(complete)))
        final = tune(folder, trials=4 * args.kills + 8)
        _, err = final.communicate(timeout=600)
        trials = read(folder)
        retried = retried_numbers(trials)
        running = [t.number for t in trials if t.state is TrialState.RUNNING]
        contiguous = [t.number for t in trials] == list(range(len(trials)))
        interrupted = [t for t in trials if is_interrupted(t, retried)]
        by_params: dict[str, list[optuna.trial.FrozenTrial]] = {}
        for t in trials:
            by_params.setdefault(json.dumps(t.params, sort_keys=True), []).append(t)

        def resolved(trial: optuna.trial.FrozenTrial) -> bool:
            """A later trial of the same candidate, or its retry (a kill mid-suggestion leaves part of
            the parameters, which the retry completes), holds its own result."""
            same = by_params[json.dumps(trial.params, sort_keys=True)]
            retries = [t for t in trials if trial.number in t.system_attrs.get("retry_history", [])]
            return any(other.number > trial.number and has_own_result(other, retried) for other in same + retries)

        unresolved = [t.number for t in interrupted if t.params and not resolved(t)]  # no params: no candidate yet
        copied = [t.number for t in trials if t.user_attrs.get("reused_from") in {i.number for i in interrupted}]
        check = integrity(folder)
    print("| kill | after (s) | exit | trials | complete |")
    print("| --- | --- | --- | --- | --- |")
    for kill, delay, code, count, complete_count in rows:
        print(f"| {kill} | {delay:.2f} | {code} | {count} | {complete_count} |")
    print()
    print(f"final run: exit {final.returncode}{'' if final.returncode == 0 else ': ' + err.decode()[-300:]}")
    print(
        f"trials: {len(trials)}, complete: {sum(t.state is TrialState.COMPLETE for t in trials)}, "
        f"interrupted by the kills: {len(interrupted)}"
    )
    print(f"COMPLETE trials lost: {len(lost)} {lost if lost else ''}")
    print(f"trials left RUNNING: {len(running)} {running if running else ''}")
    print(f"trial numbers contiguous: {'yes' if contiguous else 'no'}")
    print(f"interrupted candidates without their own result later: {len(unresolved)} {unresolved or ''}")
    print(f"trials that copied an interrupted trial: {len(copied)} {copied or ''}")
    print(f"SQLite integrity check: {check}")
    ok = not lost and not running and contiguous and not unresolved and not copied and check == "ok"
    return 0 if ok and final.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
