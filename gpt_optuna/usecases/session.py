"""This host's part of a study's search, one code path for ``tune`` and ``worker``: its worker
processes, each on a lane pinned to a GPU, checked against each other and the study's device,
marked present (a tuner starting on this host leaves their trials be), and the lanes searching
until the trial budget is spent."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial

from gpt_optuna.core import interrupts
from gpt_optuna.core.log import verbosity
from gpt_optuna.protocol.process import Worker
from gpt_optuna.search.lanes import TrialBudget, check_devices, lane_gpus, make_lanes, open_workers, run_lanes
from gpt_optuna.search.objective import Lane, Objective
from gpt_optuna.study.folder import StudyFolder
from gpt_optuna.study.recovery import tuner_presence
from gpt_optuna.usecases.progress import Progress


def begin_search() -> None:
    """What every run that searches does first (``tune``, and ``check`` through it; a joining
    ``worker``): signals handled, and Optuna's own logs held to errors, its warnings too from
    ``-v`` (its progress is ours)."""
    interrupts.install()
    logging.getLogger("optuna").setLevel(logging.WARNING if verbosity() > 0 else logging.ERROR)


class SearchSession:
    """Opened on ``stack``: ``workers`` processes (``gpus``: ``all`` or CUDA indices, see
    :func:`lane_gpus`) logging to ``folder/<log>.log``; they close with the stack."""

    def __init__(
        self, stack: contextlib.ExitStack, folder: Path, log: str, workers: int | None, gpus: str | None
    ) -> None:
        self.stack = stack
        self.folder = folder
        self.gpus = lane_gpus(workers, gpus, StudyFolder(folder).log(log))
        self.workers: list[Worker] = open_workers(stack, self.gpus, folder, log)
        self.lanes: list[Lane] = []

    def place(self, device_names: Sequence[str], on_cpu: bool) -> list[Lane]:
        """Put each worker on its lane: measuring on its GPU (``device_names``), or on the CPU where
        the candidates run there (``on_cpu``)."""
        self.lanes = make_lanes(self.workers, self.gpus, device_names, on_cpu)
        return self.lanes

    def enter(self, study_device: str | None, allow_mixed: bool) -> tuple[list[str], bool]:
        """Refuse lanes on devices that differ from each other or from the study's (unless
        ``allow_mixed``) and mark this search present here; the warnings to show, and whether no
        other tuner runs on this host."""
        notes = check_devices(self.lanes, study_device, allow_mixed)
        alone = self.stack.enter_context(tuner_presence(self.folder))
        return notes, alone

    def search(
        self,
        sampler: optuna.samplers.BaseSampler,
        objective: Objective,
        budget: TrialBudget,
        progress: Progress,
        after_trial: Callable[[optuna.Study, FrozenTrial], None],
    ) -> str | None:
        """Search the budget's study on every lane until ``budget`` is spent, telling the progress
        (then ``after_trial``) as each trial ends; what stopped it early (a signal's description),
        else None. A :class:`UserError` in a trial is raised."""

        def trial_done(study: optuna.Study, trial: FrozenTrial) -> None:
            progress.trial_done(study, trial)
            after_trial(study, trial)

        try:
            run_lanes(sampler, self.lanes, objective, budget, trial_done)
        except KeyboardInterrupt:
            return interrupts.cause()
        return None
