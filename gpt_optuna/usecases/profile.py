"""``gpt-optuna profile``: where a trial's time goes, operator by operator, beside the baseline's.

Both are profiled by the engine's own profiler (:mod:`profile_job`: ONNX Runtime's per node,
TensorRT's ``IProfiler`` per layer, a layer typed by the ONNX operators it was made of) in rounds:
each round profiles both, each in a fresh process, in alternating order, since a process is as
fast as the CPU it gets and one pair of processes can put either ahead. The operator types are
listed slowest first with the baseline's time, the trial's (each the median over the rounds) and
the speedup (the baseline's time over the trial's); then the kernels' speedup in each round, its
spread, a note where it contradicts the study's verdict, and the trial's slowest nodes or layers.
The result is kept in the study folder (``profile-TRIAL.json``), or where that folder is read-only
in a temporary one, which is named.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from statistics import median
from typing import Any

import optuna

from gpt_optuna.backends.base import NodeTime
from gpt_optuna.core.errors import UserError
from gpt_optuna.core.files import atomic_write
from gpt_optuna.core.log import tell
from gpt_optuna.protocol.jobs import ProfileJob
from gpt_optuna.protocol.process import JobFailure, Worker
from gpt_optuna.remeasure.finalists import template_from_study
from gpt_optuna.search.options import DEFAULT_PROFILE_ROUNDS, DEFAULT_PROFILE_RUNS
from gpt_optuna.study.summary import StudySummary
from gpt_optuna.study.summary_record import study_summary
from gpt_optuna.usecases.compare import side, writable_folder

PROFILE_TIMEOUT_S = 600.0
HOST_TIMED = frozenset({"CUDAExecutionProvider", "TensorrtExecutionProvider"})
"""ONNX Runtime providers whose node events time the launch on the host, not the GPU's work."""
TOP_NODES = 10


@dataclass(frozen=True)
class Profile:
    """The trial's and the baseline's node times (each node's median over the rounds), the kernel
    time of both in each round, and a note where the rounds contradict the study's verdict."""

    trial: str
    baseline: str
    trial_nodes: list[NodeTime]
    baseline_nodes: list[NodeTime]
    runs: int
    rounds: tuple[tuple[float, float], ...] = ()
    """Per round: the baseline's and the trial's kernel time per run (ms), each in its own process."""
    verdict_note: str = ""
    """Where the rounds' speedups contradict the study's recorded verdict, what it recorded."""

    @property
    def speedups(self) -> list[float]:
        """The kernels' speedup of the trial over the baseline in each round (baseline ms / trial ms)."""
        return [b / t for b, t in self.rounds if b > 0 and t > 0]

    def by_op_type(self) -> list[tuple[str, float, float]]:
        """(operator type, baseline ms, trial ms) per run, the trial's slowest first."""
        totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for column, nodes in enumerate((self.baseline_nodes, self.trial_nodes)):
            for node in nodes:
                totals[node.op_type][column] += node.median_ms
        return sorted(((op, b, t) for op, (b, t) in totals.items()), key=lambda row: (-row[2], -row[1]))

    def lines(self) -> list[str]:
        base, mine = _kernel_ms(self.baseline_nodes), _kernel_ms(self.trial_nodes)
        over = f", then over {len(self.rounds)} rounds" if len(self.rounds) > 1 else ""
        lines = [
            f"{self.trial} against {self.baseline}: operator kernels {mine:.4g} ms against {base:.4g} ms per run"
            f" (median of {self.runs} runs each{over}, the engine's profiler; time outside kernels"
            " not counted)",
            f"  {'operator type':<28} {'baseline ms':>12} {'trial ms':>12} {'speedup (baseline/trial)':>25}",
        ]
        for op, b, t in self.by_op_type():
            ratio = f"{b / t:.2f}x" if b and t else "only here" if t else "gone"
            lines.append(f"  {op:<28} {b:>12.4f} {t:>12.4f} {ratio:>25}")
        lines += self.spread_lines()
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

    def spread_lines(self) -> list[str]:
        """The kernels' speedup in each round, its spread, and the note on the recorded verdict."""
        each = self.speedups
        note = [f"note: {self.verdict_note}"] if self.verdict_note else []
        if len(each) < 2:
            return note
        lines = [
            f"kernels' speedup (baseline/trial) over {len(each)} rounds, each side in a fresh process:"
            f" median {median(each):.2f}x, {min(each):.2f}x to {max(each):.2f}x"
            f" ({', '.join(f'{v:.2f}x' for v in each)})"
        ]
        if min(each) < 1 < max(each):
            lines.append(
                "note: the rounds disagree on which is faster: processes on this host differ by more than the"
                " difference; compare times the whole latency interleaved, with an interval"
            )
        return lines + note

    def to_dict(self) -> dict[str, Any]:
        return {
            "trial": self.trial,
            "baseline": self.baseline,
            "runs": self.runs,
            "rounds": [{"baseline_ms": b, "trial_ms": t} for b, t in self.rounds],
            "verdict_note": self.verdict_note or None,
            "by_op_type": [{"op_type": op, "baseline_ms": b, "trial_ms": t} for op, b, t in self.by_op_type()],
            "trial_nodes": [asdict(n) for n in self.trial_nodes],
            "baseline_nodes": [asdict(n) for n in self.baseline_nodes],
        }


def profile(
    study: optuna.Study,
    trial: str | None = None,
    runs: int = DEFAULT_PROFILE_RUNS,
    say: Callable[[str], None] = tell,
    rounds: int = DEFAULT_PROFILE_ROUNDS,
) -> Profile:
    """Profile ``trial`` (default: the study's decided one) and the baseline, ``runs`` runs each in
    each of ``rounds`` rounds (see the module's docstring)."""
    if runs < 1 or rounds < 1:
        raise UserError("--runs and --rounds must be at least 1")
    summary = study_summary(study)
    if trial is None:
        if summary.decided is None:
            raise UserError(f"study {study.study_name} has no feasible trial yet")
        trial = str(summary.decided.number)
    if not (trial.removeprefix("trial:").isdigit() or trial in ("baseline", "yours")):
        raise UserError(f"profile takes a trial number, baseline or yours, not {trial!r}")
    template = template_from_study(study)
    sides = side(study, template, trial), side(study, template, "baseline")
    folder = writable_folder(study)
    same = sides[0].label == sides[1].label  # the trial is the baseline
    found: list[list[list[NodeTime]]] = [[], []]
    for turn in range(rounds):
        for index in (0, 1) if turn % 2 else (1, 0):
            if same and index == 1:
                continue
            one = sides[index]
            say(f"round {turn + 1} of {rounds}: profiling {one.label} over {runs} runs in a fresh process ...")
            try:
                with Worker(folder.log("profile")) as worker:
                    found[index].append(worker.run(ProfileJob(one.job, runs), PROFILE_TIMEOUT_S))
            except JobFailure as failure:
                raise UserError(f"{one.label} could not be profiled: {failure}") from None
    if same:
        found[1] = found[0]
    kernels = tuple((_kernel_ms(b), _kernel_ms(t)) for b, t in zip(found[1], found[0], strict=True))
    result = Profile(sides[0].label, sides[1].label, median_nodes(found[0]), median_nodes(found[1]), runs, kernels)
    number = sides[0].label.removeprefix("trial ")
    if number.isdigit() and not same:
        result = replace(result, verdict_note=contradiction(summary, int(number), result.speedups))
    atomic_write(folder.profile(number), json.dumps(result.to_dict()))
    return result


def _kernel_ms(nodes: list[NodeTime]) -> float:
    return sum(n.median_ms for n in nodes)


def median_nodes(rounds: list[list[NodeTime]]) -> list[NodeTime]:
    """Each node's median time over the rounds that ran it, slowest first."""
    times: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for nodes in rounds:
        for n in nodes:
            times[n.name, n.op_type, n.provider].append(n.median_ms)
    found = [NodeTime(name, op, provider, median(ms)) for (name, op, provider), ms in times.items()]
    return sorted(found, key=lambda n: -n.median_ms)


def contradiction(summary: StudySummary, number: int, speedups: list[float]) -> str:
    """Where the kernels' speedups of trial ``number`` (every round's) all lie on the other side of
    1.0 than the study's verdict on it, what the study recorded; else empty."""
    trials = summary.trials
    if not speedups or number >= len(trials) or summary.baseline is None or number == summary.baseline.number:
        return ""
    figures = summary.figures(trials[number])
    if figures.speedup is None:
        return ""
    interval = f" [95% CI {figures.ci[0]:.3f}-{figures.ci[1]:.3f}]" if figures.ci is not None else ""
    faster = figures.ci[0] > 1 if figures.ci is not None else figures.speedup > 1
    slower = figures.ci[1] < 1 if figures.ci is not None else figures.speedup < 1
    if not (faster and max(speedups) < 1 or slower and min(speedups) > 1):
        return ""
    return (
        f"the study recorded trial {number} at {figures.speedup:.3f}x the baseline{interval} ({figures.measurement}),"
        f" these rounds put its kernels at {min(speedups):.2f}x to {max(speedups):.2f}x: the profiler times"
        " kernels only, in one process per side and round; the study's figures time the whole latency"
        + (", interleaved in fresh processes, and decide" if figures.ci is not None else "")
    )
