"""The flags commands share (tune's options, the study's, the timing's, ``--json``), the exit
codes, and a TuneConfig from the flags."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gpt_optuna.core.errors import UserError
from gpt_optuna.protocol.timing import ROUNDS
from gpt_optuna.search.config import TuneConfig, config_from, read_toml
from gpt_optuna.search.options import DEFAULT_PROCESSES, OPTIONS

_OPTIONS = {option.dest: option for option in OPTIONS}


def add_options(parser: argparse.ArgumentParser, *dests: str, **changes: Any) -> None:
    """Add these tune options to ``parser``; ``changes`` are another command's own keywords (help, required)."""
    for dest in dests:
        option = _OPTIONS[dest]
        parser.add_argument(option.flag, **{"help": option.help, **option.kind.argparse, **option.argparse, **changes})


def study_flags(parser: argparse.ArgumentParser) -> None:
    """The study a command reads: ``--storage`` and ``--study-name``."""
    add_options(parser, "storage")
    only = "the only study in the storage, or under studies/ those of check aside"
    add_options(parser, "study_name", help=f"study name (default: {only})")


def timing_flags(parser: argparse.ArgumentParser, timed: str, timeout_help: str) -> None:
    """How a re-measurement or comparison times: fresh processes (``timed``: what they do), rounds
    in each, and a bound on the whole."""
    parser.add_argument(
        "--processes", type=int, default=DEFAULT_PROCESSES, help=f"fresh processes to {timed} in (default %(default)s)"
    )
    parser.add_argument(
        "--rounds", type=int, default=ROUNDS, help="interleaved rounds in each process (default %(default)s)"
    )
    parser.add_argument("--timeout", help=timeout_help)


def log_flags(parser: argparse.ArgumentParser) -> None:
    """How much a command says, on every command: ``-v``, ``-q``, ``--log-file``."""
    group = parser.add_argument_group("what it says")
    group.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="say more: debug detail, and ONNX Runtime's own warnings (-vv: all its logs)",
    )
    group.add_argument(
        "-q",
        "--quiet",
        action="count",
        default=0,
        help="say less: -q no progress bar; -qq only warnings, errors and results",
    )
    group.add_argument(
        "--log-file", type=Path, help="append everything said, debug detail included, with times, to this file"
    )


def json_flag(parser: argparse.ArgumentParser, what: str) -> None:
    """``--json``: print ``what`` as JSON instead of lines."""
    parser.add_argument("--json", action="store_true", help=f"print {what} as JSON")


def tune_config(args: argparse.Namespace) -> TuneConfig:
    values: dict[str, Any] = read_toml(Path(args.config)) if args.config else {}
    # getattr: space takes only some of the options
    flags = {
        option.field: option.kind.from_flag(getattr(args, option.dest, None)) for option in OPTIONS if option.field
    }
    values.update({k: v for k, v in flags.items() if v is not None})
    if "model" not in values:
        raise UserError("no model given: gpt-optuna tune MODEL.onnx")
    return config_from(values)


EXIT_CODES = """exit codes:
  0    success (for check: accuracy held and latency is within the tolerance)
  1    check only: a regression (slower beyond the tolerance, or accuracy lost), named in one line
  2    user error or a fault of the machine (bad input, bad record, full disk, read-only files): one line
  3    the search finished without any feasible candidate
  4    internal error (a bug): the traceback is printed
  5    check only: not decided (a host too noisy for the tolerance, or a budget spent first)
  130  interrupted by Ctrl-C (143 by SIGTERM, 129 by SIGHUP): the summary and the command that resumes
       are printed"""
