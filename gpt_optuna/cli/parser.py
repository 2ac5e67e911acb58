"""The command line: every command's flags, and a TuneConfig from them."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gpt_optuna import __version__
from gpt_optuna.core.errors import UserError
from gpt_optuna.evaluation.measure import ROUNDS
from gpt_optuna.search.config import TuneConfig, read_toml
from gpt_optuna.search.options import OPTIONS

_OPTIONS = {option.dest: option for option in OPTIONS}


def _add(parser: argparse.ArgumentParser, *dests: str, **changes: Any) -> None:
    """Add these tune options to ``parser``; ``changes`` are another command's own keywords (help, required)."""
    for dest in dests:
        option = _OPTIONS[dest]
        parser.add_argument(option.flag, **{"help": option.help, **option.kind.argparse, **option.argparse, **changes})


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
    _add(tune, *_OPTIONS)

    space = commands.add_parser("space", help="print the search space for a model, building nothing")
    _add(space, "model")
    _add(space, "backend", help="onnxruntime (default), tensorrt, tensorrt-rtx, or module:Class")
    _add(space, "shape", help=None)
    _add(space, "inputs", help="input data: .npz keyed by input name")
    _add(space, "config", help="tune.toml; its [space] table is applied")
    space.add_argument("--json", action="store_true", help="print the knobs as JSON")
    _add(space, "allow_io_change")
    _add(space, "storage", help="the study's storage, whose candidates not evaluated yet are counted (default: tune's)")
    _add(space, "study_name", help="the study whose candidates not evaluated yet are counted (default: tune's)")

    worker = commands.add_parser(
        "worker", help="join a study's search from this host (its storage must be reachable from here)"
    )
    _add(worker, "storage", required=True, help="the study's storage URL (PostgreSQL, grpc://, journal:)")
    _add(worker, "study_name", required=True, help="the study to join")
    worker.add_argument("--model", help="the model file here (default: the path the study recorded)")
    _add(worker, "n_trials", help="the study's trial target (default: the one its search set)")
    _add(worker, "timeout")
    _add(worker, "artifacts", help="the study's artifact store as mounted here (default: its recorded path)")
    _add(worker, "workers", "gpus", "allow_mixed_gpus", "quiet")

    proxy = commands.add_parser(
        "storage-proxy", help="serve a storage to many workers over gRPC (they use --storage grpc://HOST:PORT)"
    )
    proxy.add_argument("--storage", required=True, help="the storage to serve, e.g. postgresql://... or sqlite:///...")
    proxy.add_argument("--host", default="localhost", help="address to listen on (default localhost; 0.0.0.0: all)")
    proxy.add_argument("--port", type=int, default=13000, help="port (default 13000)")

    status = commands.add_parser("status", help="trial counts, baseline and best of a study")
    _add(status, "storage", "study_name")
    confirm = commands.add_parser("confirm", help="re-measure the best candidates and the baseline, interleaved")
    _add(confirm, "storage", "study_name")
    confirm.add_argument("--top", type=int, default=5, help="how many of the best feasible candidates (default 5)")
    confirm.add_argument("--processes", type=int, default=5, help="fresh processes to measure in (default 5)")
    confirm.add_argument(
        "--rounds", type=int, default=ROUNDS, help=f"interleaved rounds in each process (default {ROUNDS})"
    )
    confirm.add_argument(
        "--timeout",
        help="bound the whole re-measurement, e.g. 20m; processes that would not fit are left out, and what was"
        " measured is kept (default: none; a process that says nothing for long is stopped as hung)",
    )

    compare = commands.add_parser(
        "compare", help="two trials, models or exports of a study on its inputs, timed interleaved: one verdict"
    )
    compare.add_argument("a", help="A: a trial number, baseline, yours (tune --baseline-config), or an ONNX model")
    compare.add_argument("b", help="B: the same kinds; the verdict is B's speedup over A")
    _add(compare, "storage", "study_name")
    compare.add_argument("--processes", type=int, default=5, help="fresh processes to time in (default 5)")
    compare.add_argument(
        "--rounds", type=int, default=ROUNDS, help=f"interleaved rounds in each process (default {ROUNDS})"
    )
    compare.add_argument("--timeout", help="bound the timing, e.g. 10m; what was measured is kept")
    compare.add_argument("--json", action="store_true", help="the comparison as JSON")

    profile = commands.add_parser(
        "profile", help="a trial's time per operator type, node or layer beside the baseline's (the engine's profiler)"
    )
    profile.add_argument(
        "trial", nargs="?", help="a trial number, baseline or yours (default: the study's decided one)"
    )
    _add(profile, "storage", "study_name")
    profile.add_argument("--runs", type=int, default=50, help="runs profiled for each (default 50)")
    profile.add_argument("--json", action="store_true", help="the profile as JSON")

    check = commands.add_parser(
        "check",
        help="CI gate: the model against a record written by export (exit 0 pass, 1 regression, 5 not decided)",
    )
    check.add_argument("model", help="ONNX model file (the model the record was made for, possibly changed)")
    check.add_argument("--baseline", required=True, help="the record: FILE.json written by gpt-optuna export")
    check.add_argument("--budget", default="10m", help="the whole check's time, e.g. 10m (default 10m)")
    check.add_argument("--tolerance", default="5%", help="allowed latency change, e.g. 5%% (default 5%%)")
    check.add_argument("--junit", help="write a JUnit XML report here")
    check.add_argument("--update", action="store_true", help="rewrite the record when the check finds it faster")
    _add(check, "config", help="tune.toml: its [measure] and [space] tables, trial_timeout, confirm_processes")
    _add(check, "quiet")

    report = commands.add_parser("report", help="write the study as one self-contained HTML page")
    _add(report, "storage", "study_name")
    report.add_argument("-o", "--output", default="report.html", help="HTML file to write (default report.html)")
    report.add_argument(
        "--error",
        metavar="METRIC",
        help="the accuracy metric the Pareto front is drawn against: one of the criterion's clauses (a metric of"
        " your --metric among them) or max_abs, mean_abs, rel_l2, cosine (default: the criterion's clause whose"
        " values differ between the feasible trials)",
    )

    export = commands.add_parser("export", help="write a trial's engine (default: the best) with a JSON side file")
    _add(export, "storage", "study_name")
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
    _add(best, "storage", "study_name")
    best.add_argument("--json", action="store_true", help="print one JSON object")

    doctor = commands.add_parser(
        "doctor", help="the engines, execution providers, GPUs and knobs here, and a self-test of each engine"
    )
    doctor.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def tune_config(args: argparse.Namespace) -> TuneConfig:
    values: dict[str, Any] = read_toml(Path(args.config)) if args.config else {}
    # getattr: space takes only some of the options
    flags = {
        option.field: option.kind.from_flag(getattr(args, option.dest, None)) for option in OPTIONS if option.field
    }
    values.update({k: v for k, v in flags.items() if v is not None})
    if "model" not in values:
        raise UserError("no model given: gpt-optuna tune MODEL.onnx")
    try:
        return TuneConfig(**values)
    except TypeError as exc:
        raise UserError(f"bad configuration: {exc}") from exc


EXIT_CODES = """exit codes:
  0    success (for check: accuracy held and latency is within the tolerance)
  1    check only: a regression (slower beyond the tolerance, or accuracy lost), named in one line
  2    user error or a fault of the machine (bad input, bad record, full disk, read-only files): one line
  3    the search finished without any feasible candidate
  4    internal error (a bug): the traceback is printed
  5    check only: not decided (a host too noisy for the tolerance, or a budget spent first)
  130  interrupted by Ctrl-C (143 by SIGTERM, 129 by SIGHUP): the summary and the command that resumes
       are printed"""
