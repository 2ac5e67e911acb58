"""Record landscapes: every configuration of a small ONNX Runtime space, measured by the tuner.

Each landscape goes to ``benchmarks/landscapes/NAME.json``, the replay benchmark's tables.

The CUDA landscapes (batch 8 unless named): ``minilm``, ``mobilenetv2``, ``resnet50``: fp32 or
fp16, basic or full graph optimization, TF32 and CUDA graph; for the CNNs exhaustive or heuristic
cuDNN algorithm search and NHWC, for the encoder the transformer fusion. ``mobilenetv2-b1`` and
``mobilenetv2-b64``: the same space for MobileNetV2 at batch 1 (launch-bound) and 64
(compute-bound). ``mobilenetv2-strict``: fp32, fp16 or int8 judged by ``cosine>=0.9999``, with
every cuDNN algorithm search (the default one included), NHWC, CUDA graph and graph level: a
landscape with infeasible and failing regions, where every speed feature on is not the answer.
The CPU landscape (``mobilenetv2-cpu``: MobileNetV2 with its real weights at batch 1, on this
machine's cores): intra-op threads (the counts the space offers here: the library's choice, powers
of two, every core), sequential or parallel execution with its inter-op threads, basic, extended or
full graph optimization, the memory arena, spinning, denormals as zero; fp32; the processor is
recorded with the landscape. MobileNetV2 has its real ImageNet weights and photo crops as inputs.
Every other knob stays at ONNX Runtime's default. Every candidate is queued in one study and
evaluated as a trial (build, accuracy against fp32 on the CPU, latency), so the landscape holds
what a search would have measured, with the GPU and library versions it was measured with; its
configurations are those of the tuner's own space (where its check finds that a setting does not
work with some others, say a CUDA graph that cannot be captured, fewer than the grid asked for);
a rerun resumes the studies kept in ``--workdir``.

    python -m benchmarks.record_landscapes [--models minilm,mobilenetv2,resnet50,mobilenetv2-b1,...]
        [--timeout SECONDS] [--workdir landscape-studies] [--out benchmarks/landscapes]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import optuna

from benchmarks.models import CRITERION, mobilenet_v2_onnx, photo_batch
from gpt_optuna.core.space import Space, Value, candidate_key
from gpt_optuna.graph.feeds import save_npz
from gpt_optuna.graph.model_profile import ModelProfile, profile_of
from gpt_optuna.search.config import TuneConfig
from gpt_optuna.study.record import FINGERPRINT_ATTR, SPACE_ATTR
from gpt_optuna.study.taxonomy import has_own_result, retried_numbers
from gpt_optuna.usecases.preparation import offered_space
from gpt_optuna.usecases.progress import Progress
from gpt_optuna.usecases.tune import tune

HERE = Path(__file__).resolve().parent


SEARCHED: dict[str, list[Value]] = {
    "precision": ["fp32", "fp16"],
    "graph_fusion": ["none", "transformer"],
    "graph_optimization_level": ["ORT_ENABLE_BASIC", "ORT_ENABLE_ALL"],
    "cuda.cudnn_conv_algo_search": ["EXHAUSTIVE", "HEURISTIC"],
    "cuda.use_tf32": [True, False],
    "cuda.prefer_nhwc": [False, True],
    "cuda.enable_cuda_graph": [False, True],
}
"""The CUDA landscapes' knobs and values; a model's space may lack some (no fusion for the CNNs)."""
CNN_ONLY = ("cuda.cudnn_conv_algo_search", "cuda.prefer_nhwc")
STRICT_SEARCHED: dict[str, list[Value] | None] = {
    "precision": ["fp32", "fp16", "int8"],
    "graph_optimization_level": ["ORT_ENABLE_BASIC", "ORT_ENABLE_ALL"],
    "cuda.cudnn_conv_algo_search": ["EXHAUSTIVE", "HEURISTIC", "DEFAULT"],
    "cuda.prefer_nhwc": [False, True],
    "cuda.enable_cuda_graph": [False, True],
}
"""The strict landscape's knobs: reduced precisions against a strict criterion, every cuDNN algorithm search."""
STRICT_CRITERION = "cosine>=0.9999"
CPU_SEARCHED: dict[str, list[Value] | None] = {
    "intra_op_num_threads": None,
    "execution_mode": None,
    "inter_op_num_threads": None,
    "graph_optimization_level": ["ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_ALL"],
    "cpu_mem_arena": None,
    "intra_op_spinning": None,
    "denormal_as_zero": None,
}
"""The CPU landscape's knobs and values (None: every value the space offers on this machine)."""
CUDA = "CUDAExecutionProvider"
PEER_BATCH = 8
"""The batch of the landscapes made from the peer benchmark's models (``peer_models.BATCH``, not
imported: that module needs PyTorch, which the CPU landscape does without)."""


@dataclass(frozen=True)
class LandscapeSpec:
    """How one landscape is measured: its model and inputs (made in the cache folder given), the
    provider, the precisions made, the knobs searched and the accuracy criterion."""

    make: Callable[[Path], tuple[Path, dict[str, np.ndarray]]]
    provider: str
    precisions: list[str]
    searched: dict[str, list[Value] | None]
    criterion: str = CRITERION


def mobilenet_v2(batch: int) -> Callable[[Path], tuple[Path, dict[str, np.ndarray]]]:
    """MobileNetV2 with its real weights at ``batch``, and photo crops as its input."""
    return lambda cache: (mobilenet_v2_onnx(cache, batch), {"input": photo_batch(batch)})


def peer_model(name: str) -> Callable[[Path], tuple[Path, dict[str, np.ndarray]]]:
    """A model of the peer benchmark (PyTorch makes it) with its inputs."""

    def make(cache: Path) -> tuple[Path, dict[str, np.ndarray]]:
        from benchmarks.peers import MODELS

        return MODELS[name].onnx(cache), MODELS[name].feeds()

    return make


def cuda_searched(cnn: bool) -> dict[str, list[Value] | None]:
    return {k: v for k, v in SEARCHED.items() if cnn or k not in CNN_ONLY}


FP = ["fp32", "fp16"]
LANDSCAPES = {
    "minilm": LandscapeSpec(peer_model("minilm"), CUDA, FP, cuda_searched(cnn=False)),
    "mobilenetv2": LandscapeSpec(mobilenet_v2(PEER_BATCH), CUDA, FP, cuda_searched(cnn=True)),
    "resnet50": LandscapeSpec(peer_model("resnet50"), CUDA, FP, cuda_searched(cnn=True)),
    "mobilenetv2-b1": LandscapeSpec(mobilenet_v2(1), CUDA, FP, cuda_searched(cnn=True)),
    "mobilenetv2-b64": LandscapeSpec(mobilenet_v2(64), CUDA, FP, cuda_searched(cnn=True)),
    "mobilenetv2-strict": LandscapeSpec(
        mobilenet_v2(PEER_BATCH), CUDA, ["fp32", "fp16", "int8"], STRICT_SEARCHED, STRICT_CRITERION
    ),
    "mobilenetv2-cpu": LandscapeSpec(mobilenet_v2(1), "CPUExecutionProvider", ["fp32"], CPU_SEARCHED),
}


def overrides(offered: Space, searched: dict[str, list[Value] | None], provider: str) -> dict[str, Value | list[Value]]:
    """The ``[space]`` table: the landscape's knobs searched, every other knob at its default."""
    table: dict[str, Value | list[Value]] = {knob.name: "default" for knob in offered.knobs}
    table["provider"] = provider
    for name, values in searched.items():
        if name in table:
            table[name] = list(offered.choices(name)) if values is None else values
    return table


def searched_space(config: TuneConfig, precisions: list[str]) -> Space:
    """The space ONNX Runtime offers for this model here, found as the tuner finds it (with only
    the given precisions made)."""
    space, _ = offered_space(replace(config, space={"precision": precisions}), [], lambda _: None)
    return space


def landscape(study: optuna.Study, name: str, space: Space, profile: ModelProfile) -> dict[str, Any]:
    """A finished study as a landscape: every evaluated candidate with its outcome and figures,
    and the model's ``profile``."""
    fingerprint = study.user_attrs[FINGERPRINT_ATTR]
    wanted = {candidate_key(c) for c in space.every_candidate()}
    every = study.get_trials(deepcopy=False)
    retried = retried_numbers(every)
    trials = []
    for trial in every:
        if (
            not has_own_result(trial, retried)
            or "reused_from" in trial.user_attrs
            or candidate_key(trial.params) not in wanted
        ):
            continue
        attrs = trial.user_attrs
        trials.append(
            {
                "params": trial.params,
                "outcome": attrs.get("outcome"),
                "detail": attrs.get("infeasible") or attrs.get("failure") or "",
                "latency": attrs.get("latency"),
                "accuracy": attrs.get("accuracy"),
                "constraints": trial.constraints,
                "build_s": attrs.get("build_s"),
            }
        )
    baseline = next(t for t in every if t.user_attrs.get("baseline"))
    return {
        "model": name,
        "gpu": baseline.user_attrs.get("gpu"),
        "cpu": cpu_name(),
        "versions": fingerprint["versions"],
        "criterion": fingerprint["accuracy"],
        "profile": profile.to_record(),
        "space": space.to_record(),
        "baseline": baseline.params,
        "trials": trials,
    }


def cpu_name() -> str:
    """The processor's model name (what a CPU landscape was measured on)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} x{os.cpu_count()}"
    return platform.processor() or "unknown"


def record(name: str, folder: Path, out: Path, deadline: float | None) -> bool:
    """Measure (or go on measuring) one landscape; whether it is complete."""
    spec = LANDSCAPES[name]
    onnx_path, feeds = spec.make(folder)
    inputs = folder / f"{name}.inputs.npz"
    save_npz(inputs, feeds)
    base = TuneConfig(model=onnx_path, inputs=inputs, accuracy=spec.criterion, study_name=f"landscape-{name}", seed=0)
    offered = searched_space(base, spec.precisions)
    table = overrides(offered, spec.searched, spec.provider)
    space = offered.with_overrides(table)
    candidates = space.every_candidate()
    remaining = None if deadline is None else deadline - time.monotonic()
    if remaining is not None and remaining < 30:
        return False
    config = replace(
        base,
        space=table,
        seeds=[(c, "landscape") for c in candidates],
        no_seeds=True,
        n_trials=len(candidates),
        confirm_top=0,
        timeout_s=remaining,
    )
    print(f"{name}: {len(candidates)} configurations", file=sys.stderr, flush=True)
    tune(config, Progress(enabled=False))
    study = optuna.load_study(study_name=config.study_name, storage=f"sqlite:///studies/{config.study_name}.db")
    searched = Space.from_record(study.user_attrs[SPACE_ATTR])
    configurations = len(searched.every_candidate())
    if configurations < len(candidates):  # its space check found where some settings do not work
        print(f"{name}: the tuner's space holds {configurations} of them", file=sys.stderr, flush=True)
    data = landscape(study, name, searched, profile_of(onnx_path))
    measured = {candidate_key(t["params"]) for t in data["trials"]}
    complete = len(measured) == configurations
    if complete:
        (out / f"{name}.json").write_text(json.dumps(data, indent=1) + "\n")
    print(f"{name}: {len(measured)} of {configurations} measured", file=sys.stderr, flush=True)
    return complete


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="minilm,mobilenetv2,resnet50", help=f"of {', '.join(LANDSCAPES)}")
    parser.add_argument("--timeout", type=float, help="stop after this many seconds; a rerun goes on where it stopped")
    parser.add_argument("--workdir", type=Path, default=Path("landscape-studies"))
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "landscapes")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "gpt_optuna" / "benchmarks")
    args = parser.parse_args()
    names = args.models.split(",")
    unknown = sorted(set(names) - set(LANDSCAPES))
    if unknown:
        sys.exit(f"unknown landscapes {unknown}; choose from {', '.join(LANDSCAPES)}")
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    args.cache.mkdir(parents=True, exist_ok=True)
    args.workdir.mkdir(parents=True, exist_ok=True)
    os.chdir(args.workdir)  # the studies go there
    for name in names:
        if not record(name, args.cache.resolve(), args.out, deadline):
            print(f"{name}: not complete; run again to go on", file=sys.stderr)
            break


if __name__ == "__main__":
    main()
