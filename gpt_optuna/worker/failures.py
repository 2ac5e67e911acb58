"""A candidate's failures in the worker, as results: each with its log, written to the worker log too."""

from __future__ import annotations

import traceback

from gpt_optuna.backends import BuildError
from gpt_optuna.core.log import logger
from gpt_optuna.protocol.outcome import Outcome, TrialResult


class MetricFailed(Exception):
    """The user's metric function raised; ``log`` holds its traceback."""

    def __init__(self, message: str, log: str) -> None:
        super().__init__(message)
        self.log = log


def build_failure(exc: BuildError) -> TrialResult:
    """A build error's result, with the engine's log and the traceback."""
    return failure(Outcome.BUILD_ERROR, str(exc), f"{exc.log}\n{traceback.format_exc()}".lstrip())


def failure(outcome: Outcome, detail: str, log: str) -> TrialResult:
    """A failed candidate's result; its whole log goes to the worker log too."""
    logger(__name__).error(f"{outcome.value}: {detail}\n{log}")
    return TrialResult(outcome, detail, log=log)
