"""What a user would pick instead, side by side on one GPU: ONNX Runtime's defaults, the tuned
winner, PyTorch eager (fp32, fp16) and torch.compile (reduce-overhead, max-autotune; fp16, and
channels-last for the CNNs), at batch 8 on the same inputs.

Models: ResNet-50 (torchvision, seeded random weights), MobileNetV2 (torchvision's ImageNet
weights; inputs are photo crops) and the MiniLM-L6 encoder (the registry's ONNX file, and the same
weights in a PyTorch BERT encoder; 8x128 tokens with padding). Every latency is the median of
CUDA-event-timed launches in this process tree; ONNX Runtime's are the tuner's own confirmed
medians (its finalists and the baseline re-measured interleaved in fresh processes, CuPy CUDA
events). Accuracy is each one's cosine similarity to PyTorch fp32 eager's outputs. The table goes
to stdout (and ``--table``); compile logs go to stderr.

    python benchmarks/peers.py [--models resnet50,mobilenetv2,minilm] [--n-trials 40]
                               [--peers eager32,eager16,reduce-overhead,max-autotune] [--table FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import peer_models
import torch
from kernel_profile import kernel_profile
from precision import mobilenet_v2 as mobilenet_v2_onnx
from record_landscapes import CRITERION

from gpt_optuna.graph.feeds import save_npz
from gpt_optuna.search.config import TuneConfig
from gpt_optuna.search.finalists import confirm, template_from_study
from gpt_optuna.search.progress import Progress
from gpt_optuna.search.tune import tune
from gpt_optuna.study.summary import finished_count, summarize_study
from gpt_optuna.testing.mobilenet_v2 import PHOTOS, SKIMAGE, crops
from gpt_optuna.testing.registry import download

PEERS = ("eager32", "eager16", "reduce-overhead", "max-autotune")


def photo_batch() -> np.ndarray:
    photos = np.stack(crops(download(SKIMAGE, tuple(f"skimage/data/{name}" for name in PHOTOS))))
    return photos[: peer_models.BATCH]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def cuda_median_ms(run: Callable[[], Any], warmup: int = 30, launches: int = 300) -> float:
    """The median of ``launches`` launches, each timed with a pair of CUDA events."""
    for _ in range(warmup):
        run()
    torch.cuda.synchronize()
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(launches)]
    for start, end in pairs:
        start.record()
        run()
        end.record()
    torch.cuda.synchronize()
    return float(np.median([start.elapsed_time(end) for start, end in pairs]))


Row = tuple[str, float, np.ndarray, str, Callable[[], Any]]
"""label, latency ms, outputs, parameters, one inference (for the kernel profile)"""


def torch_peers(
    module: torch.nn.Module, feeds: dict[str, np.ndarray], cnn: bool, peers: list[str]
) -> tuple[np.ndarray, list[Row]]:
    """PyTorch fp32 eager's outputs, and each peer's row."""
    device = torch.device("cuda")
    inputs = [torch.from_numpy(v).to(device) for v in feeds.values()]
    rows = []
    reference = None
    for peer in ["eager32", *[p for p in peers if p != "eager32"]]:
        half = peer != "eager32"
        model = module.to(device).half() if half else module.to(device).float()
        args = [x.half() if half and x.is_floating_point() else x for x in inputs]
        if cnn and peer in ("reduce-overhead", "max-autotune"):
            model = model.to(memory_format=torch.channels_last)
            args = [x.to(memory_format=torch.channels_last) for x in args]
        if peer in ("reduce-overhead", "max-autotune"):
            torch._dynamo.reset()
            model = torch.compile(model, mode=peer)
        with torch.inference_mode():
            outputs = model(*args).float().cpu().numpy()
            if peer == "eager32":
                reference = outputs
            if peer in peers:
                run = functools.partial(_no_grad_call, model, args)
                rows.append((f"torch {peer}", cuda_median_ms(run), outputs, "", run))
                print(f"torch {peer}: {rows[-1][1]:.4f} ms", file=sys.stderr, flush=True)  # amid long compile logs
    assert reference is not None
    return reference, rows


def _no_grad_call(model: Callable[..., Any], args: list[torch.Tensor]) -> Any:
    with torch.inference_mode():
        return model(*args)


def onnxruntime_rows(
    name: str, model: Path, feeds: dict[str, np.ndarray], n_trials: int, folder: Path, stack: contextlib.ExitStack
) -> list[Row]:
    """ONNX Runtime's defaults and the tuned winner: confirmed latencies, outputs, parameters, and
    one inference as the tuner times it (its runner, open until ``stack`` closes)."""
    inputs = folder / f"{name}.inputs.npz"
    save_npz(inputs, feeds)
    config = TuneConfig(
        model=model, inputs=inputs, accuracy=CRITERION, n_trials=n_trials, study_name=f"peers-{name}", seed=0
    )
    storage = f"sqlite:///studies/peers-{name}.db"
    searched = (
        Path(f"studies/peers-{name}.db").is_file()
        and finished_count(optuna.load_study(study_name=f"peers-{name}", storage=storage)) >= n_trials
    )
    with contextlib.redirect_stdout(sys.stderr):
        tune(config, Progress(enabled=False), argv=[])
    study = optuna.load_study(study_name=f"peers-{name}", storage=storage)
    template = template_from_study(study, model)
    if searched:  # a finished search from an earlier run: its finalists are re-measured in this one
        confirm(study, template, folder / f"{name}.confirm.log")
    summary = summarize_study(study)
    rows = []
    for label, trial, ms in (
        ("onnxruntime defaults", summary.baseline, summary.baseline_value),
        ("onnxruntime tuned", summary.best, summary.best_value),
    ):
        assert trial is not None and ms is not None
        runner = stack.enter_context(replace(template, candidate=dict(trial.params)).open_candidate())
        outputs = next(iter(runner.infer().values()))
        params = ", ".join(f"{k}={v}" for k, v in trial.params.items() if k != "provider")
        rows.append((f"{label} ({summary.measurement})", ms, outputs, params, runner.launch))
    return rows


Module = Callable[[], torch.nn.Module]


def models() -> dict[str, Callable[[Path], tuple[Module, Path, dict[str, np.ndarray], bool]]]:
    """Per model: what makes its PyTorch module, its ONNX file (made in the cache folder given),
    its inputs, and whether it is a CNN."""

    def resnet(cache: Path) -> tuple[Module, Path, dict[str, np.ndarray], bool]:
        feeds = {"x": photo_batch()}
        path = cache / f"resnet50_seed0_b{peer_models.BATCH}.onnx"
        if not path.is_file():  # the same module's weights
            example = torch.from_numpy(feeds["x"])
            torch.onnx.export(
                peer_models.resnet50(), example, str(path), input_names=["x"], output_names=["logits"], dynamo=False
            )
        return peer_models.resnet50, path, feeds, True

    def mobilenet(cache: Path) -> tuple[Module, Path, dict[str, np.ndarray], bool]:
        return peer_models.mobilenet_v2, mobilenet_v2_onnx(cache, peer_models.BATCH), {"input": photo_batch()}, True

    def minilm(_: Path) -> tuple[Module, Path, dict[str, np.ndarray], bool]:
        return peer_models.minilm, peer_models.minilm_onnx(), peer_models.token_inputs(), False

    return {"resnet50": resnet, "mobilenetv2": mobilenet, "minilm": minilm}


def emit(lines: list[str], start: int, table: Path | None) -> None:
    """Show the lines from ``start`` on stderr, and write the whole table so far: a long run
    stopped midway keeps what it measured."""
    print("\n".join(lines[start:]), file=sys.stderr, flush=True)
    if table:
        table.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,mobilenetv2,minilm")
    parser.add_argument("--n-trials", type=int, default=40)
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--table", type=Path, help="also write the table here")
    parser.add_argument(
        "--workdir", type=Path, help="keep the studies here: a rerun resumes the search, or re-measures a finished one"
    )
    parser.add_argument("--profile", action="store_true", help="list the kernels of the winner and best peer")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "gpt_optuna" / "benchmarks")
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    peers = args.peers.split(",")
    unknown = sorted(set(peers) - set(PEERS))
    if unknown:
        sys.exit(f"unknown peers {unknown}; choose from {', '.join(PEERS)}")
    lines = [f"batch {peer_models.BATCH}, {torch.cuda.get_device_name()}, torch {torch.__version__}"]
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        folder = args.workdir.resolve() if args.workdir else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        os.chdir(folder)  # the studies go there
        for name in args.models.split(","):
            module, onnx_path, feeds, cnn = models()[name](args.cache)
            tuned = onnxruntime_rows(name, onnx_path, feeds, args.n_trials, folder, stack)  # first: a rerun resumes it
            reference, measured = torch_peers(module(), feeds, cnn, peers)
            measured += tuned
            best_peer = min((row for row in measured if row[0].startswith("torch")), key=lambda row: row[1])
            start = len(lines)
            lines.append(f"\n{name}: {'latency ms':>10} {'/ best peer':>11} {'cosine vs fp32':>15}")
            for label, ms, out, params, _ in measured:
                lines.append(
                    f"  {label:<42}{ms:>9.4f} {ms / best_peer[1]:>10.3f}x {cosine(out, reference):>15.6f}"
                    + (f"  [{params}]" if params else "")
                )
            emit(lines, start, args.table)
            if args.profile:
                start = len(lines)
                lines.append(f"{name}: GPU kernels per inference (CUPTI)")
                lines += [
                    line for label, *_, run in (best_peer, measured[-1]) for line in kernel_profile(run).lines(label)
                ]
                emit(lines, start, args.table)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
