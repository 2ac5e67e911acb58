"""How a candidate's evaluation ended: every way is an :class:`Outcome` with its detail."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpt_optuna.core.engine_facts import BuildFacts, RunFacts
from gpt_optuna.protocol.accuracy import Verdict
from gpt_optuna.protocol.timing import LatencyStats

if TYPE_CHECKING:
    from gpt_optuna.backends.base import KnobLimit


class Outcome(enum.StrEnum):
    """How a candidate ended."""

    OK = "ok"
    INFEASIBLE = "infeasible"
    TRANSFORM_ERROR = "transform_error"
    BUILD_ERROR = "build_error"
    METRIC_ERROR = "metric_error"
    CRASH = "crash"
    TIMEOUT = "timeout"
    EXCEPTION = "exception"

    @property
    def is_failure(self) -> bool:
        return self not in (Outcome.OK, Outcome.INFEASIBLE)

    @property
    def is_infeasible(self) -> bool:
        """It ran, and missed the accuracy criterion."""
        return self is Outcome.INFEASIBLE

    @property
    def is_deterministic(self) -> bool:
        """A failure of the candidate itself (its graph cannot be made, built or run by the
        engine), which happens again on every try; a crash, a hang or an exception may be the
        machine's or ours."""
        return self in (Outcome.TRANSFORM_ERROR, Outcome.BUILD_ERROR, Outcome.METRIC_ERROR)


@dataclass(frozen=True)
class TrialResult:
    """Everything one evaluation produced."""

    outcome: Outcome
    detail: str = ""
    latency: LatencyStats | None = None
    verdict: Verdict | None = None
    build_s: float | None = None
    build: BuildFacts = BuildFacts()
    run: RunFacts = RunFacts()
    eval_s: float | None = None
    """The whole evaluation's time in the worker."""
    measure_s: float | None = None
    """The latency protocol's time."""
    log: str = ""
    engine_path: Path | None = None
    limits: tuple[KnobLimit, ...] = ()
    """A check's knobs the graph cannot use everywhere (:class:`CheckJob`)."""
