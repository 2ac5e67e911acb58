"""The confirmation's job in a worker: every finalist opened in one process and timed in interleaved rounds."""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass, replace

from gpt_optuna.evaluation.jobs import EvaluateJob
from gpt_optuna.evaluation.measure import (
    BLOCK,
    ROUNDS,
    ROUNDS_BUDGET_S,
    interleaved_rounds,
    launch_timer,
    measure,
    settle_cpu,
)
from gpt_optuna.evaluation.worker import report_progress


@dataclass(frozen=True)
class RoundTimed:
    """One interleaved round's medians (ms, in the job's candidate order), reported as soon as it
    is timed: the tuner keeps every round a process measured, even where the process is stopped."""

    medians: tuple[float, ...]


@dataclass(frozen=True)
class ConfirmJob:
    """Open every candidate in this process, warm each up, then time them in interleaved rounds
    (until ``rounds_until``, monotonic seconds, where given: three rounds at least), reporting how
    far it is and each round (:class:`RoundTimed`); returns the number of rounds timed. Host
    runners (the CPU's) are timed once the process is idle again (:func:`settle_cpu`), so that one
    candidate's spinning threads do not slow the next."""

    evaluations: tuple[EvaluateJob, ...]
    """Each candidate as an evaluation of its model (one study's template with its candidate, or
    another model's: an exported one beside a changed one)."""
    rounds: int = ROUNDS
    block: int = BLOCK
    budget_s: float = ROUNDS_BUDGET_S
    rounds_until: float | None = None

    def __call__(self) -> int:
        settings = self.evaluations[0].settings
        with ExitStack() as stack:
            runners = []
            for index, evaluation in enumerate(self.evaluations):
                report_progress(f"building {index + 1} of {len(self.evaluations)}")
                runners.append(stack.enter_context(evaluation.open_candidate()))
            report_progress("warming up")
            for runner in runners:
                measure(runner, replace(settings, budget_s=min(1.0, settings.budget_s)))
            deadline = time.monotonic() + self.budget_s
            if self.rounds_until is not None:
                deadline = min(deadline, self.rounds_until)
            timers = [launch_timer(runner, settings.flush_l2) for runner in runners]
            timed = interleaved_rounds(
                timers,
                self.rounds,
                self.block,
                deadline,
                lambda row: report_progress(RoundTimed(tuple(float(v) for v in row))),
                settle_cpu if any(runner.stream is None for runner in runners) else None,
            )
            return len(timed)
