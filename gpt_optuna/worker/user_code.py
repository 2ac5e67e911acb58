"""The user's own functions, in a worker: a data loader's samples, the metric on the reference outputs."""

from __future__ import annotations

from typing import Any

from gpt_optuna.core.errors import UserError
from gpt_optuna.graph.feeds import load_function, loaded_samples
from gpt_optuna.graph.model import Feeds
from gpt_optuna.protocol.jobs import LoaderJob, MetricJob


def load(job: LoaderJob) -> list[Feeds]:
    """The samples the job's data loader yields."""
    return loaded_samples(job.spec)


def metric(job: MetricJob) -> dict[str, Any]:
    """What the job's metric function returns; its failure is the user's to see, in one line."""
    function = load_function(job.spec, job.named)
    try:
        return dict(function(job.outputs, job.references, job.inputs))
    except Exception as exc:
        raise UserError(
            f"the {job.named} function failed on the reference outputs: {type(exc).__name__}: {exc}"
        ) from exc
