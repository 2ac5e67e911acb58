"""One handler per ``gpt-optuna`` command, found in a table by the command's name."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpt_optuna.cli.parser import build_parser, tune_config
from gpt_optuna.core.errors import UserError
from gpt_optuna.search.config import TuneConfig, default_storage, storage_url
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
    """The study a reading command names, as the API opens it; only ``confirm`` writes to it."""
    from gpt_optuna.api.study import load

    return load(*_resolve_storage(args))


def print_space(config: TuneConfig, as_json: bool) -> int:
    from gpt_optuna.search.preparation import offered_space

    notes: list[str] = []
    say = (lambda text: print(text, file=sys.stderr)) if not as_json else (lambda _: None)
    space, versions = offered_space(config, notes, say)
    for note in notes:
        print(note, file=sys.stderr)
    left = _left_in_study(config, space)
    if as_json:
        counts = {"candidates": space.size(), "left": None if left is None else left[1]}
        print(json.dumps({"backend": config.backend, "versions": versions, "knobs": space.describe(), **counts}))
    else:
        print(f"{config.backend} ({', '.join(f'{k} {v}' for k, v in versions.items())}) for {config.model}:")
        print(space.table())
        if left is not None:
            print(f"study {left[0]}: {left[1]:,} of the {space.size():,} candidates not evaluated yet")
    return 0


def _left_in_study(config: TuneConfig, space: Any) -> tuple[str, int] | None:
    """(study name, candidates of ``space`` no trial holds) where the study ``config`` names exists."""
    from gpt_optuna.api.study import open_existing_study
    from gpt_optuna.search.coverage import candidates_left
    from gpt_optuna.study.storage import storage_file

    assert config.storage is not None and config.study_name is not None
    path = storage_file(config.storage)
    if path is not None and not path.is_file():
        return None
    try:
        study = open_existing_study(config.storage, config.study_name)
    except UserError:
        return None
    return config.study_name, candidates_left(space, study.get_trials(deepcopy=False))


def run(argv: list[str]) -> int:
    """Parse ``argv`` and run its command; the exit code."""
    args = build_parser().parse_args(argv)
    if args.command in STUDY_COMMANDS:
        return STUDY_COMMANDS[args.command](args, _open_existing(args))
    return COMMANDS[args.command](args, argv)


def _tune(args: argparse.Namespace, argv: list[str]) -> int:
    from gpt_optuna.search.progress import Progress
    from gpt_optuna.search.tune import tune

    progress = Progress(enabled=not args.quiet)
    end = tune(tune_config(args), progress)
    progress.finish(end.summary, end.steps(argv), end.note, end.took)
    return end.code


def _check(args: argparse.Namespace, _: list[str]) -> int:
    from gpt_optuna.api.check import gate

    options = (args.config, args.junit, args.update, not args.quiet)
    return gate(args.model, args.baseline, args.budget, args.tolerance, *options).code


def _space(args: argparse.Namespace, _: list[str]) -> int:
    return print_space(tune_config(args), as_json=args.json)


def _worker(args: argparse.Namespace, _: list[str]) -> int:
    from gpt_optuna.search.join import JoinConfig, join
    from gpt_optuna.search.progress import Progress

    config = JoinConfig(
        storage=storage_url(args.storage),
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


def _doctor(args: argparse.Namespace, _: list[str]) -> int:
    from gpt_optuna.api.doctor import doctor

    return doctor(as_json=args.json)


def _storage_proxy(args: argparse.Namespace, _: list[str]) -> int:
    from gpt_optuna.study.storage import serve_storage

    return serve_storage(args.storage, args.host, args.port)


def _report(args: argparse.Namespace, study: Any) -> int:
    print(f"wrote {study.report(args.output, error=args.error)}")
    return 0


def _export(args: argparse.Namespace, study: Any) -> int:
    options = {"trial": args.trial, "format": args.format, "force": args.force, "model_name": args.model_name}
    exported = study.export(args.output, **options)
    print("\n".join(exported.lines))
    return 0


def _confirm(args: argparse.Namespace, study: Any) -> int:
    study.confirm(top=args.top, processes=args.processes, rounds=args.rounds, timeout=args.timeout)
    return 0


def _compare(args: argparse.Namespace, study: Any) -> int:
    options = {"processes": args.processes, "rounds": args.rounds, "timeout": args.timeout}
    found = study.compare(args.a, args.b, **options, progress=not args.json)
    print(json.dumps(found.to_dict()) if args.json else "\n".join(found.lines()))
    return 0


def _profile(args: argparse.Namespace, study: Any) -> int:
    found = study.profile(args.trial, runs=args.runs, progress=not args.json)
    print(json.dumps(found.to_dict()) if args.json else "\n".join(found.lines()))
    return 0


def _status(_: argparse.Namespace, study: Any) -> int:
    print(study)
    size, files, folder = study.disk_used()
    if files:
        print(f"artifact store: {size / 2**20:,.1f} MiB in {files} files ({folder})")
    return 0


def _best(args: argparse.Namespace, study: Any) -> int:
    from gpt_optuna.results.summary_text import format_verdict

    winner = study.winner
    if winner is None:
        raise UserError(f"study {study.study_name} has no feasible trial yet")
    if args.json:
        print(json.dumps(winner.to_dict()))
        return 0
    print("\n".join([winner.headline, *format_verdict(study.summary)]))
    if winner.accuracy:
        print("accuracy: " + ", ".join(f"{k}={v:.6g}" for k, v in winner.accuracy.items()))
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace, list[str]], int]] = {
    "tune": _tune,
    "check": _check,
    "space": _space,
    "worker": _worker,
    "storage-proxy": _storage_proxy,
    "doctor": _doctor,
}
"""The commands that open no study first, each with the command line's arguments."""
STUDY_COMMANDS: dict[str, Callable[[argparse.Namespace, Any], int]] = {
    "report": _report,
    "export": _export,
    "confirm": _confirm,
    "compare": _compare,
    "profile": _profile,
    "status": _status,
    "best": _best,
}
"""The commands that read (``confirm``: and write) an existing study, opened as :class:`TunedStudy`."""
