"""Where a candidate's time goes, operator by operator or layer by layer, in a worker: the
candidate built as a trial builds it and run under the engine's own profiler
(:meth:`Backend.layer_times`)."""

from __future__ import annotations

from dataclasses import dataclass

from gpt_optuna.backends.base import NodeTime
from gpt_optuna.evaluation.jobs import EvaluateJob, _backend


@dataclass(frozen=True)
class ProfileJob:
    """Profile ``evaluation``'s candidate over ``runs`` runs on the study's first sample."""

    evaluation: EvaluateJob
    runs: int

    def __call__(self) -> list[NodeTime]:
        job = self.evaluation
        model = job.transformed_model()
        backend = _backend(job.backend)
        feeds, outputs = job.samples(model)[0], job.templates(model)
        return backend.layer_times(model, job.engine_candidate, job.workdir, job.shapes, feeds, outputs, self.runs)
