"""What a user would pick instead, side by side on one GPU: ONNX Runtime's defaults, the tuned
winner, PyTorch eager (fp32, fp16) and torch.compile (reduce-overhead, max-autotune; fp16, and
channels-last for the CNNs), at batch 8 on the same inputs, every row timed by one protocol.

Models: ResNet-50, ViT-B/16 and ConvNeXt-T (torchvision, seeded random weights), MobileNetV2
(torchvision's ImageNet weights; inputs are photo crops) and the MiniLM-L6 encoder (the registry's
ONNX file, and the same weights in a PyTorch BERT encoder; 8x128 tokens with padding); and for the
family benchmark (:data:`FAMILIES`), architectures from torchvision, timm and transformers with
seeded weights on N(0, 1) images or padded tokens, exported by torch's default exporter. Each row is
timed by :mod:`peer_timing` (per call: CUDA events around one synchronized call, as the tuner
measures, median and p90; throughput: calls back to back), ONNX Runtime's rows through the tuner's
own runner after its search, each PyTorch peer in a process of its own (a compile that takes
longer than ``--compile-timeout`` is shown as not measured), and Olive's session-parameter tuning
of the same ONNX file (:mod:`olive_peer`; shown as not measured where olive-ai is not installed).
The tuner's own figures (search and confirmed) are printed beside its row. Accuracy is each one's
cosine similarity to PyTorch fp32 eager's outputs. The table goes to stdout (and ``--table``); compile logs
go to stderr.

    python -m benchmarks.peers [--models resnet50,mobilenetv2,minilm,vit_b_16,convnext_tiny]
                               [--n-trials 40]
                               [--peers onnxruntime,eager32,eager16,reduce-overhead,max-autotune,olive]
                               [--compile-timeout 600] [--olive-timeout 900] [--table FILE]
                               [--workdir DIR] [--profile]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import multiprocessing
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import torch

from benchmarks import olive_peer, peer_models
from benchmarks.kernel_profile import kernel_profile
from benchmarks.models import CRITERION, minilm_onnx, mobilenet_v2_onnx, photo_batch
from benchmarks.peer_timing import Timing, time_calls
from gpt_optuna.graph.feeds import save_npz
from gpt_optuna.remeasure.finalists import confirm, template_from_study
from gpt_optuna.search.config import TuneConfig
from gpt_optuna.study.summary import finished_count, summarize_study
from gpt_optuna.study.trial_record import TrialRecord
from gpt_optuna.usecases.progress import Progress
from gpt_optuna.usecases.tune import tune
from gpt_optuna.worker.evaluate import open_candidate

PEERS = ("onnxruntime", "eager32", "eager16", "reduce-overhead", "max-autotune", "olive")
"""``onnxruntime``: the defaults and the tuned winner (the search first); left out, a run measures
only the other peers of a model, without a search (rows a table lacks, in a table of their own)."""
COMPILED = ("reduce-overhead", "max-autotune")
REFERENCE = "reduce-overhead"
"""The peer every row is set beside."""
COMPARABLE_COSINE = 0.999
"""A row whose outputs fall below this cosine to fp32 eager's (the tuner's criterion here) is marked."""


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@dataclass(frozen=True)
class PeerModel:
    """A model of the benchmark: its PyTorch module, inputs, whether it is a CNN, and its ONNX file
    (made in the cache folder given)."""

    module: Callable[[], torch.nn.Module]
    feeds: Callable[[], dict[str, np.ndarray]]
    cnn: bool
    onnx: Callable[[Path], Path]


def _exported(
    name: str,
    module: Callable[[], torch.nn.Module],
    feeds: Callable[[], dict[str, np.ndarray]],
    opset: int | None = None,
    dynamo: bool = False,
) -> Callable[[Path], Path]:
    """The ONNX file of ``module`` exported at this batch (the same weights), by TorchScript or,
    where ``dynamo``, by torch's default exporter (TorchScript where that one fails, said on stderr)."""

    def export(cache: Path) -> Path:
        path = cache / f"{name}_seed0_b{peer_models.BATCH}.onnx"
        if not path.is_file():
            inputs = feeds()
            args = tuple(torch.from_numpy(v) for v in inputs.values())
            names = {"input_names": list(inputs), "output_names": ["logits"], "opset_version": opset}
            if dynamo:
                try:
                    torch.onnx.export(module(), args, str(path), dynamo=True, external_data=False, **names)
                    return path
                except Exception as exc:  # noqa: BLE001 - any exporter failure falls back
                    print(f"{name}: the dynamo exporter failed ({exc!r:.200}); TorchScript's instead", file=sys.stderr)
            torch.onnx.export(module(), args, str(path), dynamo=False, **names)
        return path

    return export


def _family(
    name: str, module: Callable[[], torch.nn.Module], cnn: bool, tokens: bool = False, batch_norms: bool = False
) -> PeerModel:
    """A model of the family benchmark, exported by torch's default exporter; ``batch_norms``: with
    running statistics measured on noise images (:func:`peer_models.with_batch_statistics`)."""
    feeds = peer_models.decoder_inputs if tokens else peer_models.noise_images
    module = peer_models.with_batch_statistics(module) if batch_norms else module
    return PeerModel(module, feeds, cnn, _exported(f"{name}_family", module, feeds, 18, dynamo=True))


def _images() -> dict[str, np.ndarray]:
    return {"x": photo_batch(peer_models.BATCH)}


MODELS = {
    "resnet50": PeerModel(peer_models.resnet50, _images, True, _exported("resnet50", peer_models.resnet50, _images)),
    "mobilenetv2": PeerModel(
        peer_models.mobilenet_v2,
        lambda: {"input": photo_batch(peer_models.BATCH)},
        True,
        lambda cache: mobilenet_v2_onnx(cache, peer_models.BATCH),
    ),
    "minilm": PeerModel(peer_models.minilm, peer_models.token_inputs, False, lambda _: minilm_onnx()),
    "vit_b_16": PeerModel(
        peer_models.vit_b_16, _images, False, _exported("vit_b_16_seeded_classifier", peer_models.vit_b_16, _images, 17)
    ),
    "convnext_tiny": PeerModel(
        peer_models.convnext_tiny, _images, True, _exported("convnext_tiny", peer_models.convnext_tiny, _images, 17)
    ),
    "resnet50_dynamo": _family("resnet50_dynamo", peer_models.resnet50, True, batch_norms=True),
    "vit_b_16_dynamo": _family("vit_b_16_dynamo", peer_models.vit_b_16, False),
    "efficientnet_b0": _family("efficientnet_b0", peer_models.efficientnet_b0, True, batch_norms=True),
    "deeplabv3_mobilenet": _family("deeplabv3_mobilenet", peer_models.deeplabv3_mobilenet, True, batch_norms=True),
    "convnextv2_tiny": _family("convnextv2_tiny", peer_models.convnextv2_tiny, True),
    "mobilevit_s": _family("mobilevit_s", peer_models.mobilevit_s, True, batch_norms=True),
    "swin_t": _family("swin_t", peer_models.swin_t, False),
    "bert_base": _family("bert_base", peer_models.bert_base, False, tokens=True),
    "gpt2": _family("gpt2", peer_models.gpt2, False, tokens=True),
    "llama": _family("llama", peer_models.llama, False, tokens=True),
}
FAMILIES = (
    "resnet50_dynamo,efficientnet_b0,convnextv2_tiny,deeplabv3_mobilenet,mobilevit_s,vit_b_16_dynamo,swin_t,"
    "bert_base,gpt2,llama"
)
"""The family benchmark: ten architectures from torchvision, timm and transformers, each on N(0, 1)
images or padded tokens and exported by torch's default exporter (``resnet50`` and ``vit_b_16`` are
the older table's: photo crops, TorchScript)."""


@dataclass
class Row:
    """One line of the table: a peer's timing (None where it was not measured, with ``note``
    saying why), outputs, parameters and kernel profile lines."""

    label: str
    timing: Timing | None
    outputs: np.ndarray | None = None
    params: str = ""
    profile: list[str] = field(default_factory=list)
    note: str = ""


def _torch_peer(name: str, peer: str, profile: bool, conn: Connection) -> None:
    """In a process of its own: one PyTorch peer of ``name``, timed; (timing, outputs, profile lines) to ``conn``."""
    model = MODELS[name]
    device = torch.device("cuda")
    inputs = [torch.from_numpy(v).to(device) for v in model.feeds().values()]
    half = peer != "eager32"
    module = model.module().to(device)
    module = module.half() if half else module.float()
    args = [x.half() if half and x.is_floating_point() else x for x in inputs]
    if model.cnn and peer in COMPILED:
        module = module.to(memory_format=torch.channels_last)
        args = [x.to(memory_format=torch.channels_last) for x in args]
    if peer in COMPILED:
        module = torch.compile(module, mode=peer)
    run = functools.partial(_no_grad_call, module, args)
    with torch.inference_mode():
        outputs = module(*args).float().cpu().numpy()
    timing = time_calls(run, torch.cuda.current_stream())
    lines = kernel_profile(run).lines(f"torch {peer}") if profile else []
    conn.send((timing, outputs, lines))


def _no_grad_call(model: Callable[..., Any], args: list[torch.Tensor]) -> Any:
    with torch.inference_mode():
        return model(*args)


def torch_row(name: str, peer: str, profile: bool, timeout: float) -> Row:
    """One PyTorch peer measured in a child process; not measured where it takes over ``timeout`` s or fails."""
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_torch_peer, args=(name, peer, profile, send))
    started = time.monotonic()
    process.start()
    send.close()
    label = f"torch {peer}"
    try:
        if not receive.poll(timeout):
            process.kill()
            return Row(label, None, note=f"not measured: compiling and timing took over {timeout:.0f} s")
        timing, outputs, lines = receive.recv()
    except EOFError:
        process.join()
        return Row(label, None, note=f"not measured: the process failed (exit code {process.exitcode})")
    finally:
        process.join()
    print(
        f"{label}: {timing.median_ms:.4f} ms per call, {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True
    )
    return Row(label, timing, outputs, profile=lines)


def onnxruntime_rows(
    name: str,
    model: Path,
    feeds: dict[str, np.ndarray],
    n_trials: int,
    folder: Path,
    stack: contextlib.ExitStack,
    profile: bool,
    timeout_s: float | None = None,
) -> tuple[list[Row], str]:
    """ONNX Runtime's defaults and the tuned winner (searched for ``n_trials``, or until
    ``timeout_s``), timed through the tuner's runner (open until ``stack`` closes), and the tuner's
    own figures for both."""
    inputs = folder / f"{name}.inputs.npz"
    save_npz(inputs, feeds)
    config = TuneConfig(
        model=model,
        inputs=inputs,
        accuracy=CRITERION,
        n_trials=n_trials,
        timeout_s=timeout_s,
        study_name=f"peers-{name}",
        seed=0,
    )
    storage = f"sqlite:///studies/peers-{name}.db"
    searched = (
        timeout_s is None
        and Path(f"studies/peers-{name}.db").is_file()
        and finished_count(optuna.load_study(study_name=f"peers-{name}", storage=storage)) >= n_trials
    )
    started = time.monotonic()
    with contextlib.redirect_stdout(sys.stderr):
        tune(config, Progress(enabled=False))
    study = optuna.load_study(study_name=f"peers-{name}", storage=storage)
    template = template_from_study(study, model)
    if searched:  # a finished search from an earlier run: its finalists are re-measured in this one
        confirm(study, template, folder / f"{name}.confirm.log")
    took = time.monotonic() - started
    summary = summarize_study(study)
    rows, figures = [], []
    for label, trial in (("onnxruntime defaults", summary.baseline), ("onnxruntime tuned", summary.best)):
        assert trial is not None
        runner = stack.enter_context(open_candidate(replace(template, candidate=dict(trial.params))))
        outputs = next(iter(runner.infer().values()))
        timing = time_calls(runner.launch, torch.cuda.ExternalStream(runner.stream.ptr))
        params = ", ".join(f"{k}={v}" for k, v in trial.params.items() if k != "provider")
        lines = kernel_profile(runner.launch).lines(label) if profile and trial is summary.best else []
        rows.append(Row(label, timing, outputs, params, lines))
        own = summary.figures(trial)
        search = TrialRecord(trial).latency_ms
        figures.append(
            f"{label} is trial {trial.number}: the tuner measured {search:.4f} ms in the search"
            + (f", {own.latency_ms:.4f} ms confirmed" if own.measurement == "confirmed" else "")
        )
    finished = finished_count(study)
    return rows, f"  {'; '.join(figures)} ({finished} trials, tune and confirmation {took:.0f} s in this run)"


def write_table(lines: list[str], table: Path | None) -> None:
    if table:
        table.write_text("\n".join(lines) + "\n")


def emit(lines: list[str], start: int, table: Path | None) -> None:
    """Show the lines from ``start`` on stderr, and write the whole table so far: a long run
    stopped midway keeps what it measured."""
    print("\n".join(lines[start:]), file=sys.stderr, flush=True)
    write_table(lines, table)


def olive_row(name: str, model: Path, feeds: dict[str, np.ndarray], folder: Path, timeout: float) -> Row:
    """Olive's session-parameter tuning of the model as it is, its settings timed by the same
    protocol; not measured where Olive is not installed, fails or takes over ``timeout`` s."""
    label = "olive session tuning"
    settings, note = olive_peer.tuned_settings(model, feeds, folder / f"{name}.olive", timeout)
    print(f"{label}: {note}", file=sys.stderr, flush=True)
    if settings is None:
        return Row(label, None, note=note)
    stream = torch.cuda.current_stream()
    session = olive_peer.open_session(model, settings, "gpu", stream.cuda_stream)
    names = [o.name for o in session.get_outputs()]
    if settings.get("io_bind"):  # buffers at fixed addresses (a CUDA graph replays them), shaped by one plain run
        plain = olive_peer.open_session(model, {**settings, "provider_options": [{}]}, "gpu", None)
        first = dict(zip(names, plain.run(names, feeds), strict=True))
        del plain
        inputs = {n: torch.from_numpy(v).cuda() for n, v in feeds.items()}
        outputs = {n: torch.from_numpy(np.empty_like(v)).cuda() for n, v in first.items()}
        binding = session.io_binding()
        for bind, buffers, arrays in ((binding.bind_input, inputs, feeds), (binding.bind_output, outputs, first)):
            for n, buffer in buffers.items():
                bind(n, "cuda", 0, arrays[n].dtype, list(arrays[n].shape), buffer.data_ptr())

        def run() -> None:
            session.run_with_iobinding(binding)

        def result() -> np.ndarray:
            stream.synchronize()
            return outputs[names[0]].float().cpu().numpy()

        run()
        first = result()
    else:

        def run() -> None:
            session.run(names, feeds)

        def result() -> np.ndarray:
            return session.run(names, feeds)[0]

        first = result()
    timing = time_calls(run, stream)
    steady = result()  # after the timed calls: a CUDA graph's replays, not only its first run
    print(f"{label}: first run vs the timed runs' outputs, cosine {cosine(first, steady):.6f}", file=sys.stderr)
    options = [f"{k}={v}" for o in settings["provider_options"] for k, v in o.items()]
    options += [f"{k}={v}" for k, v in settings.get("session_options", {}).items() if v is not None]
    params = ", ".join([f"io_bind={settings.get('io_bind')}", *options])
    return Row(label, timing, steady, f"{params}; {note}")


def model_lines(name: str, rows: list[Row], reference: np.ndarray | None) -> list[str]:
    """The table's lines for one model: every row's per-call median and p90, throughput, per-call
    latency over torch.compile reduce-overhead's, and cosine to PyTorch fp32 eager."""
    against = next((r.timing.median_ms for r in rows if r.label == f"torch {REFERENCE}" and r.timing), None)
    lines = [f"\n{name}: {'per call ms':>11} {'p90 ms':>8} {'throughput ms':>13} {'/ ' + REFERENCE:>17} {'cosine':>9}"]
    for row in rows:
        if row.timing is None:
            lines.append(f"  {row.label:<26} {row.note}")
            continue
        ratio = f"{row.timing.median_ms / against:>16.3f}x" if against else f"{'-':>17}"
        similarity = cosine(row.outputs, reference) if reference is not None and row.outputs is not None else None
        similar = f"{similarity:>9.6f}" if similarity is not None else f"{'-':>9}"
        off = similarity is not None and not similarity >= COMPARABLE_COSINE  # nan too
        timing = row.timing
        lines.append(
            f"  {row.label:<26}{timing.median_ms:>11.4f} {timing.p90_ms:>8.4f} {timing.throughput_ms:>13.4f} "
            f"{ratio} {similar}"
            + (f"  (outputs off: cosine below {COMPARABLE_COSINE}, not like for like)" if off else "")
            + (f"  [{row.params}]" if row.params else "")
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"the family benchmark: {FAMILIES}")
    parser.add_argument("--n-trials", type=int, default=40)
    parser.add_argument("--timeout", type=float, help="seconds each search may take (then at most --n-trials)")
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--compile-timeout", type=float, default=600.0, help="seconds one PyTorch peer may take")
    parser.add_argument("--olive-timeout", type=float, default=900.0, help="seconds Olive's tuning may take")
    parser.add_argument("--table", type=Path, help="also write the table here")
    parser.add_argument(
        "--workdir", type=Path, help="keep the studies here: a rerun resumes the search, or re-measures a finished one"
    )
    parser.add_argument("--profile", action="store_true", help="list the kernels of the winner and best peer")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "gpt_optuna" / "benchmarks")
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    peers, names = args.peers.split(","), args.models.split(",")
    unknown = sorted(set(peers) - set(PEERS)) + sorted(set(names) - set(MODELS))
    if unknown:
        sys.exit(f"unknown peers or models {unknown}; choose from {', '.join(PEERS)} and {', '.join(MODELS)}")
    lines = [
        f"batch {peer_models.BATCH}, {torch.cuda.get_device_name()}, torch {torch.__version__}, "
        "every row timed alike: per call (CUDA events around one synchronized call, median and p90 of 300) "
        "and throughput (300 calls back to back)"
    ]
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        folder = args.workdir.resolve() if args.workdir else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        os.chdir(folder)  # the studies go there
        for name in names:
            model = MODELS[name]
            onnx_path, feeds = model.onnx(args.cache.resolve()), model.feeds()
            tuned, figures = [], []
            if "onnxruntime" in peers:  # first: a rerun resumes the search
                tuned, figure = onnxruntime_rows(
                    name, onnx_path, feeds, args.n_trials, folder, stack, args.profile, args.timeout
                )
                figures.append(figure)
            reference = torch_row(name, "eager32", False, args.compile_timeout)
            rows = [reference] if "eager32" in peers else []
            for peer in peers:
                if peer not in ("eager32", "onnxruntime"):
                    rows.append(
                        olive_row(name, onnx_path, feeds, folder, args.olive_timeout)
                        if peer == "olive"
                        else torch_row(name, peer, args.profile, args.compile_timeout)
                    )
                # the table so far, so a run stopped midway keeps every row it measured
                write_table([*lines, *model_lines(name, [*rows, *tuned], reference.outputs), *figures], args.table)
            rows += tuned
            start = len(lines)
            lines += [*model_lines(name, rows, reference.outputs), *figures]
            measured = [row for row in rows if row.label.startswith("torch") and row.timing is not None]
            if args.profile and measured:
                best_peer = min(measured, key=lambda row: row.timing.median_ms)  # type: ignore[union-attr]
                lines += [f"{name}: GPU kernels per inference (CUPTI)", *best_peer.profile]
                lines += [line for row in tuned for line in row.profile]  # the winner's (the defaults have none)
            emit(lines, start, args.table)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
