"""The engine chosen per model: ``tune --backend auto`` on PyTorch programs, beside torch.compile.

For each ``.pt2`` model, from a scratch folder (the winner's confirmed latency, and for an
inductor winner the latency its export measured in a fresh process at export): a search of every installed engine
(``tune MODEL --backend auto --timeout T``), the winner exported, then in one fresh process, by
the tuner's own protocol (:func:`gpt_optuna.worker.measure.measure`, CUDA events on the GPU) in
alternating blocks: ``torch.compile(mode="reduce-overhead")`` in fp16 (the inductor engine's
candidate with CUDA graphs and fp16, every other option at torch's default) and the exported
winner as a service loads it (an inductor export through its loader, an ONNX Runtime export
as the trials run it, outputs bound on the device). Prints one row per model::

    python -m benchmarks.engine_choice swin_t.pt2 resnet18.pt2 --timeout 300
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROUNDS = 5
ACCURACY = "cosine>=0.999"


def tune_and_export(model: Path, timeout_s: int, folder: Path) -> dict:
    """The search's ``best --json`` record and the export's path (None where nothing was exported)."""
    cli = [sys.executable, "-m", "gpt_optuna.cli"]
    tune = [*cli, "tune", str(model), "--backend", "auto", "--accuracy", ACCURACY, "--timeout", f"{timeout_s}s"]
    done = subprocess.run(tune, cwd=folder, capture_output=True, text=True, check=False)
    (folder / "tune.txt").write_text(done.stdout + done.stderr)
    best = subprocess.run([*cli, "best", "--json"], cwd=folder, capture_output=True, text=True, check=True)
    record = json.loads(best.stdout)
    exported = subprocess.run([*cli, "export", "-o", "served"], cwd=folder, capture_output=True, text=True)
    served = sorted(folder.glob("served.*.json"))
    record["export"] = str(served[0].with_suffix("")) if exported.returncode == 0 and served else None
    return record


TIMING = r"""
import json, sys
import numpy as np
from pathlib import Path
from gpt_optuna.backends import load_backend
from gpt_optuna.graph.model import load_model_info, resolve_shapes
from gpt_optuna.graph.program import onnx_of_program
from gpt_optuna.protocol.timing import MeasureSettings
from gpt_optuna.worker.measure import measure

model, export = Path(sys.argv[1]), sys.argv[2]
info = load_model_info(onnx_of_program(model, 600))
shapes = resolve_shapes(info, {})
feeds = {s.name: np.random.default_rng(0).standard_normal(shapes[s.name].opt).astype(s.dtype) for s in info.inputs}
templates = {s.name: np.zeros([d if isinstance(d, int) else 1 for d in s.shape], np.float32) for s in info.outputs}
backend = load_backend("inductor")
space = backend.space(info, shapes)
reference = backend.build(info, {**space.default(), "cudagraphs": True, "compute_precision": "fp16"}, Path("."), shapes)
runners = {"torch.compile reduce-overhead fp16": backend.open(reference, feeds, templates)}
side = json.loads(Path(export + ".json").read_text())
if "inductor" in side:
    from gpt_optuna.backends.inductor.backend import InductorRunner
    from gpt_optuna.backends.inductor.deploy import load
    runners["export"] = InductorRunner(load(export), feeds, templates)
else:  # the exported ONNX model, run as the trials run it (its outputs bound on the device)
    ort = load_backend("onnxruntime")
    exported = load_model_info(Path(export))
    knobs = {k: v for k, v in side["params"].items() if k not in ("engine", "precision", "graph_fusion")}
    runners["export"] = ort.open(ort.build(exported, knobs, Path("."), shapes), feeds, templates)
settings = MeasureSettings(budget_s=1.0)
found = {name: [] for name in runners}
for _ in range(ROUNDS):
    for name, runner in runners.items():
        found[name].append(measure(runner, settings).median_ms)
print(json.dumps({name: float(np.median(values)) for name, values in found.items()}))
""".replace("ROUNDS", str(ROUNDS))


def fresh_timing(model: Path, export: str) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", TIMING, str(model), export], capture_output=True, text=True, check=False, timeout=1800
    )
    if done.returncode != 0:
        raise SystemExit(f"timing {export} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", type=Path)
    parser.add_argument("--timeout", type=int, default=300, help="each search's --timeout, in seconds")
    parser.add_argument("--logs", type=Path, help="a folder to keep each search's output in (MODEL.txt)")
    args = parser.parse_args()
    print(
        "| model | engine chosen | winner vs first engine's defaults | vs each engine's defaults | winner ms |"
        " export at export time | export ms | reduce-overhead fp16 ms | export vs reduce-overhead |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for model in args.models:
        with tempfile.TemporaryDirectory() as tmp:
            record = tune_and_export(model.resolve(), args.timeout, Path(tmp))
            if args.logs is not None:
                args.logs.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(Path(tmp) / "tune.txt", args.logs / f"{model.stem}.txt")
            engines = record.get("engine_defaults") or {}
            versus = ", ".join(
                f"{name} {v['speedup']:.2f}x" for name, v in engines.items() if v.get("speedup") is not None
            )
            speedup = record.get("speedup")
            row = [
                model.stem,
                str(record.get("engine") or record.get("backend")),
                f"{speedup:.2f}x ({record.get('measurement')})" if speedup else "-",
                versus or "-",
                f"{record['latency_ms']:.4g}" if record.get("latency_ms") else "-",
            ]
            if record["export"] is None:
                print("| " + " | ".join([*row, "not exported", "-", "-", "-"]) + " |")
                continue
            side = json.loads(Path(record["export"] + ".json").read_text())
            fresh = (side.get("fresh_process") or {}).get("latency", {}).get("median_ms")
            row.append(f"{fresh:.4g} ms ({fresh / record['latency_ms']:.3f}x the winner's)" if fresh else "-")
            timed = fresh_timing(model.resolve(), record["export"])
            ours, theirs = timed["export"], timed["torch.compile reduce-overhead fp16"]
            print("| " + " | ".join([*row, f"{ours:.4g}", f"{theirs:.4g}", f"{theirs / ours:.2f}x"]) + " |")


if __name__ == "__main__":
    main()
