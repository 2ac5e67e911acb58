"""Does the GPU timer agree with itself and with the wall clock?

1. The same engine (ResNet-50, batch 8, ONNX Runtime CUDA provider, default options) measured in
   two separate processes: the medians should agree within 1 %.
2. In one process, CuPy CUDA-event timing against wall-clock timing of a synchronized loop
   (launch, synchronize, perf_counter): within 3 %.

    python benchmarks/timer_check.py [--model resnet50_b8.onnx]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def open_runner(model: Path):  # noqa: ANN201
    from gpt_optuna import model as m
    from gpt_optuna.backends.onnxruntime import OnnxRuntimeBackend

    info = m.load_model_info(model)
    shapes = m.resolve_shapes(info, {})
    feeds = m.synthetic_feeds(info, shapes)
    backend = OnnxRuntimeBackend()
    candidate = backend.space(info, shapes).default()
    outputs = {o.name: np.zeros([d if isinstance(d, int) else 1 for d in o.shape], o.dtype) for o in info.outputs}
    return backend.open(backend.build(info, candidate, Path("."), shapes), feeds, outputs)


def one_process(model: Path) -> dict[str, float]:
    from gpt_optuna.measure import MeasureSettings, measure

    with open_runner(model) as runner:
        stats = measure(runner, MeasureSettings(budget_s=5.0, target_rel_ci=0.002))
        walls = []
        for _ in range(stats.samples):
            start = time.perf_counter()
            runner.launch()
            runner.synchronize()
            walls.append((time.perf_counter() - start) * 1000)
    return {"events_ms": stats.median_ms, "wall_ms": float(np.median(walls)), "rel_ci": stats.rel_ci}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", type=Path, default=Path.home() / ".cache" / "gpt_optuna" / "benchmarks" / "resnet50_b8.onnx"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one_process(args.model)))
        return 0
    runs = []
    for _ in range(2):
        out = subprocess.run(
            [sys.executable, __file__, "--child", "--model", str(args.model)],
            capture_output=True,
            text=True,
            check=True,
        )
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    a, b = runs
    print(f"process 1: events median {a['events_ms']:.4f} ms (±{a['rel_ci']:.2%}), wall {a['wall_ms']:.4f} ms")
    print(f"process 2: events median {b['events_ms']:.4f} ms (±{b['rel_ci']:.2%}), wall {b['wall_ms']:.4f} ms")
    print(f"two processes, same engine: medians differ by {abs(a['events_ms'] / b['events_ms'] - 1):.2%} (target < 1%)")
    for i, run in enumerate(runs, 1):
        gap = abs(run["events_ms"] / run["wall_ms"] - 1)
        print(f"process {i}: CUDA events vs synchronized wall clock: {gap:.2%} (target < 3%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
