"""Search throughput with one GPU and with several: the same search, once per ``--gpus`` setting.

MobileNetV2 (torchvision's ImageNet weights) at batch 8, judged on 24 photo crops of the
photographs shipped with scikit-image (three batches), ``cosine>=0.999``, on ONNX Runtime's
default space. Each setting runs ``gpt-optuna tune --gpus G`` in a fresh study with the same
sampler seed; the table gives the command's wall time, the span from the first trial's start to
the last one's end, the share of it the workers spent inside trials, trials per hour over the
span, and the best trial. The speedup is the ratio
of the spans. Then the best candidate of each search is re-measured in one process on the first
GPU, interleaved, with a bootstrap 95 % interval of their latency ratio: two searches that found
equally good configurations give an interval that includes 1.

    python -m benchmarks.scaling [--n-trials 40] [--gpus 0 0,1]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import optuna

from benchmarks.models import CRITERION, mobilenet_v2_onnx, photos
from gpt_optuna.graph.feeds import save_npz
from gpt_optuna.remeasure.finalists import interleave, template_from_study
from gpt_optuna.search.lanes import pinned
from gpt_optuna.study.evidence import speedups
from gpt_optuna.study.storage import open_storage
from gpt_optuna.study.taxonomy import has_own_result, retried_numbers

BATCH = 8


def prepare(folder: Path) -> tuple[Path, Path]:
    """The batch-8 model and its photo samples (three batches of eight crops)."""
    model = mobilenet_v2_onnx(folder, BATCH)
    crops = photos()
    samples = crops[: len(crops) // BATCH * BATCH].reshape(-1, BATCH, *crops.shape[1:])
    inputs = folder / "photos_b8.npz"
    save_npz(inputs, {"input": samples})
    return model, inputs


def search(model: Path, inputs: Path, gpus: str, n_trials: int, seed: int) -> tuple[optuna.Study, float]:
    """One search in a fresh study; the study and the command's wall time."""
    name = f"scaling-gpus-{gpus.replace(',', '_')}"
    command = [sys.executable, "-m", "gpt_optuna.cli", "tune", str(model), "--inputs", str(inputs)]
    command += ["--accuracy", CRITERION, "--n-trials", str(n_trials), "--gpus", gpus, "--seed", str(seed)]
    command += ["--confirm-top", "0", "--quiet", "--study-name", name]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.monotonic() - started
    if done.returncode != 0:
        sys.exit(f"--gpus {gpus}: tune exited with {done.returncode}\n{done.stderr[-3000:]}")
    storage = open_storage(f"sqlite:///studies/{name}.db", create=False)
    return optuna.load_study(study_name=name, storage=storage), wall


def span_s(study: optuna.Study) -> float:
    """From the first trial's start to the last one's end."""
    trials = [t for t in study.get_trials(deepcopy=False) if t.datetime_start and t.datetime_complete]
    return (max(t.datetime_complete for t in trials) - min(t.datetime_start for t in trials)).total_seconds()


def busy_share(study: optuna.Study) -> float:
    """The share of the span the workers spent inside trials, averaged over workers."""
    trials = [t for t in study.get_trials(deepcopy=False) if t.datetime_start and t.datetime_complete]
    workers = {t.user_attrs.get("worker") for t in trials}
    busy = sum((t.datetime_complete - t.datetime_start).total_seconds() for t in trials)
    return busy / len(workers) / span_s(study)


def best(study: optuna.Study) -> optuna.trial.FrozenTrial:
    return min((t for t in study.get_trials(deepcopy=False) if t.values), key=lambda t: t.values[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-trials", type=int, default=40)
    parser.add_argument("--gpus", nargs="+", default=["0", "0,1"], help="--gpus settings, the first one the reference")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        os.chdir(folder)
        model, inputs = prepare(folder)
        rows = []
        for gpus in args.gpus:
            study, wall = search(model, inputs, gpus, args.n_trials, args.seed)
            trials = study.get_trials(deepcopy=False)
            retried = retried_numbers(trials)
            evaluated = sum(has_own_result(t, retried) for t in trials)
            workers = len({t.user_attrs.get("worker") for t in trials})
            devices = sorted({str(t.user_attrs.get("gpu")) for t in trials})
            rows.append((gpus, workers, evaluated, wall, span_s(study), best(study), devices, study))
        print(f"\nMobileNetV2 at batch {BATCH}, {CRITERION} on 24 photo crops, ONNX Runtime's default space")
        print(
            f"{'--gpus':<8}{'workers':>8}{'trials':>8}{'wall s':>9}{'span s':>9}{'busy':>7}{'trials/h':>10}"
            "  best (search)"
        )
        for gpus, workers, evaluated, wall, span, top, devices, study in rows:
            print(
                f"{gpus:<8}{workers:>8}{evaluated:>8}{wall:>9.1f}{span:>9.1f}{busy_share(study):>7.0%}"
                f"{3600 * evaluated / span:>10.0f}  trial {top.number}: {top.values[0]:.4g} ms on {', '.join(devices)}"
            )
        reference = rows[0]
        for row in rows[1:]:
            print(f"speedup --gpus {row[0]} over --gpus {reference[0]}: {reference[4] / row[4]:.2f}x (spans)")
        for gpus, *_, top, _, _ in rows:
            print(f"best of --gpus {gpus}: " + ", ".join(f"{k}={v}" for k, v in top.params.items()))
        compare_bests([row[5] for row in rows], rows[0][7], args.gpus[0].split(",")[0], folder)


def compare_bests(tops: list[optuna.trial.FrozenTrial], study: optuna.Study, gpu: str, folder: Path) -> None:
    """The bests, re-measured interleaved in three fresh processes on one GPU; ratios to the first."""
    template = template_from_study(study)
    evaluations = [replace(template, candidate=dict(t.params)) for t in tops]
    measured = interleave(evaluations, folder / "compare.log", 3, print, 60.0, 900.0, pinned(gpu), rounds=20)
    found = speedups(measured.medians, measured.processes)
    print(
        f"the bests re-measured interleaved on GPU {gpu} ({len(measured.medians)} rounds):"
        f" first {found[0].latency_ms:.4g} ms"
    )
    for column, each in enumerate(found[1:], start=2):
        same = "the same within the interval" if each.low <= 1.0 <= each.high else "different"
        print(
            f"  best {column}: {each.latency_ms:.4g} ms, first/this {each.estimate:.3f} "
            f"[95% CI {each.low:.3f}-{each.high:.3f}]: {same}"
        )


if __name__ == "__main__":
    main()
