"""The command line: every command's flags, and a TuneConfig from them."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gpt_optuna import __version__
from gpt_optuna.core.errors import UserError
from gpt_optuna.search.config import SAMPLERS, TuneConfig, parse_duration, read_toml


def _worker_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workers", type=int, help="evaluation workers in parallel (default: one per --gpus entry, else one)"
    )
    parser.add_argument("--gpus", help="GPUs to search on, one worker pinned to each: all, or indices such as 0,1")
    parser.add_argument(
        "--allow-mixed-gpus",
        action="store_true",
        default=None,
        help="let workers on different GPU models search one study (their latencies are ranked together)",
    )


def _io_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--allow-io-change",
        action="store_true",
        default=None,
        help="let fp16/bf16 candidates take and return fp16/bf16 tensors (TOML: allow_io_change = true); "
        "by default every candidate keeps the model's input and output names, dtypes and ranks",
    )


def _storage_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--storage", help="Optuna storage URL (default sqlite:///studies/<study-name>.db)")
    parser.add_argument("--study-name", help="study name (default: the only study in the storage)")


_TUNE_ONLY = (
    "accuracy",
    "samples",
    "metric",
    "calibration",
    "n_trials",
    "timeout",
    "trial_timeout",
    "storage",
    "study_name",
    "sampler",
    "seed",
    "dry_run",
    "confirm_top",
    "confirm_processes",
    "objectives",
    "workers",
    "gpus",
    "artifacts",
    "allow_mixed_gpus",
    "no_seeds",
    "warm_start",
    "allow_io_change",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpt-optuna",
        description="Search engine configurations for the fastest one that meets an accuracy criterion.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"gpt-optuna {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    tune = commands.add_parser("tune", help="run or resume a search")
    tune.add_argument("model", nargs="?", help="ONNX model file (or `model` in --config)")
    tune.add_argument(
        "--backend",
        help="onnxruntime (default), tensorrt (10.x/11.x), tensorrt-rtx, or package.module:Class, "
        "e.g. --backend tensorrt-rtx",
    )
    tune.add_argument("--accuracy", help='criterion, e.g. "cosine>=0.9999 and max_abs<=1e-2" (default cosine>=0.9999)')
    tune.add_argument(
        "--inputs",
        help="input samples: an .npz keyed by input name (a leading sample axis for several), a folder of "
        ".npz files, or a data loader module:function / script.py:function yielding feed dicts "
        "(default: one generated batch)",
    )
    tune.add_argument("--samples", type=int, help="use at most this many samples of --inputs")
    tune.add_argument(
        "--metric",
        help="module:function (or script.py:function) computing task metrics from the outputs, reference "
        "outputs and inputs of all samples; its names can be used in --accuracy, e.g. top1_agree>=0.99",
    )
    tune.add_argument(
        "--calibration",
        help="int8/fp8 calibration samples, in any form --inputs takes (default: the --inputs samples)",
    )
    tune.add_argument(
        "--shape", action="append", default=None, metavar="NAME:DIMS", help="input shape, e.g. x:1x3x224x224"
    )
    tune.add_argument(
        "--n-trials", type=int, help="trials the study should hold when done (default 100 without --timeout)"
    )
    tune.add_argument("--timeout", help="stop after this long, e.g. 8h, 30m, 90s")
    tune.add_argument("--trial-timeout", help="deadline for one candidate (default 600 s)")
    _storage_flags(tune)
    tune.add_argument("--sampler", choices=SAMPLERS, help="tpe (default), gp (needs the gp extra), random or nsga2")
    tune.add_argument("--seed", type=int, help="sampler seed")
    tune.add_argument("--config", help="tune.toml with the same keys, plus [measure] and [space] tables")
    tune.add_argument(
        "--dry-run",
        action="store_true",
        default=None,
        help="build every candidate without running it; the value is the build time",
    )
    tune.add_argument(
        "--confirm-top", type=int, help="finalists re-measured with the baseline after the search (default 5, 0: off)"
    )
    tune.add_argument(
        "--confirm-processes", type=int, help="fresh processes the finalists are re-measured in (default 3)"
    )
    tune.add_argument(
        "--objectives",
        help="latency (default), or latency with any of error, memory (TensorRT), build_s: a multi-objective "
        "search, e.g. --objectives latency,error",
    )
    _worker_flags(tune)
    tune.add_argument(
        "--artifacts",
        help="artifact store folder for engines and the study's data (default studies/<study>/artifacts); "
        "a folder every host mounts lets workers on other hosts join",
    )
    tune.add_argument(
        "--no-seeds",
        action="store_true",
        default=None,
        help="do not try the backend's every-speed-feature-on candidate right after the baseline",
    )
    tune.add_argument(
        "--warm-start",
        help="try first the best configurations of these studies in the same storage (comma-separated), "
        "or auto: every finished study of this backend measured on this device",
    )
    _io_flag(tune)
    tune.add_argument("--quiet", action="store_true", help="no progress bar")

    space = commands.add_parser("space", help="print the search space for a model, building nothing")
    space.add_argument("model", nargs="?", help="ONNX model file (or `model` in --config)")
    space.add_argument("--backend", help="onnxruntime (default), tensorrt, tensorrt-rtx, or module:Class")
    space.add_argument("--shape", action="append", default=None, metavar="NAME:DIMS")
    space.add_argument("--inputs", help="input data: .npz keyed by input name")
    space.add_argument("--config", help="tune.toml; its [space] table is applied")
    space.add_argument("--json", action="store_true", help="print the knobs as JSON")
    _io_flag(space)
    space.set_defaults(**dict.fromkeys(set(_TUNE_ONLY) - {"allow_io_change"}))

    worker = commands.add_parser(
        "worker", help="join a study's search from this host (its storage must be reachable from here)"
    )
    worker.add_argument("--storage", required=True, help="the study's storage URL (PostgreSQL, grpc://, journal:)")
    worker.add_argument("--study-name", required=True, help="the study to join")
    worker.add_argument("--model", help="the model file here (default: the path the study recorded)")
    worker.add_argument("--n-trials", type=int, help="the study's trial target (default: the one its search set)")
    worker.add_argument("--timeout", help="stop after this long, e.g. 8h, 30m, 90s")
    worker.add_argument("--artifacts", help="the study's artifact store as mounted here (default: its recorded path)")
    _worker_flags(worker)
    worker.add_argument("--quiet", action="store_true", help="no progress bar")

    proxy = commands.add_parser(
        "storage-proxy", help="serve a storage to many workers over gRPC (they use --storage grpc://HOST:PORT)"
    )
    proxy.add_argument("--storage", required=True, help="the storage to serve, e.g. postgresql://... or sqlite:///...")
    proxy.add_argument("--host", default="localhost", help="address to listen on (default localhost; 0.0.0.0: all)")
    proxy.add_argument("--port", type=int, default=13000, help="port (default 13000)")

    status = commands.add_parser("status", help="trial counts, baseline and best of a study")
    _storage_flags(status)
    confirm = commands.add_parser("confirm", help="re-measure the best candidates and the baseline, interleaved")
    _storage_flags(confirm)
    confirm.add_argument("--top", type=int, default=5, help="how many of the best feasible candidates (default 5)")
    confirm.add_argument("--processes", type=int, default=3, help="fresh processes to measure in (default 3)")

    check = commands.add_parser(
        "check",
        help="CI gate: the model against a record written by export (exit 0 pass, 1 regression, 2 user error)",
    )
    check.add_argument("model", help="ONNX model file (the model the record was made for, possibly changed)")
    check.add_argument("--baseline", required=True, help="the record: FILE.json written by gpt-optuna export")
    check.add_argument("--budget", default="10m", help="search time, e.g. 10m (default 10m)")
    check.add_argument("--tolerance", default="5%", help="allowed latency change, e.g. 5%% (default 5%%)")
    check.add_argument("--junit", help="write a JUnit XML report here")
    check.add_argument("--update", action="store_true", help="rewrite the record when the check finds it faster")
    check.add_argument("--config", help="tune.toml: its [measure] and [space] tables, trial_timeout, confirm_processes")
    check.add_argument("--quiet", action="store_true", help="no progress bar")

    report = commands.add_parser("report", help="write the study as one self-contained HTML page")
    _storage_flags(report)
    report.add_argument("-o", "--output", default="report.html", help="HTML file to write (default report.html)")

    export = commands.add_parser("export", help="write a trial's engine (default: the best) with a JSON side file")
    _storage_flags(export)
    export.add_argument("--trial", type=int, help="trial number (default: the best)")
    export.add_argument(
        "-o",
        "--output",
        required=True,
        help="file to write (its .json side file goes beside it), or with --format triton the model repository folder",
    )
    export.add_argument(
        "--format",
        choices=("file", "triton"),
        default="file",
        help="file (default): the engine or model; triton: REPO/<model>/config.pbtxt and REPO/<model>/1/model.*",
    )
    export.add_argument("--model-name", help="the model's name in the Triton repository (default: the model file's)")
    export.add_argument("--force", action="store_true", help="overwrite files (or a Triton model folder) that exist")

    best = commands.add_parser("best", help="the best feasible trial")
    _storage_flags(best)
    best.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def tune_config(args: argparse.Namespace) -> TuneConfig:
    values: dict[str, Any] = read_toml(Path(args.config)) if args.config else {}
    flags = {
        "model": Path(args.model) if args.model else None,
        "backend": args.backend,
        "accuracy": args.accuracy,
        "inputs": Path(args.inputs) if args.inputs else None,
        "samples": args.samples,
        "metric": args.metric,
        "calibration": Path(args.calibration) if args.calibration else None,
        "shapes": args.shape,
        "n_trials": args.n_trials,
        "timeout_s": parse_duration(args.timeout) if args.timeout else None,
        "trial_timeout_s": parse_duration(args.trial_timeout) if args.trial_timeout else None,
        "storage": args.storage,
        "study_name": args.study_name,
        "sampler": args.sampler,
        "seed": args.seed,
        "dry_run": args.dry_run,
        "confirm_top": args.confirm_top,
        "confirm_processes": args.confirm_processes,
        "objectives": args.objectives,
        "workers": args.workers,
        "gpus": args.gpus,
        "artifacts": Path(args.artifacts) if args.artifacts else None,
        "allow_mixed_gpus": args.allow_mixed_gpus,
        "no_seeds": args.no_seeds,
        "warm_start": args.warm_start,
        "allow_io_change": args.allow_io_change,
    }
    values.update({k: v for k, v in flags.items() if v is not None})
    if "model" not in values:
        raise UserError("no model given: gpt-optuna tune MODEL.onnx")
    try:
        return TuneConfig(**values)
    except TypeError as exc:
        raise UserError(f"bad configuration: {exc}") from exc


def parse_tolerance(text: str) -> float:
    """``5%`` or ``0.05`` as a fraction."""
    try:
        value = float(text.strip().removesuffix("%")) / (100 if text.strip().endswith("%") else 1)
    except ValueError:
        raise UserError(f"malformed --tolerance {text!r}: use e.g. 5% or 0.05") from None
    if not 0 <= value < 1:
        raise UserError(f"--tolerance must be between 0 and 100 %, got {text!r}")
    return value


EXIT_CODES = """exit codes:
  0    success (for check: accuracy held and latency is within the tolerance)
  1    check only: a regression (slower beyond the tolerance, or accuracy lost), named in one line
  2    user error or a fault of the machine (bad input, bad record, full disk, read-only files): one line
  3    the search finished without any feasible candidate
  4    internal error (a bug): the traceback is printed
  130  interrupted by Ctrl-C (143 by SIGTERM, 129 by SIGHUP): the summary and the command that resumes
       are printed"""
