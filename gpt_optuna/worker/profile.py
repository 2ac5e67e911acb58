"""Where a candidate's time goes, operator by operator or layer by layer, in a worker: the
trial's kept engine where the engine loads it, else the candidate built as a trial builds it, run
under the engine's own profiler (:meth:`Backend.layer_times`)."""

from __future__ import annotations

from gpt_optuna.backends.base import NodeTime, Profiling
from gpt_optuna.protocol.jobs import ProfileJob
from gpt_optuna.worker.evaluate import backend_of, samples_of, templates_of, transformed_model


def profile(job: ProfileJob) -> list[NodeTime]:
    """Profile the job's candidate over its runs on the study's first sample."""
    evaluation = job.evaluation
    model = transformed_model(evaluation)
    backend = backend_of(evaluation.backend)
    feeds, outputs = samples_of(evaluation, model)[0], templates_of(evaluation, model)
    saved = None if evaluation.saved_engine is None else evaluation.saved_engine.read_bytes()
    candidate, paths = evaluation.engine_candidate, evaluation.engine_paths
    return backend.layer_times(Profiling(model, candidate, paths, evaluation.shapes, feeds, outputs, job.runs, saved))
