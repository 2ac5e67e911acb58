"""Top-1 agreement and latency of each precision for MobileNetV2 on real photographs, with int8
calibrated on those photographs and on generated N(0, 1) inputs.

MobileNetV2 carries its real ImageNet weights; the samples are 30 crops of the photographs shipped
with scikit-image (``gpt_optuna/testing/mobilenet_v2.py``), one image per sample. For each calibration the real
tuner searches every precision the backend offers (int8/fp8 with every choice of quantized op
types; every other knob at its default), judging each candidate by the user metric ``top1_agree``
below (share of samples whose top-1 class is the fp32 model's) against ``--accuracy``. The table
gives each candidate's top-1 agreement, worst-sample cosine, median latency from the search and
its ratio to fp32, measured in one run. Where a GPU is usable ONNX Runtime runs on its CUDA
provider, else on the CPU.

    python -m benchmarks.accuracy [--backend onnxruntime] [--accuracy "top1_agree>=0.75"] [--budget 1.0]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import optuna

from gpt_optuna.cli import main as cli
from gpt_optuna.core.measure_settings import MeasureSettings
from gpt_optuna.graph.precision import PRECISIONS, QUANTIZED, is_precision_knob
from gpt_optuna.search.config import TuneConfig
from gpt_optuna.study.taxonomy import trial_status
from gpt_optuna.usecases.progress import Progress
from gpt_optuna.usecases.tune import tune

SHAPE = "input:1x3x224x224"


def top1_agreement(outputs: Sequence[dict], references: Sequence[dict], inputs: Sequence[dict]) -> dict[str, float]:
    """The user metric: the share of samples whose top-1 class is the fp32 reference's."""
    agree = [np.argmax(o["logits"], -1) == np.argmax(r["logits"], -1) for o, r in zip(outputs, references, strict=True)]
    return {"top1_agree": float(np.mean(np.concatenate(agree)))}


def precision_space(model: Path, backend: str, inputs: Path) -> tuple[dict, int]:
    """Every offered precision and quantized-op choice, every other knob at its default; and how
    many distinct candidates that makes."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(io.StringIO()):
        cli(["space", str(model), "--backend", backend, "--shape", SHAPE, "--inputs", str(inputs), "--json"])
    knobs = {k["name"]: k for k in json.loads(printed.getvalue())["knobs"]}
    space: dict = {name: "default" for name in knobs if not is_precision_knob(name)}
    space |= {name: "default" for name in knobs if name.startswith("keep_")}
    precisions = knobs["precision"]["choices"]
    quantize = knobs.get("quantize_ops", {}).get("choices", [])
    count = sum(len(quantize) if p in QUANTIZED else 1 for p in precisions)
    return space, count


def search(model: Path, args: argparse.Namespace, name: str, space: dict, trials: int, **extra: Path) -> list:
    config = TuneConfig(
        model=model,
        backend=args.backend,
        shapes=[SHAPE],
        inputs=Path("photos.npz"),
        metric=f"{Path(__file__).resolve()}:top1_agreement",
        accuracy=args.accuracy,
        n_trials=trials,
        study_name=name,
        seed=0,
        measure=MeasureSettings(budget_s=args.budget),
        space=space,
        confirm_top=0,
        **extra,
    )
    with contextlib.redirect_stdout(io.StringIO()):
        tune(config, Progress(enabled=False))
    return optuna.load_study(study_name=name, storage=config.storage).get_trials()


def main() -> int:
    from benchmarks.models import mobilenet_v2_onnx, photos  # here: the metric above is loaded by path, alone

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="onnxruntime")
    parser.add_argument("--accuracy", default="top1_agree>=0.75")
    parser.add_argument("--budget", type=float, default=1.0, help="seconds of timing per candidate")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    crops = photos()[:, None]
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        model = mobilenet_v2_onnx(Path())
        np.savez("photos.npz", input=crops)
        np.savez("noise.npz", input=rng.standard_normal((16, 1, 3, 224, 224)).astype(np.float32))
        space, trials = precision_space(model, args.backend, Path("photos.npz"))
        studies = {
            "real images": search(model, args, "real", space, trials),
            "generated": search(model, args, "generated", space, trials, calibration=Path("noise.npz")),
        }
    print_table(studies, args)
    return 0


def print_table(studies: dict[str, list], args: argparse.Namespace) -> None:
    fp32 = next(t for t in studies["real images"] if t.params.get("precision") == "fp32")
    base = fp32.user_attrs["latency"]["median_ms"]
    provider = fp32.params.get("provider", args.backend)
    print(f"MobileNetV2, {fp32.user_attrs['accuracy']['samples']} photo crops")
    print(f"backend {args.backend} ({provider}), criterion {args.accuracy}")
    print(f"{'precision':<10}{'quantized':<13}{'calibration':<13}{'top1_agree':>11}{'cosine':>10}", end="")
    print(f"{'latency ms':>12}{'vs fp32':>9}  verdict")
    shown = set()
    for calibration, trials in studies.items():
        for trial in sorted(trials, key=lambda t: (PRECISIONS.index(t.params.get("precision", "fp32")), t.number)):
            precision = trial.params.get("precision", "fp32")
            quantized = precision in QUANTIZED
            key = (precision, trial.params.get("quantize_ops"), calibration if quantized else "")
            if key in shown:
                continue
            shown.add(key)
            accuracy, latency = trial.user_attrs.get("accuracy", {}), trial.user_attrs.get("latency", {})
            ms = latency.get("median_ms")
            verdict = trial_status(trial)
            print(
                f"{precision:<10}{trial.params.get('quantize_ops', '-'):<13}{calibration if quantized else '-':<13}"
                f"{accuracy.get('top1_agree', float('nan')):>11.3f}{accuracy.get('cosine', float('nan')):>10.4f}"
                + (f"{ms:>12.3f}{base / ms:>8.2f}x" if ms else f"{'-':>12}{'-':>9}")
                + f"  {verdict}"
            )


if __name__ == "__main__":
    sys.exit(main())
