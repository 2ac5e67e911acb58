"""The ``gpt-optuna`` entry point: exit codes for every way a command ends."""

from __future__ import annotations

import logging
import os
import sys
import traceback

from gpt_optuna.core import interrupts
from gpt_optuna.core.errors import EXIT_INTERNAL, EXIT_USER_ERROR, UserError, environment_fault


def main(argv: list[str] | None = None) -> int:
    # a Ctrl-C that lands inside a fetch makes SQLAlchemy log the cursor it could not close, with a
    # traceback; the interruption itself is reported, and storage errors raise
    logging.getLogger("sqlalchemy").setLevel(logging.CRITICAL)
    interrupts.install()
    try:
        from gpt_optuna.cli.commands import run  # its libraries take a while: a Ctrl-C meanwhile is one line too

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
