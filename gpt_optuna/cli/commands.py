"""The ``gpt-optuna`` commands: one table of them, each with its flags beside its handler, and the
parser made from it."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpt_optuna import __version__
from gpt_optuna.cli.parser import EXIT_CODES, add_options, json_flag, log_flags, study_flags, timing_flags, tune_config
from gpt_optuna.core import log
from gpt_optuna.core.engine_spec import trial_engine
from gpt_optuna.core.errors import UserError
from gpt_optuna.core.words import counted
from gpt_optuna.search.config import CHECK_STUDY, TuneConfig, default_storage, storage_url
from gpt_optuna.search.config import study_flags as flags_naming
from gpt_optuna.search.options import (
    DEFAULT_CHECK_BUDGET,
    DEFAULT_PROFILE_ROUNDS,
    DEFAULT_PROFILE_RUNS,
    DEFAULT_TOLERANCE,
    DEFAULT_TOP,
    OPTIONS,
    optional_path,
    parse_duration,
)
from gpt_optuna.study.record import STUDIES

if TYPE_CHECKING:
    from gpt_optuna.usecases.tune import TuneEnd

DEFAULT_PORT = 13000
"""The port ``storage-proxy`` serves on."""
DEFAULT_REPORT = "report.html"
"""The page ``report`` writes."""


def _resolve_storage(args: argparse.Namespace) -> tuple[str, str | None]:
    if args.storage:
        return args.storage, args.study_name
    if args.study_name:
        return default_storage(args.study_name), args.study_name
    found = sorted(STUDIES.glob("*.db"))
    yours = [p for p in found if not CHECK_STUDY.fullmatch(p.stem)] or found  # check's own studies aside
    if len(yours) == 1:
        return default_storage(yours[0].stem), yours[0].stem
    if not found:
        raise UserError("no study found under studies/; give --storage or --study-name")
    checks = len(found) - len(yours)
    aside = f"; {checks} more made by gpt-optuna check" if checks else ""
    raise UserError(
        f"several studies under studies/ ({', '.join(p.stem for p in yours)}{aside}); choose one with --study-name"
    )


def print_space(config: TuneConfig, as_json: bool) -> int:
    from gpt_optuna.usecases.preparation import offered_space

    notes: list[str] = []
    say = (lambda text: print(text, file=sys.stderr)) if not as_json else (lambda _: None)
    space, versions = offered_space(config, notes, say)
    for note in notes:
        print(note, file=sys.stderr)
    assert config.storage is not None and config.study_name is not None
    left = _left_in_study(config.storage, config.study_name, space)
    if as_json:
        counts = {"candidates": space.size(), "left": left}
        print(json.dumps({"backend": config.backend, "versions": versions, "knobs": space.describe(), **counts}))
    else:
        print(f"{config.backend} ({', '.join(f'{k} {v}' for k, v in versions.items())}) for {config.model}:")
        print(space.table())
        if left is not None:
            print(f"study {config.study_name}: {left:,} of the {space.size():,} candidates not evaluated yet")
    return 0


def _left_in_study(storage: str, name: str, space: Any) -> int | None:
    """The candidates of ``space`` no trial holds, where the study ``name`` exists in ``storage``."""
    from gpt_optuna.api.study import open_existing_study
    from gpt_optuna.search.coverage import candidates_left

    try:
        study = open_existing_study(storage, name)
    except UserError:
        return None
    return candidates_left(space, study.get_trials(deepcopy=False))


def _tune_flags(parser: argparse.ArgumentParser) -> None:
    add_options(parser, *(option.dest for option in OPTIONS))


def _tune(args: argparse.Namespace, argv: list[str]) -> int:
    from gpt_optuna.api.tuning import run_tune
    from gpt_optuna.usecases.progress import Progress

    progress = Progress(enabled=not args.quiet)
    end = run_tune(tune_config(args), progress)
    progress.finish(end.summary, next_steps(end, argv), end.note, end.took)
    return end.code


def next_steps(end: TuneEnd, args: list[str]) -> list[str]:
    """The commands worth running next after the run ``end`` tells (``args``: the command that ran),
    each runnable as printed from any folder: resume the search (the same command) where a signal
    stopped it before its end, else extend it (a larger --n-trials; not where the space is covered),
    confirm the finalists where they were not (or were stopped), report, and export the winner where
    it is a real improvement."""
    from gpt_optuna.results.export import export_suffix

    extended, given = [], iter(args)
    for arg in given:
        if arg == "--n-trials":
            next(given, None)  # its value
        elif not arg.startswith("--n-trials="):
            extended.append(arg)
    config, summary = end.config, end.summary
    target = max(end.done, config.n_trials or 0) + max(10, end.done // 2)
    here = shlex.quote(str(Path.cwd()))
    where = shlex.join(flags_naming(str(config.storage), str(config.study_name)))
    extend = shlex.join([*extended, "--n-trials", str(target)])
    advice = end.advice()
    steps = []
    if advice.resume:
        steps.append(f"resume with: cd {here} && gpt-optuna {shlex.join(args)}")
    if advice.extend:
        steps.append(f"extend with: cd {here} && gpt-optuna {extend}")
    if advice.confirm:
        steps.append(f"confirm the finalists: gpt-optuna confirm {where}")
    if advice.remeasure_processes is not None:
        processes = advice.remeasure_processes
        steps.append(f"re-measure on a quiet host: gpt-optuna confirm {where} --processes {processes}")
    if advice.remeasure_rounds is not None:
        steps.append(f"re-measure with more rounds: gpt-optuna confirm {where} --rounds {advice.remeasure_rounds}")
    steps.append(f"report: gpt-optuna report {where} -o {shlex.quote(str(Path(DEFAULT_REPORT).resolve()))}")
    if advice.export and summary.best is not None:
        engine = trial_engine(config.backend, summary.best.params)
        out = Path("best").resolve().with_suffix(export_suffix(summary.best, engine))
        steps.append(f"export the winner: gpt-optuna export {where} -o {shlex.quote(str(out))}")
    return steps


def _check_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="ONNX model file (the model the record was made for, possibly changed)")
    parser.add_argument("--baseline", required=True, help="the record: FILE.json written by gpt-optuna export")
    parser.add_argument(
        "--budget", default=DEFAULT_CHECK_BUDGET, help="the whole check's time, e.g. 10m (default %(default)s)"
    )
    parser.add_argument(
        "--tolerance", default=DEFAULT_TOLERANCE, help="allowed latency change, e.g. 5%% (default %(default)s)"
    )
    parser.add_argument("--junit", help="write a JUnit XML report here")
    parser.add_argument("--update", action="store_true", help="rewrite the record when the check finds it faster")
    parser.add_argument(
        "--metric",
        help="the record's --metric function, script.py:function or module:function, where the record's own"
        " (beside it, or by module name) is not found here",
    )
    add_options(
        parser,
        "config",
        help="tune.toml: its [measure] and [space] tables, trial_timeout, confirm_processes, confirm_top, sampler,"
        " seed",
    )


def _check(args: argparse.Namespace, _: list[str]) -> int:
    from gpt_optuna.usecases.check import gate

    options = {"config": args.config, "junit": args.junit, "update": args.update, "metric": args.metric}
    return gate(args.model, args.baseline, args.budget, args.tolerance, progress=not args.quiet, **options).code


def _space_flags(parser: argparse.ArgumentParser) -> None:
    add_options(parser, "model")
    add_options(parser, "backend", help="onnxruntime (default), tensorrt, tensorrt-rtx, or module:Class")
    add_options(parser, "shape", help=None)
    add_options(parser, "inputs", help="input data: .npz keyed by input name")
    add_options(parser, "config", help="tune.toml; its [space] table is applied")
    json_flag(parser, "the knobs")
    add_options(parser, "allow_io_change")
    add_options(
        parser, "storage", help="the study's storage, whose candidates not evaluated yet are counted (default: tune's)"
    )
    add_options(parser, "study_name", help="the study whose candidates not evaluated yet are counted (default: tune's)")


def _space(args: argparse.Namespace, _: list[str]) -> int:
    return print_space(tune_config(args), as_json=args.json)


def _worker_flags(parser: argparse.ArgumentParser) -> None:
    add_options(parser, "storage", required=True, help="the study's storage URL (PostgreSQL, grpc://, journal:)")
    add_options(parser, "study_name", required=True, help="the study to join")
    parser.add_argument("--model", help="the model file here (default: the path the study recorded)")
    add_options(parser, "n_trials", help="the study's trial target (default: the one its search set)")
    add_options(parser, "timeout")
    add_options(parser, "artifacts", help="the study's artifact store as mounted here (default: its recorded path)")
    add_options(parser, "workers", "gpus", "allow_mixed_gpus")


def _worker(args: argparse.Namespace, _: list[str]) -> int:
    from gpt_optuna.usecases.join import JoinConfig, join
    from gpt_optuna.usecases.progress import Progress

    config = JoinConfig(
        storage=storage_url(args.storage),
        study_name=args.study_name,
        model=optional_path(args.model),
        n_trials=args.n_trials,
        timeout_s=parse_duration(args.timeout) if args.timeout else None,
        artifacts=optional_path(args.artifacts),
        workers=args.workers,
        gpus=args.gpus,
        allow_mixed_gpus=bool(args.allow_mixed_gpus),
    )
    return join(config, Progress(enabled=not args.quiet))


def _doctor_flags(parser: argparse.ArgumentParser) -> None:
    json_flag(parser, "what it found")


def _doctor(args: argparse.Namespace, _: list[str]) -> int:
    from gpt_optuna.api.doctor import doctor

    text, code = doctor(as_json=args.json)
    print(text)
    return code


def _storage_proxy_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--storage", required=True, help="the storage to serve, e.g. postgresql://... or sqlite:///...")
    parser.add_argument("--host", default="localhost", help="address to listen on (default localhost; 0.0.0.0: all)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="port (default %(default)s)")


def _storage_proxy(args: argparse.Namespace, _: list[str]) -> int:
    from gpt_optuna.study.storage import serve_storage

    return serve_storage(args.storage, args.host, args.port)


def _report_flags(parser: argparse.ArgumentParser) -> None:
    study_flags(parser)
    parser.add_argument("-o", "--output", default=DEFAULT_REPORT, help="HTML file to write (default %(default)s)")
    parser.add_argument(
        "--error",
        metavar="METRIC",
        help="the accuracy metric the Pareto front is drawn against: one of the criterion's clauses (a metric of"
        " your --metric among them) or max_abs, mean_abs, rel_l2, cosine (default: the criterion's clause whose"
        " values differ between the feasible trials)",
    )


def _report(args: argparse.Namespace, study: Any) -> int:
    print(f"wrote {study.report(args.output, error=args.error)}")
    return 0


def _export_flags(parser: argparse.ArgumentParser) -> None:
    study_flags(parser)
    parser.add_argument("--trial", type=int, help="trial number (default: the best)")
    parser.add_argument(
        "-o",
        "--output",
        required=True,
        help="file to write (its .json side file goes beside it), or with --format triton the model repository folder",
    )
    parser.add_argument(
        "--format",
        choices=("file", "triton"),
        default="file",
        help="file (default): the engine or model; triton: REPO/<model>/config.pbtxt and REPO/<model>/1/model.*",
    )
    parser.add_argument("--model-name", help="the model's name in the Triton repository (default: the model file's)")
    parser.add_argument("--force", action="store_true", help="overwrite files (or a Triton model folder) that exist")


def _export(args: argparse.Namespace, study: Any) -> int:
    options = {"trial": args.trial, "format": args.format, "force": args.force, "model_name": args.model_name}
    exported = study.export(args.output, **options)
    print("\n".join(exported.lines))
    return 0


def _confirm_flags(parser: argparse.ArgumentParser) -> None:
    study_flags(parser)
    parser.add_argument(
        "--top", type=int, default=DEFAULT_TOP, help="how many of the best feasible candidates (default %(default)s)"
    )
    timing_flags(
        parser,
        "measure",
        "bound the whole re-measurement, e.g. 20m; processes that would not fit are left out, and what was"
        " measured is kept (default: none; a process that says nothing for long is stopped as hung)",
    )


def _confirm(args: argparse.Namespace, study: Any) -> int:
    study.confirm(top=args.top, processes=args.processes, rounds=args.rounds, timeout=args.timeout)
    return 0


def _compare_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", help="A: a trial number, baseline, yours (tune --baseline-config), or an ONNX model")
    parser.add_argument("b", help="B: the same kinds; the verdict is B's speedup over A")
    study_flags(parser)
    timing_flags(parser, "time", "bound the timing, e.g. 10m; what was measured is kept")
    json_flag(parser, "the comparison")


def _compare(args: argparse.Namespace, study: Any) -> int:
    options = {"processes": args.processes, "rounds": args.rounds, "timeout": args.timeout}
    found = study.compare(args.a, args.b, **options, progress=not args.json)
    print(json.dumps(found.to_dict()) if args.json else "\n".join(found.lines()))
    if found.speedup is None:
        raise UserError(f"compare timed nothing: {found.stopped}")
    return 0


def _profile_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trial", nargs="?", help="a trial number, baseline or yours (default: the study's decided one)")
    study_flags(parser)
    parser.add_argument(
        "--runs", type=int, default=DEFAULT_PROFILE_RUNS, help="runs profiled for each (default %(default)s)"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=DEFAULT_PROFILE_ROUNDS,
        help="rounds, each profiling both in fresh processes in alternating order: their spread (default %(default)s)",
    )
    json_flag(parser, "the profile")


def _profile(args: argparse.Namespace, study: Any) -> int:
    found = study.profile(args.trial, runs=args.runs, rounds=args.rounds, progress=not args.json)
    print(json.dumps(found.to_dict()) if args.json else "\n".join(found.lines()))
    return 0


def _status(_: argparse.Namespace, study: Any) -> int:
    import importlib.util

    from gpt_optuna.results.winner import dashboard_written

    print(study)
    size, files, folder = study.disk_used()
    if files:
        print(f"artifact store: {size / 2**20:,.1f} MiB in {counted(files, 'file')} ({folder})")
    if study.winner is not None and importlib.util.find_spec("optuna_dashboard") and not dashboard_written(study.study):
        where = shlex.join(flags_naming(study.storage, study.study_name))
        print(f"optuna-dashboard does not show this study's winner yet: gpt-optuna dashboard {where} writes it")
    return 0


def _dashboard(_: argparse.Namespace, study: Any) -> int:
    winner = study.dashboard().winner
    print(
        f"optuna-dashboard shows trial {winner.number} as the study's winner: a figure on the study's page,"
        " the verdict first among its user attrs, a note on the study and on the trial; open it with:"
    )
    print(f"  optuna-dashboard {shlex.quote(study.storage)}")
    return 0


def _best_flags(parser: argparse.ArgumentParser) -> None:
    study_flags(parser)
    json_flag(parser, "the best trial")


def _best(args: argparse.Namespace, study: Any) -> int:
    from gpt_optuna.results.summary_text import format_verdict, host_lines, stability_warning

    winner = study.winner
    if winner is None:
        raise UserError(f"study {study.study_name} has no feasible trial yet")
    if args.json:
        print(json.dumps(winner.to_dict()))
        return 0
    print("\n".join([winner.headline, *format_verdict(study.summary)]))
    if winner.accuracy:
        print("accuracy: " + ", ".join(f"{k}={v:.6g}" for k, v in winner.accuracy.items()))
    for line in (*host_lines(study.summary), stability_warning(study.summary)):
        if line:
            print(line)
    return 0


@dataclass(frozen=True)
class Command:
    """One command: its name and help line, what adds its flags, and its handler, which gets the
    parsed flags and the command line, or, where it ``opens_study``, the study they name, opened as
    :class:`TunedStudy` (only ``confirm`` and ``dashboard`` write to it)."""

    name: str
    help: str
    flags: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, Any], int]
    opens_study: bool = False


COMMANDS = (
    Command("tune", "run or resume a search", _tune_flags, _tune),
    Command("space", "print the search space for a model, building nothing", _space_flags, _space),
    Command(
        "worker",
        "join a study's search from this host (its storage must be reachable from here)",
        _worker_flags,
        _worker,
    ),
    Command(
        "storage-proxy",
        "serve a storage to many workers over gRPC (they use --storage grpc://HOST:PORT)",
        _storage_proxy_flags,
        _storage_proxy,
    ),
    Command("status", "trial counts, baseline and best of a study", study_flags, _status, opens_study=True),
    Command(
        "confirm",
        "re-measure the best candidates and the baseline, interleaved",
        _confirm_flags,
        _confirm,
        opens_study=True,
    ),
    Command(
        "compare",
        "two trials, models or exports of a study on its inputs, timed interleaved: one verdict",
        _compare_flags,
        _compare,
        opens_study=True,
    ),
    Command(
        "profile",
        "a trial's time per operator type, node or layer beside the baseline's (the engine's profiler)",
        _profile_flags,
        _profile,
        opens_study=True,
    ),
    Command(
        "check",
        "CI gate: the model against a record written by export (exit 0 pass, 1 regression, 5 not decided)",
        _check_flags,
        _check,
    ),
    Command("report", "write the study as one self-contained HTML page", _report_flags, _report, opens_study=True),
    Command(
        "export",
        "write a trial's engine (default: the best) with a JSON side file",
        _export_flags,
        _export,
        opens_study=True,
    ),
    Command("best", "the best feasible trial", _best_flags, _best, opens_study=True),
    Command(
        "dashboard",
        "write the winner's figure and notes for optuna-dashboard into a study decided before it was installed",
        study_flags,
        _dashboard,
        opens_study=True,
    ),
    Command(
        "doctor",
        "the engines, execution providers, GPUs and knobs here, and a self-test of each engine",
        _doctor_flags,
        _doctor,
    ),
)
"""Every command, in the order ``--help`` lists them."""


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command in :data:`COMMANDS`."""
    parser = argparse.ArgumentParser(
        prog="gpt-optuna",
        description="Search engine configurations for the fastest one that meets an accuracy criterion.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"gpt-optuna {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        sub = commands.add_parser(command.name, help=command.help)
        command.flags(sub)
        log_flags(sub)
    return parser


def run(argv: list[str]) -> int:
    """Parse ``argv`` and run its command; the exit code."""
    args = build_parser().parse_args(argv)
    log.configure(args.verbose - args.quiet, args.log_file)
    command = next(c for c in COMMANDS if c.name == args.command)
    if not command.opens_study:
        return command.run(args, argv)
    from gpt_optuna.api.study import load  # the study as the API opens it

    return command.run(args, load(*_resolve_storage(args)))
