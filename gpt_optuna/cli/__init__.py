"""The ``gpt-optuna`` command: its parser, one handler per command, and ``check``."""

from gpt_optuna.cli.entry import main

__all__ = ["main"]
