"""Whether --timeout bounds the whole command, with the finalists confirmed in every run.

Runs ``gpt-optuna tune`` on the CPU with the synthetic backend, whose candidates build slowly
(``build_ms`` 1000 or 3000: a second or three per trial, as real engines take), for each
``--timeout``, and prints the command's wall time against the bound (the process's start
included), how many trials the search ran, and whether and how the finalists were re-measured.

    python -m benchmarks.timeouts [--timeouts 30,120,300]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import child_env
from gpt_optuna.worker.self_test import TINY_MODEL

SPACE = '[measure]\nbudget_s = 0.5\n[space]\nmode = ["ok"]\ndelay_us = [0, 50, 100]\nbuild_ms = [1000, 3000]\n'


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeouts", default="30,120,300", help="seconds, comma-separated")
    args = parser.parse_args()
    env = child_env()
    print(f"{'--timeout':>10}{'wall s':>9}{'bound+5%':>10}{'within':>8}{'trials':>8}  finalists re-measured")
    for timeout in (float(t) for t in args.timeouts.split(",")):
        with tempfile.TemporaryDirectory() as folder:
            (Path(folder) / "tune.toml").write_text(SPACE)
            command = [sys.executable, "-m", "gpt_optuna.cli", "tune", str(TINY_MODEL)]
            command += ["--backend", "gpt_optuna.testing.synthetic:SyntheticBackend", "--config", "tune.toml"]
            command += ["--timeout", f"{timeout:g}", "--quiet", "--n-trials", "100000"]
            start = time.monotonic()
            done = subprocess.run(command, cwd=folder, capture_output=True, text=True, env=env)
            wall = time.monotonic() - start
        if done.returncode != 0:
            print(f"exit {done.returncode}: {done.stderr[-1000:]}", file=sys.stderr)
            return 1
        trials = re.search(r"study \S+: (\d+) complete", done.stdout)
        planned = re.search(
            r"re-measuring the (\d+) best candidates and the baseline, interleaved, in (\d+)", done.stderr
        )
        confirmed = "(confirmed)" in done.stdout
        how = f"{planned[1]} in {planned[2]} processes" if planned and confirmed else "NO"
        bound = 1.05 * timeout
        print(
            f"{timeout:>10g}{wall:>9.1f}{bound:>10.1f}{'yes' if wall <= bound else 'NO':>8}"
            f"{trials[1] if trials else '-':>8}  {how}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
