"""Where a candidate's time goes, operator by operator: ONNX Runtime's own profiler, in a worker.

The session is created as the candidate's (its model, session and provider options) with
``enable_profiling`` on, run ``runs`` times on the study's first sample, and the trace ONNX Runtime
writes is read back: each node's kernel time, its median over the runs (the first run's
allocations and any outlier do not count), with its operator type and provider.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gpt_optuna.core.errors import UserError
from gpt_optuna.evaluation.jobs import EvaluateJob

KERNEL = "_kernel_time"
"""The suffix of a node's kernel event in ONNX Runtime's trace."""


@dataclass(frozen=True)
class NodeTime:
    """One node's median kernel time over the profiled runs."""

    name: str
    op_type: str
    provider: str
    median_ms: float


@dataclass(frozen=True)
class ProfileJob:
    """Profile ``evaluation``'s candidate over ``runs`` runs; each node's :class:`NodeTime`."""

    evaluation: EvaluateJob
    runs: int = 50

    def __call__(self) -> list[NodeTime]:
        from gpt_optuna.backends.onnxruntime.settings import ort_module, provider_options, session_options

        if self.evaluation.backend != "onnxruntime":
            raise UserError(f"profile reads ONNX Runtime's profiler; backend {self.evaluation.backend!r} has none here")
        model = self.evaluation.transformed_model()
        candidate = self.evaluation.engine_candidate
        feeds = self.evaluation.samples(model)[0]
        with tempfile.TemporaryDirectory() as folder:
            options = session_options(candidate)
            options.enable_profiling = True
            options.profile_file_prefix = str(Path(folder) / "profile")
            providers = [(str(candidate["provider"]), provider_options(candidate, None, self.evaluation.workdir))]
            session = ort_module().InferenceSession(str(model.path), options, providers=providers)
            for _ in range(self.runs):
                session.run(None, feeds)
            trace = json.loads(Path(session.end_profiling()).read_text())
        return node_times(trace)


def node_times(trace: list[dict]) -> list[NodeTime]:
    """Each node's median kernel time (ms) in an ONNX Runtime trace, slowest first."""
    durations: dict[str, list[float]] = {}
    kinds: dict[str, tuple[str, str]] = {}
    for event in trace:
        name = str(event.get("name", ""))
        if event.get("cat") != "Node" or not name.endswith(KERNEL):
            continue
        node = name.removesuffix(KERNEL)
        durations.setdefault(node, []).append(float(event.get("dur", 0)) / 1000)
        args = event.get("args", {})
        kinds[node] = (str(args.get("op_name", "?")), str(args.get("provider", "?")))
    found = [NodeTime(n, *kinds[n], statistics.median(d)) for n, d in durations.items()]
    return sorted(found, key=lambda t: -t.median_ms)
