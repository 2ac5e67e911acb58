"""``gpt-optuna profile``: where a trial's time goes, operator by operator, beside the baseline's.

Both are profiled in fresh processes by the engine's own profiler (:mod:`profile_job`: ONNX
Runtime's per node, TensorRT's ``IProfiler`` per layer, a layer typed by the ONNX operators it was
made of); the operator types are listed slowest first with the baseline's time, the trial's and
their ratio, then the trial's slowest nodes or layers. The result is kept in the study folder
(``profile-TRIAL.json``), or where that folder is read-only in a temporary one, which is named.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import optuna

from gpt_optuna.api.compare import side, writable_folder
from gpt_optuna.backends.base import NodeTime
from gpt_optuna.core.errors import UserError
from gpt_optuna.core.files import atomic_write
from gpt_optuna.core.log import tell
from gpt_optuna.protocol.jobs import ProfileJob
from gpt_optuna.protocol.process import JobFailure, Worker
from gpt_optuna.search.finalists import template_from_study
from gpt_optuna.search.options import DEFAULT_PROFILE_RUNS
from gpt_optuna.study.summary_record import study_summary

PROFILE_TIMEOUT_S = 600.0
HOST_TIMED = frozenset({"CUDAExecutionProvider", "TensorrtExecutionProvider"})
"""ONNX Runtime providers whose node events time the launch on the host, not the GPU's work."""
TOP_NODES = 10


@dataclass(frozen=True)
class Profile:
    """The trial's and the baseline's node times."""

    trial: str
    baseline: str
    trial_nodes: list[NodeTime]
    baseline_nodes: list[NodeTime]
    runs: int

    def by_op_type(self) -> list[tuple[str, float, float]]:
        """(operator type, baseline ms, trial ms) per run, the trial's slowest first."""
        totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for column, nodes in enumerate((self.baseline_nodes, self.trial_nodes)):
            for node in nodes:
                totals[node.op_type][column] += node.median_ms
        return sorted(((op, b, t) for op, (b, t) in totals.items()), key=lambda row: (-row[2], -row[1]))

    def lines(self) -> list[str]:
        base = sum(n.median_ms for n in self.baseline_nodes)
        mine = sum(n.median_ms for n in self.trial_nodes)
        lines = [
            f"{self.trial} against {self.baseline}: operator kernels {mine:.4g} ms against {base:.4g} ms per run"
            f" (median of {self.runs} runs each, the engine's profiler; time outside kernels not counted)",
            f"  {'operator type':<28} {'baseline ms':>12} {'trial ms':>12} {'ratio':>8}",
        ]
        for op, b, t in self.by_op_type():
            ratio = f"{b / t:.2f}x" if b and t else "only here" if t else "gone"
            lines.append(f"  {op:<28} {b:>12.4f} {t:>12.4f} {ratio:>8}")
        if any(n.provider in HOST_TIMED for n in (*self.trial_nodes, *self.baseline_nodes)):
            lines.append(
                "note: ONNX Runtime times a GPU provider's nodes on the host, as they are launched, not their kernels"
                " on the GPU: the figures show launch-bound work; compare the whole latency with compare"
            )
        lines.append(f"the trial's {min(TOP_NODES, len(self.trial_nodes))} slowest nodes or layers:")
        lines += [
            f"  {n.median_ms:>9.4f} ms  {n.op_type:<20} {n.name} ({n.provider})" for n in self.trial_nodes[:TOP_NODES]
        ]
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {
            "trial": self.trial,
            "baseline": self.baseline,
            "runs": self.runs,
            "by_op_type": [{"op_type": op, "baseline_ms": b, "trial_ms": t} for op, b, t in self.by_op_type()],
            "trial_nodes": [asdict(n) for n in self.trial_nodes],
            "baseline_nodes": [asdict(n) for n in self.baseline_nodes],
        }


def profile(
    study: optuna.Study, trial: str | None = None, runs: int = DEFAULT_PROFILE_RUNS, say: Callable[[str], None] = tell
) -> Profile:
    """Profile ``trial`` (default: the study's decided one) and the baseline."""
    if runs < 1:
        raise UserError("--runs must be at least 1")
    if trial is None:
        decided = study_summary(study).decided
        if decided is None:
            raise UserError(f"study {study.study_name} has no feasible trial yet")
        trial = str(decided.number)
    if not (trial.removeprefix("trial:").isdigit() or trial in ("baseline", "yours")):
        raise UserError(f"profile takes a trial number, baseline or yours, not {trial!r}")
    template = template_from_study(study)
    sides = side(study, template, trial), side(study, template, "baseline")
    folder = writable_folder(study)
    found: list[list[NodeTime]] = []
    for one in sides:
        if found and one.label == sides[0].label:  # the trial is the baseline
            found.append(found[0])
            continue
        say(f"profiling {one.label} over {runs} runs ...")
        try:
            with Worker(folder.log("profile")) as worker:
                found.append(worker.run(ProfileJob(one.job, runs), PROFILE_TIMEOUT_S))
        except JobFailure as failure:
            raise UserError(f"{one.label} could not be profiled: {failure}") from None
    result = Profile(sides[0].label, sides[1].label, found[0], found[1], runs)
    atomic_write(folder.profile(sides[0].label.removeprefix("trial ")), json.dumps(result.to_dict()))
    return result
