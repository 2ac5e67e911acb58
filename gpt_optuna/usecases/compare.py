"""``gpt-optuna compare A B``: two configurations or models of a study, on its inputs, one verdict.

Each side is a trial of the study (``3``, ``trial:3``), its ``baseline``, the user's own
configuration (``yours``), an exported model with its record beside it (``best.onnx``: run as the
record says), or any ONNX model with the same inputs and outputs (run with the engine's defaults).
Both are evaluated once in a fresh process against the study's reference outputs by its accuracy
criterion, then timed in interleaved rounds in fresh processes by the confirmation's protocol
(:func:`gpt_optuna.remeasure.finalists.interleave`); the verdict is :func:`judge`'s on B's speedup
over A. Nothing is written to the study; the workers' log is kept in the study folder (in a
temporary folder where the study folder is read-only).
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import optuna

from gpt_optuna.core.errors import UserError
from gpt_optuna.core.log import logger, tell
from gpt_optuna.graph import model as model_io
from gpt_optuna.graph.program import onnx_model
from gpt_optuna.graph.transforms import is_transform_knob
from gpt_optuna.protocol.jobs import EvaluateJob
from gpt_optuna.protocol.outcome import Outcome, TrialResult
from gpt_optuna.protocol.process import JobFailure, Worker
from gpt_optuna.protocol.timing import BLOCK, ROUNDS
from gpt_optuna.remeasure.finalists import QUIET_S, WORKER_START_S, ConfirmationFailed, interleave, template_from_study
from gpt_optuna.search.options import DEFAULT_PROCESSES
from gpt_optuna.study.artifacts import kept_engine
from gpt_optuna.study.evidence import Speedup, judge, speedups, widened_by
from gpt_optuna.study.folder import StudyFolder
from gpt_optuna.study.taxonomy import baseline_trial, your_trial

EVALUATE_TIMEOUT_S = 600.0
"""One side's build, accuracy check and first timing, at most."""


@dataclass(frozen=True)
class Side:
    """One side of a comparison: what it is, and the evaluation that runs it."""

    label: str
    job: EvaluateJob


@dataclass(frozen=True)
class Comparison:
    """What ``compare`` found: each side's accuracy and B's speedup over A, with its verdict."""

    a: Side
    b: Side
    accuracy: tuple[TrialResult, TrialResult]
    speedup: Speedup | None
    verdict: str
    stopped: str | None = None

    def lines(self) -> list[str]:
        """The verdict first, then the figures and each side's outputs against the reference."""
        a, b = self.a.label, self.b.label
        if self.speedup is None:
            lines = [f"verdict: not timed: {self.stopped}"]
        else:
            s = self.speedup
            said = {
                "faster": f"B is faster: {s.estimate:.3f}x A",
                "baseline": f"A is faster: B is {s.estimate:.3f}x A",
                "inconclusive": f"inconclusive: B measured {s.estimate:.3f}x A",
                "not_significant": f"no significant difference: B measured {s.estimate:.3f}x A",
                "indicative": f"indicative (one process): B measured {s.estimate:.3f}x A",
            }[self.verdict]
            lines = [
                f"verdict: {said} [95% CI {s.low:.3f}-{s.high:.3f}] ({s.latency_ms:.4g} ms against"
                f" {s.baseline_ms:.4g} ms, {s.processes} fresh processes)"
                + (f"; {_too_noisy(s)}" if self.verdict == "inconclusive" else ""),
                f"A: {a}: {s.baseline_ms:.4g} ms",
                f"B: {b}: {s.latency_ms:.4g} ms",
            ]
            if self.stopped:
                lines.append(f"the timing ended early ({self.stopped}): these figures are what it measured")
        for name, result in zip("AB", self.accuracy, strict=True):
            lines.append(f"{name} outputs: {_accuracy(result)}")
        return lines

    def to_dict(self) -> dict[str, Any]:
        s = self.speedup
        return {
            "a": self.a.label,
            "b": self.b.label,
            "verdict": self.verdict,
            "speedup": None if s is None else s.estimate,
            "speedup_ci95": None if s is None else [s.low, s.high],
            "a_latency_ms": None if s is None else s.baseline_ms,
            "b_latency_ms": None if s is None else s.latency_ms,
            "processes": None if s is None else s.processes,
            "accuracy": [_accuracy_record(r) for r in self.accuracy],
            "stopped": self.stopped,
        }


def _too_noisy(s: Speedup) -> str:
    """What widened an inconclusive comparison's interval (:func:`widened_by`), and what narrows it."""
    spread, noise = (f"+-{100 * (math.exp(v) - 1):.0f}%" for v in (s.between_sd, s.within_sd))
    if widened_by(s.between_sd, s.within_sd) == "rounds":
        return f"its rounds scattered within each process ({noise}, against {spread} between them): more --rounds"
    return f"the processes disagreed ({spread}, against {noise} within each): more --processes, on a quiet host"


def _accuracy(result: TrialResult) -> str:
    if result.verdict is None:
        return f"{result.outcome.value}: {result.detail}"
    metrics = ", ".join(f"{k}={v:.6g}" for k, v in result.verdict.metrics.items())
    return ("meet" if result.verdict.feasible else "miss") + f" the study's criterion ({metrics})"


def _accuracy_record(result: TrialResult) -> dict[str, Any]:
    verdict = result.verdict
    return {
        "outcome": result.outcome.value,
        "feasible": None if verdict is None else verdict.feasible,
        "metrics": {} if verdict is None else dict(verdict.metrics),
        "detail": result.detail,
    }


def side(study: optuna.Study, template: EvaluateJob, text: str) -> Side:
    """What ``text`` names in ``study`` (see the module's docstring), as an evaluation."""
    trials = study.get_trials(deepcopy=False)
    named = text.removeprefix("trial:")
    if named.isdigit():
        number = int(named)
        if number >= len(trials):
            raise UserError(f"study {study.study_name} has no trial {number} (it has {len(trials)})")
        trial = trials[number]
    elif text in ("baseline", "yours"):
        trial = baseline_trial(trials) if text == "baseline" else your_trial(trials)
        if trial is None:
            what = "no baseline" if text == "baseline" else "no configuration of yours (tune --baseline-config)"
            raise UserError(f"study {study.study_name} has {what}")
    else:
        return _model_side(template, Path(text))
    if not trial.params:
        raise UserError(f"trial {trial.number} holds no candidate (it ended before one was chosen)")
    saved, gone = kept_engine(study, trial)
    label = f"trial {trial.number}" + (" (built again: its kept engine is gone)" if gone else "")
    return Side(label, replace(template, candidate=dict(trial.params), saved_engine=saved))


def _model_side(template: EvaluateJob, path: Path) -> Side:
    """A model (ONNX, or a PyTorch program: its ONNX model), run as its export record says where one
    is beside it, else with the defaults."""
    if not path.is_file():
        raise UserError(f"{path}: give a trial number, baseline, yours, or a model file (.onnx, .pt2)")
    info = model_io.load_model_info(onnx_model(path, EVALUATE_TIMEOUT_S))
    if [i.name for i in info.inputs] != [i.name for i in template.model.inputs]:
        raise UserError(f"{path} takes other inputs than the study's model; compare models of one interface")
    record_path = Path(f"{path}.json")
    if record_path.is_file():
        from gpt_optuna.backends.side_file import SideFile

        return Side(f"{path.name} (as its record says)", as_recorded(template, info, SideFile.read(path).params))
    return Side(f"{path.name} (the engine's defaults)", replace(template, model=info, candidate={}))


def as_recorded(template: EvaluateJob, model: model_io.ModelInfo, params: dict[str, Any] | None) -> EvaluateJob:
    """``template`` on an exported ``model`` under its record's ``params``, less the graph
    transforms' knobs (the exported model has its transforms made)."""
    candidate = {k: v for k, v in (params or {}).items() if not is_transform_knob(k)}
    return replace(template, model=model, candidate=candidate)


def writable_folder(study: optuna.Study) -> StudyFolder:
    """The study folder, where files can be made in it; else a new temporary folder, said in one
    line: the logs (and profiles) of a study on a read-only file system are kept there."""
    folder = StudyFolder.of(study)
    try:
        with tempfile.TemporaryFile(dir=folder.root):
            return folder
    except OSError as exc:
        elsewhere = StudyFolder(Path(tempfile.mkdtemp(prefix="gpt-optuna-")))
        why = exc.strerror or type(exc).__name__
        logger(__name__).warning(
            f"warning: cannot write in the study folder {folder.root} ({why}): writing to {elsewhere.root}"
        )
        return elsewhere


def compare(
    study: optuna.Study,
    a: str,
    b: str,
    processes: int = DEFAULT_PROCESSES,
    rounds: int = ROUNDS,
    timeout_s: float | None = None,
    say: Callable[[str], None] = tell,
) -> Comparison:
    """Evaluate ``a`` and ``b`` (see :func:`side`) once each, then time them interleaved."""
    if processes < 1 or rounds < 3:
        raise UserError("--processes must be at least 1, --rounds at least 3")
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    template = template_from_study(study)
    sides = side(study, template, a), side(study, template, b)
    log = writable_folder(study).log("compare")
    results = []
    for name, one in zip("AB", sides, strict=True):
        say(f"{name}: {one.label}: building and checking its outputs ...")
        try:
            with Worker(log) as worker:
                results.append(worker.run(replace(one.job, measure_infeasible=True), EVALUATE_TIMEOUT_S))
        except JobFailure as failure:
            results.append(TrialResult(Outcome.CRASH, str(failure)))
    accuracy = (results[0], results[1])
    if any(r.latency is None for r in results):
        return Comparison(*sides, accuracy, None, "none", "a side could not be run: see its outputs line")
    per_round = 2 * BLOCK * sum(r.latency.median_ms for r in results if r.latency is not None) / 1000
    builds = [r.build_s or 0.0 for r in results]
    expected_s = WORKER_START_S + sum(builds) + rounds * per_round
    quiet_s = QUIET_S + 3 * max(*builds, per_round)
    say(f"timing A and B interleaved in {processes} fresh processes ...")
    try:
        measured = interleave([s.job for s in sides], log, processes, say, expected_s, quiet_s, None, deadline, rounds)
    except ConfirmationFailed as failure:
        return Comparison(*sides, accuracy, None, "none", failure.reason)
    found = speedups(measured.medians, measured.processes)[1]
    return Comparison(*sides, accuracy, found, judge(found.low, found.high, found.processes), measured.stopped)
