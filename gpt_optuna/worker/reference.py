"""The accuracy reference, in a worker: the unmodified model run with ONNX Runtime on the CPU in fp32."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpt_optuna.backends.onnxruntime.settings import ort_module
from gpt_optuna.core.errors import UserError
from gpt_optuna.core.log import onnxruntime_options
from gpt_optuna.graph.model import Feeds, ModelInfo, one_line
from gpt_optuna.protocol.jobs import ReferenceJob


def run_reference(job: ReferenceJob) -> list[Feeds]:
    """The model's outputs on each of the job's samples."""
    return fp32_outputs(job.model, job.samples)


def fp32_outputs(info: ModelInfo, samples: Sequence[Feeds]) -> list[Feeds]:
    """The unmodified model's outputs on each sample, run in this process."""
    ort = ort_module()
    try:
        session = ort.InferenceSession(str(info.path), onnxruntime_options(ort), providers=["CPUExecutionProvider"])
        found = [session.run(None, feeds) for feeds in samples]
    except Exception as exc:
        raise UserError(f"ONNX Runtime cannot run {info.path} on CPU for the reference: {one_line(exc)}") from exc
    return [{spec.name: np.asarray(v) for spec, v in zip(info.outputs, values, strict=True)} for values in found]
