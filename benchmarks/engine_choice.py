"""The engine chosen per model: ``tune --backend auto`` on PyTorch programs, beside torch.compile.

For each model (a ``.pt2`` file, or a name: one of the family benchmark's, :data:`OTHERS`' or the
older peer table's, saved here as a program with its inputs), from a folder of its own: a search of
every installed engine (``tune MODEL --backend auto --timeout T``, with the model's inputs where
it has them), the decided trial exported, then :data:`PROCESSES` fresh processes, each timing by
the tuner's own protocol (:func:`gpt_optuna.worker.measure.measure`, CUDA events on the GPU) in
alternating rounds: ``torch.compile`` reduce-overhead and max-autotune in fp16 (the inductor
engine's candidates with those modes' options, every other option at torch's default) and the
export as a service loads it (an inductor export through its loader, an ONNX Runtime export as the
trials run it, outputs bound on the device). The export's ratio to reduce-overhead is each
process's median; the interval is their range, so "ahead" means ahead in every fresh process.

With ``--gpus N`` the models run N at a time, each on a GPU of its own. ``--stage tune`` stops after
each export, ``--stage time`` times what an earlier run in the same ``--work`` folder left (so a
long max-autotune compile can take a call of its own), and ``--stage table`` prints what is there.
Prints one row per model, each peer's outputs marked where their cosine to the program's own
misses the criterion (then reduce-overhead in fp32 is timed too)::

    python -m benchmarks.engine_choice family regnet_y_1_6gf vit_small --timeout 300 --work W --gpus 8
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from queue import Queue
from typing import Any

import numpy as np

ROUNDS = 5
PROCESSES = 3
COSINE = 0.999
ACCURACY = f"cosine>={COSINE}"
REPRODUCED = 0.05
"""How far the export's fresh-process latency may stray from the confirmed latency."""


def _others() -> dict[str, tuple[Callable[[], Any], Callable[[], dict[str, np.ndarray]]]]:
    """Models outside the family benchmark, none tuned by the project before: torchvision's and
    timm's with seeded weights, at batch 8 on N(0, 1) images, and a RoBERTa encoder on tokens."""
    import torch

    from benchmarks import peer_models

    def vision(make: Callable[[], Any]) -> Callable[[], Any]:
        return lambda: peer_models.with_batch_statistics(lambda: peer_models._seeded(make))()

    def torchvision(name: str) -> Callable[[], Any]:
        import torchvision as tv

        return vision(lambda: getattr(tv.models, name)(weights=None))

    def timm(name: str) -> Callable[[], Any]:
        import timm as tm

        return vision(lambda: tm.create_model(name, pretrained=False))

    def roberta() -> torch.nn.Module:
        import transformers

        return peer_models._hidden(
            lambda: transformers.RobertaModel(transformers.RobertaConfig(), add_pooling_layer=False)
        )

    images = peer_models.noise_images
    return {
        "regnet_y_1_6gf": (torchvision("regnet_y_1_6gf"), images),
        "mobilenet_v3_large": (torchvision("mobilenet_v3_large"), images),
        "densenet121": (torchvision("densenet121"), images),
        "efficientnet_v2_s": (torchvision("efficientnet_v2_s"), images),
        "vit_small": (timm("vit_small_patch16_224"), images),
        "roberta_base": (roberta, peer_models.decoder_inputs),
    }


OTHERS = ("regnet_y_1_6gf", "mobilenet_v3_large", "densenet121", "efficientnet_v2_s", "vit_small", "roberta_base")


def save_program(name: str, folder: Path) -> tuple[Path, Path]:
    """``name``'s module exported by ``torch.export`` at its inputs, as ``NAME.pt2``, and those
    inputs as ``NAME.npz`` (named as the program's arguments, so the search is fed them)."""
    import torch

    from benchmarks import peers

    program, inputs = folder / f"{name}.pt2", folder / f"{name}.npz"
    if program.is_file() and inputs.is_file():
        return program, inputs
    others = _others()
    if name in others:
        module, feeds = others[name]
    else:
        peer = peers.MODELS[name]
        module, feeds = peer.module, peer.feeds
    values = feeds()
    exported = torch.export.export(module(), tuple(torch.from_numpy(v) for v in values.values()))
    torch.export.save(exported, program)
    np.savez(inputs, **values)
    return program, inputs


def tune_and_export(model: Path, inputs: Path | None, timeout_s: int, folder: Path) -> dict:
    """The search's ``best --json`` record, the best search latency of each engine, and the
    export's path (None where nothing was exported)."""
    cli = [sys.executable, "-m", "gpt_optuna.cli"]
    tune = [*cli, "tune", str(model), "--backend", "auto", "--accuracy", ACCURACY, "--timeout", f"{timeout_s}s"]
    tune += ["--inputs", str(inputs)] if inputs is not None else []
    done = subprocess.run(tune, cwd=folder, capture_output=True, text=True, check=False)
    (folder / "tune.txt").write_text(done.stdout + done.stderr)
    best = subprocess.run([*cli, "best", "--json"], cwd=folder, capture_output=True, text=True, check=True)
    record = json.loads(best.stdout)
    record["best_per_engine"] = best_per_engine(folder)
    exported = subprocess.run([*cli, "export", "-o", "served"], cwd=folder, capture_output=True, text=True)
    (folder / "export.txt").write_text(exported.stdout + exported.stderr)
    served = sorted(folder.glob("served.*.json"))
    record["export"] = str(served[0].with_suffix("")) if exported.returncode == 0 and served else None
    return record


def best_per_engine(folder: Path) -> dict[str, dict[str, Any]]:
    """Each engine's fastest feasible trial in the search (its search latency), and its defaults'."""
    import optuna

    from gpt_optuna.study.trial_record import TrialRecord

    (storage,) = (folder / "studies").glob("*.db")
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{storage}")
    found: dict[str, dict[str, Any]] = {}
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        engine, ms = str(trial.params.get("engine")), TrialRecord(trial).latency_ms
        if ms is None:
            continue
        row = found.setdefault(engine, {"best_ms": ms, "best_trial": trial.number, "defaults_ms": None})
        if ms < row["best_ms"]:
            row.update(best_ms=ms, best_trial=trial.number)
        record = TrialRecord(trial)
        if record.baseline or record.engine_defaults == engine:
            row["defaults_ms"] = ms
    return found


TIMING = r"""
import json, sys
import numpy as np
from pathlib import Path
import torch
from gpt_optuna.backends import EnginePaths, load_backend
from gpt_optuna.backends.inductor import backend as inductor, knobs as K
from gpt_optuna.graph.model import load_model_info, resolve_shapes
from gpt_optuna.graph.program import load_program, onnx_of_program
from gpt_optuna.core.measure_settings import MeasureSettings
from gpt_optuna.worker.measure import measure

model, export, inputs = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
info = load_model_info(onnx_of_program(model, 600))
shapes = resolve_shapes(info, {})
given = dict(np.load(inputs)) if inputs else {}
rng = np.random.default_rng(0)
feeds = {s.name: given.get(s.name, rng.standard_normal(shapes[s.name].opt).astype(s.dtype)) for s in info.inputs}
templates = {s.name: np.zeros([d if isinstance(d, int) else 1 for d in s.shape], np.float32) for s in info.outputs}
backend = load_backend("inductor")
inductor.REBUILD_CHECK_S = float("inf")  # a contender compiles once
space = backend.space(info, shapes)
names = {"triton.cudagraphs": K.CUDAGRAPHS, "max_autotune": K.MAX_AUTOTUNE}
names["coordinate_descent_tuning"] = K.COORDINATE_DESCENT
program = load_program(model).module()
expected = program(*[torch.from_numpy(feeds[s.name]) for s in info.inputs])
expected = (expected[0] if isinstance(expected, (list, tuple)) else expected).detach().numpy().ravel()
def cosine(runner):
    found = next(iter(runner.infer().values())).astype(np.float64).ravel()
    return float(found @ expected / (np.linalg.norm(found) * np.linalg.norm(expected)))
def compiled(mode, precision):
    options = torch._inductor.list_mode_options(mode)
    unknown = set(options) - set(names)
    assert not unknown, f"{mode} sets options the engine has no knob for: {unknown}"
    knobs = {**space.default(), **{names[o]: v for o, v in options.items()}, K.PRECISION: precision}
    return backend.open(backend.build(info, knobs, EnginePaths.under(Path(".")), shapes), feeds, templates)
runners = {mode: compiled(mode, "fp16") for mode in ("reduce-overhead", "max-autotune")}
cosines = {mode: cosine(runner) for mode, runner in runners.items()}
if cosines["reduce-overhead"] < COSINE:  # fp16 misses the criterion: also the mode as it comes
    runners["reduce-overhead fp32"] = compiled("reduce-overhead", "fp32")
    cosines["reduce-overhead fp32"] = cosine(runners["reduce-overhead fp32"])
side = json.loads(Path(export + ".json").read_text())
if "inductor" in side:
    from gpt_optuna.backends.inductor.backend import InductorRunner
    from gpt_optuna.backends.inductor.deploy import load
    runners["export"] = InductorRunner(load(export), feeds, templates)
else:  # the exported ONNX model, run as the trials run it (its outputs bound on the device)
    ort = load_backend("onnxruntime")
    exported = load_model_info(Path(export))
    knobs = {k: v for k, v in side["params"].items() if k not in ("engine", "precision", "graph_fusion")}
    runners["export"] = ort.open(ort.build(exported, knobs, EnginePaths.under(Path(".")), shapes), feeds, templates)
settings = MeasureSettings(budget_s=1.0)
found = {name: [] for name in runners}
for _ in range(ROUNDS):
    for name, runner in runners.items():
        found[name].append(measure(runner, settings).median_ms)
cosines["export"] = cosine(runners["export"])
timed = {name: float(np.median(values)) for name, values in found.items()}
print(json.dumps({**timed, "cosine": cosines}))
""".replace("ROUNDS", str(ROUNDS)).replace("COSINE", str(COSINE))


def fresh_timings(model: Path, export: str, inputs: Path | None, folder: Path) -> list[dict[str, float]]:
    """:data:`PROCESSES` fresh processes' medians of each contender (the first compiles, so
    max-autotune's choices are cached for the others)."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor-peers")}
    found = []
    for _ in range(PROCESSES):
        done = subprocess.run(
            [sys.executable, "-c", TIMING, str(model), export, str(inputs or "")],
            capture_output=True, text=True, check=False, timeout=1800, cwd=folder, env=env,
        )  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(f"timing {export} failed:\n{done.stderr[-3000:]}")
        found.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return found


def run_model(name: str, work: Path, timeout_s: int, stage: str) -> None:
    """One model's search and export (``record.json``) and its fresh timings (``timing.json``)."""
    folder = work / Path(name).stem
    folder.mkdir(parents=True, exist_ok=True)
    if name.endswith(".pt2"):
        model, inputs = Path(name).resolve(), None
    else:
        model, inputs = save_program(name, folder)
    record_path = folder / "record.json"
    if stage in ("all", "tune") and not record_path.is_file():
        record_path.write_text(json.dumps(tune_and_export(model, inputs, timeout_s, folder)))
    if stage in ("all", "time") and record_path.is_file():
        record = json.loads(record_path.read_text())
        if record["export"] is not None:
            timings = fresh_timings(model, record["export"], inputs, folder)
            (folder / "timing.json").write_text(json.dumps(timings))


def row(name: str, folder: Path) -> str:
    """The model's line of the table, from what its folder holds."""
    record_path, timing_path = folder / "record.json", folder / "timing.json"
    if not record_path.is_file():
        return f"| {name} | not tuned (see {folder / 'tune.txt'}) |"
    record = json.loads(record_path.read_text())
    engines = record.get("best_per_engine") or {}
    ort = engines.get("onnxruntime", {})
    ms = record.get("latency_ms")
    side = json.loads(Path(record["export"] + ".json").read_text()) if record.get("export") else {}
    fresh = ((side.get("fresh_process") or {}).get("latency") or {}).get("median_ms")
    cells = [
        name,
        str(record.get("engine") or record.get("backend")),
        _ms(ort.get("defaults_ms")),
        _ms(ort.get("best_ms")),
        f"{_ms(ms)} ({record.get('measurement')})",
        f"{fresh / ms:.3f}x" if fresh and ms else "-",
    ]
    if not timing_path.is_file():
        return "| " + " | ".join([*cells, "-", "-", "-", "-"]) + " |"
    timings = json.loads(timing_path.read_text())
    cosines = timings[0]["cosine"]
    mid = {key: float(np.median([t[key] for t in timings])) for key in timings[0] if key != "cosine"}
    ratios = [t["reduce-overhead"] / t["export"] for t in timings]
    versus = f"{np.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]"

    def peer(key: str) -> str:
        off = f" (cosine {cosines[key]:.5f}: outputs off)" if cosines[key] < COSINE else ""
        return f"{_ms(mid[key])}{off}"

    fp32 = f"; fp32 {peer('reduce-overhead fp32')}" if "reduce-overhead fp32" in mid else ""
    cells += [peer("reduce-overhead") + fp32, peer("max-autotune"), peer("export"), versus]
    return "| " + " | ".join(cells) + " |"


def _ms(value: float | None) -> str:
    return f"{value:.4g}" if value else "-"


HEADER = (
    "| model | engine chosen | ONNX Runtime defaults ms | tuned ONNX Runtime ms (search) | tuned ms (measurement)"
    " | export at export time / tuned | reduce-overhead fp16 ms | max-autotune fp16 ms | export ms"
    " | export vs reduce-overhead [range over processes] |\n" + "| --- " * 10 + "|"
)


def main() -> None:
    from benchmarks.peers import FAMILIES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="a .pt2 file, a model's name, or 'family' (the family benchmark)")
    parser.add_argument("--timeout", type=int, default=300, help="each search's --timeout, in seconds")
    parser.add_argument("--work", type=Path, required=True, help="a folder for each model's files (kept)")
    parser.add_argument("--gpus", type=int, default=1, help="models run at a time, each on a GPU of its own")
    parser.add_argument("--stage", choices=("all", "tune", "time", "table"), default="all")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    names = [n for m in args.models for n in (FAMILIES.split(",") if m == "family" else [m])]
    args.work.mkdir(parents=True, exist_ok=True)
    if args.one:
        run_model(names[0], args.work.resolve(), args.timeout, args.stage)
        return

    free: Queue[int] = Queue()
    for gpu in range(args.gpus):
        free.put(gpu)

    def one(name: str) -> None:
        gpu = free.get()
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu)} if args.gpus > 1 else None
        command = [sys.executable, "-m", "benchmarks.engine_choice", name, "--one", "--timeout", str(args.timeout)]
        command += ["--work", str(args.work.resolve()), "--stage", args.stage]
        with (args.work / f"{Path(name).stem}.log").open("a") as log:
            subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env, check=False)
        free.put(gpu)

    if args.stage != "table":
        with ThreadPoolExecutor(args.gpus) as pool:
            list(pool.map(one, names))
    print(HEADER)
    for name in names:
        print(row(Path(name).stem, args.work / Path(name).stem))


if __name__ == "__main__":
    main()
