"""One handler per ``gpt-optuna`` command, found in a table by the command's name."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpt_optuna.cli.parser import build_parser, parse_tolerance, tune_config
from gpt_optuna.core.errors import UserError
from gpt_optuna.search.config import TuneConfig, default_storage, read_toml, study_flags
from gpt_optuna.search.options import parse_duration
from gpt_optuna.study.record import STUDIES


def _resolve_storage(args: argparse.Namespace) -> tuple[str, str | None]:
    if args.storage:
        return args.storage, args.study_name
    if args.study_name:
        return default_storage(args.study_name), args.study_name
    found = sorted(STUDIES.glob("*.db"))
    if len(found) == 1:
        return default_storage(found[0].stem), found[0].stem
    if not found:
        raise UserError("no study found under studies/; give --storage or --study-name")
    raise UserError(
        f"several studies under studies/ ({', '.join(p.stem for p in found)}); choose one with --study-name"
    )


def _open_existing(args: argparse.Namespace) -> Any:
    """The study a reading command names; only ``confirm`` writes to it."""
    from gpt_optuna.study.storage import load_study, open_storage

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
    from gpt_optuna.search.preparation import offered_space

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
    from gpt_optuna.results.export import figures_record

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
    """Parse ``argv`` and run its command; the exit code."""
    args = build_parser().parse_args(argv)
    if args.command in STUDY_COMMANDS:
        return STUDY_COMMANDS[args.command](args, _open_existing(args))
    return COMMANDS[args.command](args, argv)


def _tune(args: argparse.Namespace, argv: list[str]) -> int:
    from gpt_optuna.search.progress import Progress
    from gpt_optuna.search.tune import tune

    return tune(tune_config(args), Progress(enabled=not args.quiet), argv)


def _check(args: argparse.Namespace, _: list[str]) -> int:
    from gpt_optuna.cli.check import run_check

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


def _space(args: argparse.Namespace, _: list[str]) -> int:
    return print_space(tune_config(args), as_json=args.json)


def _worker(args: argparse.Namespace, _: list[str]) -> int:
    from gpt_optuna.search.join import JoinConfig, join
    from gpt_optuna.search.progress import Progress

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


def _storage_proxy(args: argparse.Namespace, _: list[str]) -> int:
    from gpt_optuna.study.storage import serve_storage

    return serve_storage(args.storage, args.host, args.port)


def _report(args: argparse.Namespace, study: Any) -> int:
    import shlex

    from gpt_optuna.results.report import render

    output = writable_file(Path(args.output))
    output.write_text(render(study, shlex.join(study_flags(_resolve_storage(args)[0], study.study_name))))
    print(f"wrote {output}")
    return 0


def _export(args: argparse.Namespace, study: Any) -> int:
    if args.format == "triton":
        from gpt_optuna.results.triton import model_name, write_repository

        folder, left_out, side = write_repository(
            study, args.trial, Path(args.output), args.model_name or model_name(study), args.force
        )
        print(f"wrote {folder}/config.pbtxt and the model in {folder}/1")
        print("\n".join(export_lines(side)[1:]))
        if left_out:
            print(
                "note: the served model is not the measured configuration: Triton's model configuration has no"
                f" field for {', '.join(left_out)}, so Triton runs it without"
            )
        return 0
    from gpt_optuna.results.export import export_trial

    _, side = export_trial(study, args.trial, writable_file(Path(args.output)), args.force)
    print("\n".join(export_lines(side)))
    return 0


def _confirm(args: argparse.Namespace, study: Any) -> int:
    import time

    from gpt_optuna.results.summary_text import format_summary
    from gpt_optuna.results.winner import record_winner
    from gpt_optuna.search.finalists import confirm, template_from_study
    from gpt_optuna.study.record import study_folder

    if args.top < 1 or args.processes < 1 or args.rounds < 3:
        raise UserError("--top and --processes must be at least 1, --rounds at least 3")
    deadline = time.monotonic() + parse_duration(args.timeout) if args.timeout else None
    log = study_folder(study) / "confirm.log"
    template = template_from_study(study)
    plural = "es" if args.processes > 1 else ""
    print(f"re-measuring the {args.top} best candidates and the baseline in {args.processes} process{plural} ...")
    say = lambda text: print(text, flush=True)  # noqa: E731
    try:
        found = confirm(study, template, log, args.top, args.processes, say, deadline=deadline, rounds=args.rounds)
    except KeyboardInterrupt:
        print(format_summary(record_winner(study)))
        raise
    if found is None:
        raise UserError(f"study {study.study_name} has no measured baseline and feasible candidate to confirm")
    print(format_summary(record_winner(study)))
    return 0


def _status(_: argparse.Namespace, study: Any) -> int:
    from gpt_optuna.results.summary_text import format_summary
    from gpt_optuna.study.summary import summarize_study

    print(format_summary(summarize_study(study)))
    return 0


def _best(args: argparse.Namespace, study: Any) -> int:
    from gpt_optuna.results.summary_text import format_verdict, headline
    from gpt_optuna.study.summary import summarize_study

    summary = summarize_study(study)
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


COMMANDS: dict[str, Callable[[argparse.Namespace, list[str]], int]] = {
    "tune": _tune,
    "check": _check,
    "space": _space,
    "worker": _worker,
    "storage-proxy": _storage_proxy,
}
"""The commands that open no study first, each with the command line's arguments."""
STUDY_COMMANDS: dict[str, Callable[[argparse.Namespace, Any], int]] = {
    "report": _report,
    "export": _export,
    "confirm": _confirm,
    "status": _status,
    "best": _best,
}
"""The commands that read (``confirm``: and write) an existing study."""


def export_lines(side: Path) -> list[str]:
    """What ``export`` says: the files, the study's verdict (for its winner) or the trial's figures
    as the side file states them, and an interface that changed (``--allow-io-change``)."""
    from gpt_optuna.graph.interface import describe_changes

    record = json.loads(side.read_text())
    written = side.with_name(side.name.removesuffix(".json"))
    lines = [f"wrote {written} and {side}"]
    if record.get("headline"):  # the study's winner: its verdict, as every reader says it
        lines.append(record["headline"])
        if record.get("decided") and not record.get("winner"):
            lines.append(
                f"note: the verdict keeps the default configuration, so this is the baseline, trial {record['trial']};"
                " export --trial N takes another trial"
            )
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
