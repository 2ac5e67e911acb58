"""Does the GPU timer agree with itself and with the wall clock?

1. The same engine (ResNet-50, batch 8, ONNX Runtime CUDA provider, default options) measured in
   separate processes (two by default): the medians should agree within 1 %.
2. In one process, CuPy CUDA-event timing against wall-clock timing of a synchronized loop
   (launch, synchronize, perf_counter), in alternating blocks: within 3 %.

    python -m benchmarks.timer_check [--model resnet50_b8.onnx] [--processes 2] [--shape NAME:DIMS ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks import child_env


def open_runner(model: Path, shape_args: list[str]):  # noqa: ANN201
    from gpt_optuna.backends.onnxruntime.backend import OnnxRuntimeBackend
    from gpt_optuna.core.engine_paths import EnginePaths
    from gpt_optuna.graph import feeds as mf
    from gpt_optuna.graph import model as m
    from gpt_optuna.worker.reference import fp32_outputs

    info = m.load_model_info(model)
    shapes = m.resolve_shapes(info, m.parse_shapes(shape_args))
    feeds = mf.synthetic_feeds(info, shapes)
    backend = OnnxRuntimeBackend()
    candidate = backend.space(info, shapes).default()
    outputs = fp32_outputs(info, [feeds])[0]
    return backend.open(backend.build(info, candidate, EnginePaths.under(Path(".")), shapes), feeds, outputs)


def one_process(model: Path, shape_args: list[str]) -> dict[str, float]:
    """The protocol's median, then event- and wall-clock-timed launches in alternating blocks (so
    that a drift of the engine itself does not pass for a disagreement of the two clocks)."""
    from gpt_optuna.core.measure_settings import MeasureSettings
    from gpt_optuna.worker.measure import interleaved_rounds, launch_timer, measure

    with open_runner(model, shape_args) as runner:
        stats = measure(runner, MeasureSettings(budget_s=5.0, target_rel_ci=0.002))

        def wall() -> float:
            start = time.perf_counter()
            runner.launch()
            runner.synchronize()
            return (time.perf_counter() - start) * 1000

        rounds = interleaved_rounds([launch_timer(runner), wall], rounds=50, block=10)
    events, walls = np.median(rounds, axis=0)
    return {"events_ms": stats.median_ms, "rel_ci": stats.rel_ci, "paired_events_ms": events, "wall_ms": walls}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", type=Path, default=Path.home() / ".cache" / "gpt_optuna" / "benchmarks" / "resnet50_b8.onnx"
    )
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--shape", action="append", default=[], help="NAME:DIMS for inputs with dynamic dimensions")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one_process(args.model, args.shape)))
        return 0
    runs = []
    for i in range(1, args.processes + 1):
        shapes = [f"--shape={s}" for s in args.shape]
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.timer_check", "--child", "--model", str(args.model), *shapes],
            env=child_env(),
            capture_output=True,
            text=True,
            check=True,
        )
        run = json.loads(out.stdout.strip().splitlines()[-1])
        runs.append(run)
        gap = abs(run["paired_events_ms"] / run["wall_ms"] - 1)
        print(
            f"process {i}: events median {run['events_ms']:.4f} ms (±{run['rel_ci']:.2%}),"
            f" alternating blocks: events {run['paired_events_ms']:.4f} ms, synchronized wall clock"
            f" {run['wall_ms']:.4f} ms, {gap:.2%} apart (target < 3%)"
        )
    medians = [run["events_ms"] for run in runs]
    spread = max(medians) / min(medians) - 1
    print(f"{len(runs)} processes, same engine: medians differ by up to {spread:.2%} (target < 1%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
