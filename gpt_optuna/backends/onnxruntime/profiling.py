"""Where an ONNX Runtime session's time goes, node by node: its own profiler's trace, read back.

The session is created as the candidate's (its model, session and provider options) with
``enable_profiling`` on and run on one sample; each node's kernel time is the median over the runs
(the first run's allocations and any outlier do not count), with its operator type and provider.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from gpt_optuna.backends.base import NodeTime, Profiling, where_offered
from gpt_optuna.backends.onnxruntime.settings import CUDA_GRAPH, ort_module, provider_options, session_options

KERNEL = "_kernel_time"
"""The suffix of a node's kernel event in ONNX Runtime's trace."""


def profiled_nodes(job: Profiling) -> list[NodeTime]:
    """Run the candidate's session ``runs`` times under ONNX Runtime's profiler; its node times.
    A CUDA graph is not captured: its replays run no node the profiler sees."""
    candidate = where_offered(job.candidate, {CUDA_GRAPH: False, "trt.cuda_graph": False})
    with tempfile.TemporaryDirectory() as folder:
        options = session_options(candidate)
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(folder) / "profile")
        providers = [(str(candidate["provider"]), provider_options(candidate, None, job.paths.caches))]
        session = ort_module().InferenceSession(str(job.model.path), options, providers=providers)
        for _ in range(job.runs):
            session.run(None, job.feeds)
        trace = json.loads(Path(session.end_profiling()).read_text())
    return node_times(trace)


CONTROL_FLOW = frozenset({"If", "Loop", "Scan"})
"""Operators whose kernel time is their subgraphs' nodes' time, which the trace reports node by
node too: left out, so that no time is counted twice."""


def node_times(trace: list[dict[str, Any]]) -> list[NodeTime]:
    """Each node's median kernel time (ms) in an ONNX Runtime trace, slowest first; control-flow
    nodes left out (:data:`CONTROL_FLOW`)."""
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
    found = [
        NodeTime(n, *kinds[n], statistics.median(d)) for n, d in durations.items() if kinds[n][0] not in CONTROL_FLOW
    ]
    return sorted(found, key=lambda t: -t.median_ms)
