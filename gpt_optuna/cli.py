"""The ``gpt-optuna`` command: tune, status, best."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from gpt_optuna import __version__, interrupts
from gpt_optuna.config import SAMPLERS, TuneConfig, default_storage, parse_duration, read_toml, study_flags
from gpt_optuna.errors import EXIT_INTERNAL, EXIT_USER_ERROR, UserError, environment_fault


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


def _resolve_storage(args: argparse.Namespace) -> tuple[str, str | None]:
    if args.storage:
        return args.storage, args.study_name
    if args.study_name:
        return default_storage(args.study_name), args.study_name
    found = sorted(Path("studies").glob("*.db"))
    if len(found) == 1:
        return default_storage(found[0].stem), found[0].stem
    if not found:
        raise UserError("no study found under studies/; give --storage or --study-name")
    raise UserError(
        f"several studies under studies/ ({', '.join(p.stem for p in found)}); choose one with --study-name"
    )


def _open_existing(args: argparse.Namespace) -> Any:
    """The study a reading command names; only ``confirm`` writes to it."""
    from gpt_optuna.study import load_study, open_storage

    url, name = _resolve_storage(args)
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).is_file():
        raise UserError(f"no study database at {url.removeprefix('sqlite:///')}")
    storage = open_storage(url, create=False, read_only=args.command != "confirm")
    if name is None:
        import optuna

        names = [s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)]
        if len(names) != 1:
            raise UserError(
                f"the storage holds {len(names)} studies ({', '.join(names)}); choose one with --study-name"
            )
        name = names[0]
    return load_study(storage, name)


def print_space(config: TuneConfig, as_json: bool) -> int:
    from gpt_optuna.tuner import offered_space

    notes: list[str] = []
    say = (lambda text: print(text, file=sys.stderr)) if not as_json else (lambda _: None)
    space, versions = offered_space(config, notes, say)
    for note in notes:
        print(note, file=sys.stderr)
    if as_json:
        print(json.dumps({"backend": config.backend, "versions": versions, "knobs": space.describe()}))
    else:
        print(f"{config.backend} ({', '.join(f'{k} {v}' for k, v in versions.items())}) for {config.model}:")
        print(space.table())
    return 0


def writable_file(path: Path) -> Path:
    """``path`` if a file can be written there: its folder exists and it is not a folder itself."""
    if path.is_dir():
        raise UserError(f"{path} is a folder: give a file name to write")
    if not path.parent.is_dir():
        raise UserError(f"the folder {path.parent} does not exist")
    return path


def best_record(summary: Any) -> dict[str, Any]:
    """The winner as ``best --json`` prints it: the verdict, the latencies of one measurement and
    their ratio (the export's side file states them alike)."""
    from gpt_optuna.export import figures_record

    best = summary.best
    figures = figures_record(summary, best)
    if summary.dry_run:
        figures |= {"latency_ms": None, "baseline_latency_ms": None, "search_latency_ms": None}
    stability = summary.stability
    return {
        "number": best.number,
        "params": best.params,
        "baseline_wins": summary.baseline_wins,
        **figures,
        "build_s": best.user_attrs.get("build_s"),
        "dry_run": summary.dry_run,
        "confirmed": summary.confirmed,
        "accuracy": best.user_attrs.get("accuracy", {}),
        "allow_io_change": summary.allow_io_change,
        "io_changes": summary.io_changes,
        "unstable_measurements": None if stability is None else [stability.unstable, stability.measured],
    }


def run(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "tune":
        from gpt_optuna.progress import Progress
        from gpt_optuna.tuner import tune

        return tune(tune_config(args), Progress(enabled=not args.quiet), argv)
    if args.command == "check":
        from gpt_optuna.check import run_check

        allowed = ("measure", "space", "trial_timeout_s", "confirm_processes", "confirm_top", "sampler", "seed")
        base = {k: v for k, v in (read_toml(Path(args.config)) if args.config else {}).items() if k in allowed}
        junit = writable_file(Path(args.junit)) if args.junit else None
        return run_check(
            Path(args.model),
            Path(args.baseline),
            parse_duration(args.budget),
            parse_tolerance(args.tolerance),
            base,
            junit,
            args.update,
            args.quiet,
        )
    if args.command == "space":
        return print_space(tune_config(args), as_json=args.json)
    if args.command == "worker":
        from gpt_optuna.join import JoinConfig, join
        from gpt_optuna.progress import Progress

        config = JoinConfig(
            storage=args.storage,
            study_name=args.study_name,
            model=Path(args.model) if args.model else None,
            n_trials=args.n_trials,
            timeout_s=parse_duration(args.timeout) if args.timeout else None,
            artifacts=Path(args.artifacts) if args.artifacts else None,
            workers=args.workers,
            gpus=args.gpus,
            allow_mixed_gpus=bool(args.allow_mixed_gpus),
        )
        return join(config, Progress(enabled=not args.quiet))
    if args.command == "storage-proxy":
        from gpt_optuna.study import serve_storage

        return serve_storage(args.storage, args.host, args.port)
    from gpt_optuna.progress import format_summary, format_verdict, headline
    from gpt_optuna.study import summarize_study

    study = _open_existing(args)
    if args.command == "report":
        import shlex

        from gpt_optuna.report import render

        output = writable_file(Path(args.output))
        output.write_text(render(study, shlex.join(study_flags(_resolve_storage(args)[0], study.study_name))))
        print(f"wrote {output}")
        return 0
    if args.command == "export":
        if args.format == "triton":
            from gpt_optuna.triton import model_name, write_repository

            folder, left_out, side = write_repository(
                study, args.trial, Path(args.output), args.model_name or model_name(study), args.force
            )
            print(f"wrote {folder}/config.pbtxt and the model in {folder}/1")
            print("\n".join(export_lines(side)[1:]))
            for item in left_out:
                print(f"note: Triton's model configuration has no field for {item}; the model runs without it")
            return 0
        from gpt_optuna.export import export_trial

        _, side = export_trial(study, args.trial, writable_file(Path(args.output)), args.force)
        print("\n".join(export_lines(side)))
        return 0
    if args.command == "confirm":
        from gpt_optuna.confirm import confirm, template_from_study

        if args.top < 1 or args.processes < 1:
            raise UserError("--top and --processes must be at least 1")
        from gpt_optuna.study import study_folder

        log = study_folder(study) / "confirm.log"
        plural = "es" if args.processes > 1 else ""
        print(f"re-measuring the {args.top} best candidates and the baseline in {args.processes} process{plural} ...")
        say = lambda text: print(text, flush=True)  # noqa: E731
        if confirm(study, template_from_study(study), log, args.top, args.processes, say=say) is None:
            raise UserError(f"study {study.study_name} has no measured baseline and feasible candidate to confirm")
    if args.command == "confirm":
        from gpt_optuna.winner import record_winner

        summary = record_winner(study)
    else:
        summary = summarize_study(study)
    if args.command in ("status", "confirm"):
        print(format_summary(summary))
        return 0
    if summary.best is None:
        raise UserError(f"study {summary.name} has no feasible trial yet")
    record = best_record(summary)
    if args.json:
        print(json.dumps(record))
        return 0
    print("\n".join([headline(summary), *format_verdict(summary)]))
    if record["accuracy"]:
        print("accuracy: " + ", ".join(f"{k}={v:.6g}" for k, v in record["accuracy"].items()))
    return 0


def export_lines(side: Path) -> list[str]:
    """What ``export`` says: the files, the study's verdict (for its winner) or the trial's figures
    as the side file states them, and an interface that changed (``--allow-io-change``)."""
    from gpt_optuna.interface import describe_changes

    record = json.loads(side.read_text())
    written = side.with_name(side.name.removesuffix(".json"))
    lines = [f"wrote {written} and {side}"]
    if record.get("headline"):  # the study's winner: its verdict, as every reader says it
        lines.append(record["headline"])
    elif record.get("speedup") is not None:
        interval = record.get("speedup_ci95")
        lines.append(
            f"trial {record['trial']}: {record['latency_ms']:.4g} ms against the baseline's "
            f"{record['baseline_latency_ms']:.4g} ms, {record['speedup']:.3f}x"
            + (f" [95% CI {interval[0]:.3f}-{interval[1]:.3f}]" if interval else "")
            + f" ({record['measurement']})"
        )
    if record["interface"]["changed"]:
        lines.append(
            f"note: {written.name} {describe_changes(record['interface']['changes'])}: its study allowed"
            " I/O dtype changes (--allow-io-change); gpt_optuna.open_session converts"
        )
    return lines


EXIT_CODES = """exit codes:
  0    success (for check: accuracy held and latency is within the tolerance)
  1    check only: a regression (slower beyond the tolerance, or accuracy lost), named in one line
  2    user error or a fault of the machine (bad input, bad record, full disk, read-only files): one line
  3    the search finished without any feasible candidate
  4    internal error (a bug): the traceback is printed
  130  interrupted by Ctrl-C (143 by SIGTERM, 129 by SIGHUP): the summary and the command that resumes
       are printed"""


def main(argv: list[str] | None = None) -> int:
    # a Ctrl-C that lands inside a fetch makes SQLAlchemy log the cursor it could not close, with a
    # traceback; the interruption itself is reported, and storage errors raise
    logging.getLogger("sqlalchemy").setLevel(logging.CRITICAL)
    interrupts.install()
    try:
        return run(sys.argv[1:] if argv is None else argv)
    except UserError as exc:
        print(f"gpt-optuna: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        # only a step that had not begun the search or finished its writes is left here
        print(f"gpt-optuna: stopped by {interrupts.cause()}; run the same command again to carry on", file=sys.stderr)
        return interrupts.exit_code()
    except BrokenPipeError:  # output piped into a reader that stopped (`status | head -1`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:
        fault = environment_fault(exc)
        if fault is None:
            traceback.print_exc()
            print(
                f"gpt-optuna: internal error (a bug, please report it with the traceback above): {exc}", file=sys.stderr
            )
            return EXIT_INTERNAL
        print(f"gpt-optuna: error: {fault}", file=sys.stderr)
        return EXIT_USER_ERROR


if __name__ == "__main__":
    sys.exit(main())
