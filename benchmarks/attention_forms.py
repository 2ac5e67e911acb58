"""Masked attention in three forms, side by side on one GPU: the registry's MiniLM encoder (8x128
tokens with padding) in fp16 with a CUDA graph, its attention fused to ``Attention``
(``graph_fusion=transformer``), to ``MultiHeadAttention`` reading the 2-D key-padding mask, and to
``MultiHeadAttention`` reading that mask as an attention bias (``transformer-mha``, what the tuner
builds: :mod:`gpt_optuna.graph.mask_bias`). The mask form is the fusion with the bias step left
out. Each opens through the tuner's own runner and is timed by the peer benchmark's protocol
(:mod:`peer_timing`), the three in turn, ``--rounds`` times; the outputs are compared with the
``Attention`` form's.

    python -m benchmarks.attention_forms [--rounds 4] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import optuna
import torch

import gpt_optuna.graph.fusion as fusion
from benchmarks import peer_models
from benchmarks.models import minilm_onnx
from benchmarks.peer_timing import Timing, time_calls
from benchmarks.peers import cosine
from gpt_optuna.graph.feeds import save_npz
from gpt_optuna.protocol.jobs import EvaluateJob
from gpt_optuna.remeasure.finalists import template_from_study
from gpt_optuna.search.config import TuneConfig
from gpt_optuna.usecases.progress import Progress
from gpt_optuna.usecases.tune import tune
from gpt_optuna.worker.evaluate import open_candidate

FORMS = {
    "Attention": ("transformer", True),
    "MHA, 2-D mask": ("transformer-mha", False),
    "MHA, bias": ("transformer-mha", True),
}
"""Each form's graph fusion, and whether the key-padding mask is given as a bias."""


@contextlib.contextmanager
def mask_kept() -> Iterator[None]:
    """The transformer-mha fusion without its bias step (cached under a name of its own)."""
    kept = fusion.masks_as_bias, fusion.FUSED_VERSION
    fusion.masks_as_bias, fusion.FUSED_VERSION = (lambda model: (0, {})), f"{fusion.FUSED_VERSION}-mask"
    try:
        yield
    finally:
        fusion.masks_as_bias, fusion.FUSED_VERSION = kept


def template(folder: Path) -> tuple[EvaluateJob, dict]:
    """The tuner's evaluation settings for MiniLM (from a one-trial study in ``folder``) and its baseline."""
    model = minilm_onnx()
    save_npz(folder / "minilm.inputs.npz", peer_models.token_inputs())
    config = TuneConfig(
        model=model, inputs=folder / "minilm.inputs.npz", accuracy="cosine>=0.999", n_trials=1, study_name="forms"
    )
    with contextlib.redirect_stdout(sys.stderr):
        tune(config, Progress(enabled=False))
    study = optuna.load_study(study_name="forms", storage="sqlite:///studies/forms.db")
    return template_from_study(study, model), dict(study.trials[0].params)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--workdir", type=Path, help="keep the study and the fused graphs here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("attention_forms.py times CUDA graphs: it needs an NVIDIA GPU")
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        folder = args.workdir.resolve() if args.workdir else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        os.chdir(folder)
        job, baseline = template(folder)
        # fp16 with a CUDA graph; NCHW, where a CUDA graph captures with either fusion
        base = {**baseline, "precision": "fp16", "cuda.enable_cuda_graph": True, "cuda.prefer_nhwc": False}
        runners = {}
        for form, (value, bias) in FORMS.items():
            with contextlib.nullcontext() if bias else mask_kept():
                runners[form] = stack.enter_context(
                    open_candidate(replace(job, candidate={**base, "graph_fusion": value}))
                )
        outputs = {form: next(iter(runner.infer().values())) for form, runner in runners.items()}
        times: dict[str, list[Timing]] = {form: [] for form in FORMS}
        for _ in range(args.rounds):
            for form, runner in runners.items():
                times[form].append(time_calls(runner.launch, torch.cuda.ExternalStream(runner.stream.ptr)))
    print(f"MiniLM-L6, 8x128, fp16, CUDA graph, {torch.cuda.get_device_name()}; ms, median over {args.rounds} rounds")
    print(f"{'form':<16}{'per call':>10}{'p90':>9}{'throughput':>12}{'/ Attention':>13}{'cosine':>11}")
    first = float(np.median([t.median_ms for t in times["Attention"]]))
    for form, rows in times.items():
        median, p90, throughput = (float(np.median([getattr(t, f) for t in rows])) for f in Timing.__dataclass_fields__)
        print(
            f"{form:<16}{median:>10.4f}{p90:>9.4f}{throughput:>12.4f}{median / first:>12.3f}x"
            f"{cosine(outputs[form], outputs['Attention']):>11.7f}"
        )


if __name__ == "__main__":
    main()
