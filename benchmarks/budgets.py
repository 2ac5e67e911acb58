"""Whether a short --timeout plans its ending: the finalists re-measured (or a word at the start),
little time unused, preparation within its quarter.

Runs ``gpt-optuna tune`` with ONNX Runtime on the CPU at each ``--timeout`` on models of about 1,
20 and 100 ms per call (a small CNN with extra convolutions, sized on this host by measuring
it), on the quiet host and with a background load the script starts and stops itself (a
busy-loop process per core), and prints per run: the trials, the preparation's share of
``--timeout``, the time left unused (``--timeout`` less the command's wall time), whether the
finalists were re-measured in two processes or more, and whether the run said at its start that
``--timeout`` cannot hold the re-measurement. A run passes where it re-measures or said so, leaves
at most 10 % of ``--timeout`` unused and prepares for at most 25 %. The table is written to
``--out`` as well (JSON and each run's output beside it).

    python -m benchmarks.budgets [--models 1,20,100] [--timeouts 60,120,300] [--loads quiet,busy]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx
import optuna

from benchmarks import child_env
from gpt_optuna.testing.slowed import slowed
from gpt_optuna.testing.small_cnn import small_cnn

UNUSED_SHARE = 0.10
"""A run may leave at most this share of --timeout unused."""
PREPARATION_SHARE = 0.25
"""A run may prepare for at most this share of --timeout."""
CHANNELS = {1: 32, 20: 128, 100: 128}
"""The extra convolutions' width per target latency (ms): narrow ones for the fast model."""
CANNOT_HOLD = "cannot hold the finalists' re-measurement"


def latency_ms(model: onnx.ModelProto, calls: int = 20) -> float:
    """The model's median latency with ONNX Runtime's defaults on the CPU (its input at random)."""
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {"input": np.random.default_rng(0).random((1, 3, 64, 64), dtype=np.float32)}
    for _ in range(3):
        session.run(None, feeds)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - start)
    return 1000 * float(np.median(times))


def sized_model(target_ms: int) -> tuple[onnx.ModelProto, float]:
    """The small CNN slowed to about ``target_ms`` per call on this host (extra layers by the
    measured cost of one), and its measured latency."""
    channels = CHANNELS.get(target_ms, 128)
    one, three = latency_ms(slowed(small_cnn(), channels, 1)), latency_ms(slowed(small_cnn(), channels, 3))
    per_layer = max((three - one) / 2, 1e-3)
    layers = max(0, round(1 + (target_ms - one) / per_layer))
    model = slowed(small_cnn(), channels, layers)
    return model, latency_ms(model)


@contextlib.contextmanager
def background_load(on: bool) -> Iterator[None]:
    """A busy-loop process per core while the block runs (none where not ``on``), each stopped by its own id."""
    spinners = (
        [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)] if on else []
    )
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


@dataclass(frozen=True)
class Run:
    model_ms: int
    measured_ms: float
    load: str
    timeout_s: float
    exit_code: int
    trials: int
    preparation_s: float
    unused_s: float
    processes: int
    """The processes the finalists were re-measured in (0: not re-measured)."""
    said_at_start: bool

    @property
    def passes(self) -> bool:
        told = self.processes >= 2 or self.said_at_start
        return (
            told
            and self.unused_s <= UNUSED_SHARE * self.timeout_s
            and self.preparation_s <= PREPARATION_SHARE * self.timeout_s
        )

    def row(self) -> str:
        remeasured = (
            f"yes, {self.processes}" if self.processes >= 2 else ("said at start" if self.said_at_start else "NO")
        )
        return (
            f"| {self.model_ms} ({self.measured_ms:.1f}) | {self.load} | {self.timeout_s:g} | {self.trials} |"
            f" {100 * self.preparation_s / self.timeout_s:.0f} % | {self.unused_s:.1f} s"
            f" ({100 * max(self.unused_s, 0) / self.timeout_s:.0f} %) | {remeasured} |"
            f" {'yes' if self.passes else 'NO'} |"
        )


HEADER = (
    "| model ms (measured) | host | --timeout s | trials | preparing | unused | re-measured, processes | passes |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- |"
)


def tune_once(model_path: Path, model_ms: int, measured: float, load: str, timeout: float, log: Path) -> Run:
    """One ``tune`` run in a fresh folder; what it did, read from its output (kept in ``log``) and its study."""
    env = child_env()
    with tempfile.TemporaryDirectory() as folder:
        storage = f"sqlite:///{Path(folder) / 'budget.db'}"
        command = [sys.executable, "-m", "gpt_optuna.cli", "tune", str(model_path), "--backend", "onnxruntime"]
        command += ["--timeout", f"{timeout:g}s", "--n-trials", "100000", "--storage", storage, "--study-name", "b"]
        start = time.monotonic()
        with background_load(load == "busy"):
            done = subprocess.run(command, cwd=folder, capture_output=True, text=True, env=env)
        wall = time.monotonic() - start
        output = done.stdout + done.stderr
        log.write_text(f"$ {' '.join(command)}\n{output}")
        if done.returncode not in (0, 3):
            print(output[-3000:], file=sys.stderr)
        preparing = re.search(r"preparing ([\d.]+) s", output)
        study = optuna.load_study(study_name="b", storage=storage)
        confirmed = study.user_attrs.get("confirmed") or {}
        trials = sum(1 for t in study.get_trials(deepcopy=False) if t.state.is_finished())
    return Run(
        model_ms,
        measured,
        load,
        timeout,
        done.returncode,
        trials,
        float(preparing[1]) if preparing else float("nan"),
        timeout - wall,
        int(confirmed.get("processes", 0)),
        CANNOT_HOLD in output,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="1,20,100", help="target latencies in ms, comma-separated")
    parser.add_argument("--timeouts", default="60,120,300", help="seconds, comma-separated")
    parser.add_argument("--loads", default="quiet,busy", help="quiet, busy (a busy-loop process per core), or both")
    parser.add_argument(
        "--out", type=Path, default=Path("budgets.md"), help="the table's file (JSON and logs beside it)"
    )
    args = parser.parse_args()
    targets = [int(m) for m in args.models.split(",")]
    timeouts = [float(t) for t in args.timeouts.split(",")]
    loads = args.loads.split(",")
    runs: list[Run] = []
    print(HEADER, flush=True)
    with tempfile.TemporaryDirectory() as models:
        for target in targets:
            model, measured = sized_model(target)
            path = Path(models) / f"cnn_{target}ms.onnx"
            onnx.save(model, str(path))
            for load in loads:
                for timeout in timeouts:
                    log = args.out.with_name(f"{args.out.stem}-{target}ms-{load}-{timeout:g}s.log")
                    run = tune_once(path, target, measured, load, timeout, log)
                    runs.append(run)
                    print(run.row(), flush=True)
    table = "\n".join([HEADER, *(r.row() for r in runs)]) + "\n"
    args.out.write_text(table)
    args.out.with_suffix(".json").write_text(json.dumps([asdict(r) | {"passes": r.passes} for r in runs], indent=1))
    failed = [r for r in runs if not r.passes]
    print(f"{len(runs) - len(failed)} of {len(runs)} runs pass; the table is in {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
