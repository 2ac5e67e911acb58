"""The confirmation's job in a worker: every finalist opened in one process and timed in interleaved rounds."""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass, replace

from gpt_optuna.core.space import Candidate
from gpt_optuna.evaluation.jobs import EvaluateJob
from gpt_optuna.evaluation.measure import interleaved_rounds, launch_timer, measure
from gpt_optuna.evaluation.worker import report_progress

ROUNDS, BLOCK = 10, 10
"""Interleaved rounds, and launches per candidate in each."""
ROUNDS_BUDGET_S = 60.0
"""The rounds of one process stop (after three at least) once this long has passed."""


@dataclass(frozen=True)
class RoundTimed:
    """One interleaved round's medians (ms, in the job's candidate order), reported as soon as it
    is timed: the tuner keeps every round a process measured, even where the process is stopped."""

    medians: tuple[float, ...]


@dataclass(frozen=True)
class ConfirmJob:
    """Open every candidate in this process, warm each up, then time them in interleaved rounds
    (until ``rounds_until``, monotonic seconds, where given: three rounds at least), reporting how
    far it is and each round (:class:`RoundTimed`); returns the number of rounds timed."""

    template: EvaluateJob
    candidates: tuple[Candidate, ...]
    rounds: int = ROUNDS
    block: int = BLOCK
    budget_s: float = ROUNDS_BUDGET_S
    rounds_until: float | None = None

    def __call__(self) -> int:
        with ExitStack() as stack:
            runners = []
            for index, candidate in enumerate(self.candidates):
                report_progress(f"building {index + 1} of {len(self.candidates)}")
                runners.append(stack.enter_context(replace(self.template, candidate=candidate).open_candidate()))
            report_progress("warming up")
            for runner in runners:
                measure(runner, replace(self.template.settings, budget_s=min(1.0, self.template.settings.budget_s)))
            deadline = time.monotonic() + self.budget_s
            if self.rounds_until is not None:
                deadline = min(deadline, self.rounds_until)
            timers = [launch_timer(runner, self.template.settings.flush_l2) for runner in runners]
            timed = interleaved_rounds(
                timers,
                self.rounds,
                self.block,
                deadline,
                lambda row: report_progress(RoundTimed(tuple(float(v) for v in row))),
            )
            return len(timed)
