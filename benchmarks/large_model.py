"""The tuner's overhead and trials per hour on a large transformer (GPU; any backend).

Exports torchvision's ViT-B/16 (seeded random weights: latency does not depend on them; batch 8,
about 330 MB) and searches it in one study twice: a first run (the space found and checked) and a
resume (the check remembered). For each run it prints the time of each phase, trials per hour,
and the overhead: the run's wall time before the finalists' re-measurement, less the engines' own
work (each trial's build and latency measurement, as the worker timed them), as a share of that
wall time. The share for a 30-trial search is projected from the measured figures (the first
run's preparation, plus 30 trials of the mean measured overhead and work). Target: at most 10 %.

    python -m benchmarks.large_model [--trials 30] [--resume-trials 5] [--timeout 3600] [--model M.onnx]
        [--backend tensorrt]
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial

BATCH = 8
PROJECTED_TRIALS = 30


def export_vit(path: Path) -> None:
    """torchvision's ViT-B/16 with seeded weights, batch 8, as one ONNX file."""
    import torch
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.vit_b_16(weights=None).eval()
    images = torch.randn(BATCH, 3, 224, 224)
    torch.onnx.export(
        model, (images,), str(path), input_names=["images"], output_names=["logits"], opset_version=17, dynamo=False
    )


def phases(stdout: str) -> dict[str, float]:
    """The run's ``took`` line (``took 75.5 s: preparing 12.3 s, searching 50.1 s``) as
    {phase: seconds}, with ``all`` for the whole run."""
    line = next((text for text in stdout.splitlines() if text.startswith("took ")), None)
    if line is None:
        raise SystemExit(f"no 'took' line in the output:\n{stdout}")
    whole, _, parts = line.removeprefix("took ").partition(": ")
    spans = {"all": float(whole.removesuffix(" s"))}
    for part in filter(None, parts.split(", ")):
        name, seconds, _ = part.rsplit(" ", 2)
        spans[name] = float(seconds)
    return spans


def run(argv: list[str], cwd: Path) -> tuple[dict[str, float], str]:
    """One gpt-optuna command: its phases, and its stderr."""
    result = subprocess.run([sys.executable, "-m", "gpt_optuna.cli", *argv], cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {result.returncode}:\n{result.stderr[-4000:]}")
    return phases(result.stdout), result.stderr


def run_trials(study: optuna.Study, since: datetime.datetime) -> list[FrozenTrial]:
    """The trials a run started (at ``since`` or later) that did their own work (not reused)."""
    return [
        t
        for t in study.get_trials(deepcopy=False)
        if t.datetime_start is not None and t.datetime_start >= since and "reused_from" not in t.user_attrs
    ]


def seconds(trial: FrozenTrial, key: str) -> float:
    return float(trial.user_attrs.get(key) or 0.0)


def trial_table(trials: list[FrozenTrial]) -> None:
    """Each trial's wall time, split: the engine's build and timing, the rest of the worker's work
    (graph transforms, loading, the accuracy check), and what the tuner did around the worker."""
    print("  trial  state     wall s  build s  timing s  other worker s  around worker s  transforms")
    for t in trials:
        wall = (t.datetime_complete - t.datetime_start).total_seconds() if t.datetime_complete else 0.0
        work = seconds(t, "eval_s")
        engine = seconds(t, "build_s") + seconds(t, "measure_s")
        print(
            f"  {t.number:5d}  {t.state.name.lower():8s} {wall:7.2f} {seconds(t, 'build_s'):8.2f}"
            f" {seconds(t, 'measure_s'):9.2f} {work - engine:15.2f} {wall - work:16.2f}"
            f"  {t.user_attrs.get('transformed_model', '-')[:40]}"
        )


def report(name: str, spans: dict[str, float], trials: list[FrozenTrial]) -> tuple[float, float]:
    """Print one run's figures; return its wall time before the re-measurement and its overhead."""
    trial_table(trials)
    wall = spans.get("preparing", 0.0) + spans.get("searching", 0.0)
    work = sum(seconds(t, "build_s") + seconds(t, "measure_s") for t in trials)
    overhead = wall - work
    per_hour = 3600 * len(trials) / spans["searching"] if spans.get("searching") else 0.0
    print(
        f"{name}: {len(trials)} trials; preparing {spans.get('preparing', 0):.1f} s,"
        f" searching {spans.get('searching', 0):.1f} s; engines' own work (build + timing) {work:.1f} s;"
        f" overhead {overhead:.1f} s = {100 * overhead / wall:.1f} % of {wall:.1f} s;"
        f" {per_hour:.0f} trials/hour while searching"
    )
    return wall, overhead


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=30, help="trials of the first run")
    parser.add_argument("--resume-trials", type=int, default=5, help="trials the resume adds")
    parser.add_argument("--timeout", default="3600", help="--timeout of each run")
    parser.add_argument("--model", type=Path, help="an ONNX model to search instead of the exported ViT-B/16")
    parser.add_argument("--backend", default="onnxruntime", help="the backend to search (default: onnxruntime)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        work_dir = Path(folder)
        model = args.model.resolve() if args.model else work_dir / "vit_b_16.onnx"
        if args.model is None:
            started = time.monotonic()
            export_vit(model)
            print(f"exported {model.name} in {time.monotonic() - started:.0f} s")
        print(f"{model.name}: {model.stat().st_size / 2**20:.0f} MiB")
        storage = f"sqlite:///{work_dir / 'vit.db'}"
        base = ["tune", str(model), "--backend", args.backend, "--storage", storage, "--study-name", "vit"]
        base += ["--confirm-top", "0", "--quiet"]
        base += ["--timeout", args.timeout]
        since = datetime.datetime.now()
        first, notes = run([*base, "--n-trials", str(args.trials)], work_dir)
        print("\n".join(line for line in notes.splitlines() if "not searched" in line or "checked" in line))
        study = optuna.load_study(study_name="vit", storage=storage)
        trials = run_trials(study, since)
        wall, overhead = report("first run", first, trials)
        since = datetime.datetime.now()
        second, _ = run([*base, "--n-trials", str(args.trials + args.resume_trials)], work_dir)
        report("resume", second, run_trials(optuna.load_study(study_name="vit", storage=storage), since))
        count = len(trials)
        preparing = first.get("preparing", 0.0)
        per_trial = (wall - preparing) / max(count, 1)
        per_trial_overhead = (overhead - preparing) / max(count, 1)
        projected = (preparing + PROJECTED_TRIALS * per_trial_overhead) / (preparing + PROJECTED_TRIALS * per_trial)
        print(
            f"projected for a {PROJECTED_TRIALS}-trial search: overhead {100 * projected:.1f} % (the preparation"
            f" {preparing:.1f} s once, {per_trial_overhead:.2f} s of overhead in each {per_trial:.1f} s trial);"
            " target at most 10 %"
        )


if __name__ == "__main__":
    main()
