"""The confirmation's work in a worker: every finalist opened in one process and timed in interleaved rounds."""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import replace

from gpt_optuna.protocol.jobs import ConfirmJob, RoundTimed
from gpt_optuna.protocol.process import report_progress
from gpt_optuna.worker.evaluate import open_candidate
from gpt_optuna.worker.measure import interleaved_rounds, launch_timer, measure, settle_cpu


def confirm(job: ConfirmJob) -> int:
    """Time ``job``'s candidates (:class:`ConfirmJob`); host runners (the CPU's) once the process is
    idle again (:func:`settle_cpu`). Returns the number of rounds timed."""
    settings = job.evaluations[0].settings
    with ExitStack() as stack:
        runners = []
        for index, evaluation in enumerate(job.evaluations):
            report_progress(f"building {index + 1} of {len(job.evaluations)}")
            runners.append(stack.enter_context(open_candidate(evaluation)))
        report_progress("warming up")
        for runner in runners:
            measure(runner, replace(settings, budget_s=min(1.0, settings.budget_s)))
        deadline = time.monotonic() + job.budget_s
        if job.rounds_until is not None:
            deadline = min(deadline, job.rounds_until)
        timers = [launch_timer(runner, settings.flush_l2) for runner in runners]
        timed = interleaved_rounds(
            timers,
            job.rounds,
            job.block,
            deadline,
            lambda row: report_progress(RoundTimed(tuple(float(v) for v in row))),
            settle_cpu if any(runner.stream is None for runner in runners) else None,
        )
        return len(timed)
