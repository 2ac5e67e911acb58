"""The ``gpt-optuna`` command: its parser, one handler per command, and ``check``."""
