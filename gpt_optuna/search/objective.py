"""Trial -> candidate -> worker -> objective value, constraint and user attrs.

Outcomes map onto Optuna in one place: a feasible candidate COMPLETEs with its median latency;
an infeasible one is PRUNED with its error metrics and a positive ``accuracy`` constraint; one
that cannot be made, built or run (a transform or build error: it would fail again) is PRUNED with a
larger ``failure`` constraint, so that the samplers steer away from it as from infeasible ones;
a crash, hang or exception FAILs with its kind and detail. A candidate already evaluated in the
study is not built again: the trial copies the earlier result and names it in ``reused_from``.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import optuna
from optuna.artifacts import FileSystemArtifactStore
from optuna.trial import FrozenTrial, TrialState

from gpt_optuna.core import interrupts
from gpt_optuna.core.errors import UserError
from gpt_optuna.core.space import Candidate, Space
from gpt_optuna.protocol.jobs import EvaluateJob, run_evaluation
from gpt_optuna.protocol.outcome import Outcome, TrialResult
from gpt_optuna.protocol.process import Worker
from gpt_optuna.search.engines import KEPT_ENGINES, EngineKeeper
from gpt_optuna.search.ledger import StudyLedger, key_of
from gpt_optuna.search.sampling import FreshSampler
from gpt_optuna.study import trial_record
from gpt_optuna.study.optuna_internals import shared_trials
from gpt_optuna.study.recovery import PROCESS
from gpt_optuna.study.storage import one_transaction, set_trial_attrs
from gpt_optuna.study.taxonomy import own_results
from gpt_optuna.study.trial_record import PROPOSED_ATTR, TrialRecord

HOST = socket.gethostname()
OWNER = PROCESS
"""Which tuner process runs a trial, so a later run can tell a dead owner's trials apart."""


@dataclass(frozen=True)
class Lane:
    """One evaluation worker: its process, the GPU it is pinned to (``CUDA_VISIBLE_DEVICES``;
    None: the default device) and the name of the device its trials are measured on."""

    index: int
    worker: Worker
    gpu: str | None
    device: str

    @property
    def worker_id(self) -> str:
        return f"{OWNER}/{self.index}"


_MAX_CONSECUTIVE_REUSE = 30
FAILURE_VIOLATION = 1e9
"""The ``failure`` constraint of a candidate that cannot be made or built: worse than any
accuracy violation (those are at most 1e6, for outputs that are not finite)."""


class CandidateFailed(Exception):
    """Raised inside the objective so that Optuna records a FAILED trial, and the study goes on."""


class SearchTimeUp(Exception):
    """Raised inside the objective when a trial ran into the time kept for after the search
    (--timeout): the trial is marked interrupted and queued again, and the search ends."""


class Objective:
    """The function Optuna calls for each trial, with the lane (worker process and device) that
    evaluates it; several lanes may call it at once."""

    def __init__(
        self,
        space: Space,
        job: EvaluateJob,
        trial_timeout_s: float,
        artifacts: FileSystemArtifactStore,
        on_result: Callable[[int, Candidate, TrialResult | None], None] = lambda *_: None,
        objectives: tuple[str, ...] = ("latency",),
        search_left: Callable[[], float | None] = lambda: None,
        note: Callable[[str], None] = lambda _: None,
        sampler: FreshSampler | None = None,
        keep_engines: int | None = KEPT_ENGINES,
    ) -> None:
        self.objectives = objectives
        self.sampler = sampler
        self.ledger = sampler.ledger if sampler is not None else StudyLedger()
        """The study's trials as of this trial's sampling (the sampler's ledger, where there is one)."""
        self.note = note
        """Told where a trial first does one-time work that holds it up (an fp16 sensitivity ranking),
        and how far that work is while it runs."""
        self.search_left = search_left
        """Seconds left for the search under --timeout (None: no bound): a trial may take no longer."""
        self.space = space
        self.job = job
        self.trial_timeout_s = trial_timeout_s
        self.engines = EngineKeeper(artifacts, keep_engines, note)
        """What the artifact store keeps: the baseline's engine and the ``keep_engines`` fastest (None: all)."""
        self.on_result = on_result
        self.consecutive_reuse = 0
        self.interrupted: list[int] = []
        """Trials stopped before their candidate was evaluated: the tuner queues them again."""

    def __call__(self, trial: optuna.Trial, lane: Lane) -> Any:
        with one_transaction(trial) as attrs:
            candidate = self.space.suggest(trial)
            source = self.sampler.sources.get(trial.number) if self.sampler is not None else None
            attrs |= {
                trial_record.OWNER: OWNER,
                trial_record.HOST: HOST,
                trial_record.WORKER: lane.worker_id,
                trial_record.GPU: lane.device,
            }
            attrs |= {PROPOSED_ATTR: source} if source else {}
        self.ledger.update(shared_trials(trial.study))  # the sampler's read of this trial
        earlier = self.ledger.evaluated(key_of(candidate)) or self._await_twin(trial, candidate)
        if earlier is not None:
            return self._reuse(trial, earlier)
        self.consecutive_reuse = 0
        baseline = TrialRecord(trial).baseline
        job = replace(self.job, candidate=candidate, measure_infeasible=baseline)
        ranking = job.ranking_path()
        if ranking is not None and not ranking.is_file():
            trial_record.mark_one_off(trial, "fp16 sensitivity ranking")
            self.note(
                f"trial {trial.number}: ranking the graph's nodes by fp16 sensitivity first (a run of the graph per"
                " node, once per graph; later trials reuse it) ..."
            )
        left = self.search_left()
        timeout = self.trial_timeout_s if left is None else min(self.trial_timeout_s, max(left, 1.0))
        try:
            result = run_evaluation(lane.worker, job, timeout, lambda text: self.note(f"trial {trial.number}: {text}"))
        except (KeyboardInterrupt, UserError) as exc:
            self._stop(trial, interrupts.stopped() if isinstance(exc, KeyboardInterrupt) else f"stopped: {exc}")
            raise
        if result.outcome is Outcome.TIMEOUT and timeout < self.trial_timeout_s:
            self._stop(trial, "stopped: the search's share of --timeout was spent")
            raise SearchTimeUp
        if result.outcome is Outcome.OK and "memory" in self.objectives and result.run.device_memory_bytes is None:
            self._stop(trial, "stopped: no device memory figure")
            raise UserError(
                f"backend {self.job.backend!r} does not report engine device memory; drop memory from --objectives"
            )
        set_trial_attrs(trial, trial_record.result_attrs(result), constraints(result))
        self._keep_engine(trial, result)
        self.on_result(trial.number, candidate, result)
        if result.outcome is Outcome.OK:
            if self.job.dry_run:
                assert result.build_s is not None
                return result.build_s
            return self._values(result)
        if result.outcome is Outcome.INFEASIBLE or result.outcome.is_deterministic:
            raise optuna.TrialPruned(TrialRecord(trial).pruned_because)
        raise CandidateFailed(f"{result.outcome.value}: {result.detail}")

    def _stop(self, trial: optuna.Trial, reason: str) -> None:
        """Mark a trial whose candidate was not evaluated, so that the tuner queues it again."""
        trial_record.mark_interrupted(trial, reason)
        self.interrupted.append(trial.number)

    def _await_twin(self, trial: optuna.Trial, candidate: Candidate) -> FrozenTrial | None:
        """Where an earlier trial of another worker (of another process, which samples apart from
        ours) is evaluating the same candidate, wait for its result instead of evaluating it twice."""
        if not any(t.params == candidate for t in self.ledger.running(before=trial.number)):
            return None
        deadline = time.monotonic() + self.trial_timeout_s
        waited = False
        while time.monotonic() < deadline:
            running = trial.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            if not any(t.number < trial.number and t.params == candidate for t in running):
                # without a wait, the caller has just looked for an earlier result
                return find_evaluated(trial.study, candidate, trial.number) if waited else None
            waited = True
            try:
                interrupts.check()
            except KeyboardInterrupt:
                self._stop(trial, interrupts.stopped())
                raise
            time.sleep(1.0)
        return None

    def _values(self, result: TrialResult) -> Any:
        """Median latency, or (latency, error, memory MiB, build time, ...) in the order of ``objectives``."""
        assert result.latency is not None and result.verdict is not None
        if len(self.objectives) == 1:
            return result.latency.median_ms
        figures = {
            "latency": result.latency.median_ms,
            "error": self.job.criterion.error(result.verdict.metrics),
            "memory": (result.run.device_memory_bytes or 0) / (1 << 20),
            "build_s": result.build_s or 0.0,
        }
        return tuple(figures[name] for name in self.objectives)

    def _keep_engine(self, trial: optuna.Trial, result: TrialResult) -> None:
        """Keep a feasible candidate's engine where it earns a place (:class:`EngineKeeper`); drop any other."""
        if result.engine_path is None:
            return
        try:
            if result.outcome is Outcome.OK:
                value = result.build_s if self.job.dry_run else result.latency.median_ms if result.latency else None
                self.engines.keep(trial, result.engine_path, float("inf") if value is None else value)
        finally:
            result.engine_path.unlink(missing_ok=True)

    def _reuse(self, trial: optuna.Trial, earlier: FrozenTrial) -> Any:
        self.consecutive_reuse += 1
        if self.consecutive_reuse >= _MAX_CONSECUTIVE_REUSE:
            trial.study.stop()  # the sampler keeps proposing what was tried: the space is covered
        trial_record.mark_reused(trial, earlier.number)
        done = TrialRecord(earlier)
        set_trial_attrs(trial, done.result, earlier.constraints)
        self.on_result(trial.number, dict(trial.params), None)
        if earlier.state is TrialState.COMPLETE:
            return earlier.values[0] if len(earlier.values) == 1 else tuple(earlier.values)
        if earlier.state is TrialState.PRUNED:
            raise optuna.TrialPruned(done.pruned_because)
        raise CandidateFailed(f"same candidate failed in trial {earlier.number}: {done.failure}")

    @property
    def space_exhausted(self) -> bool:
        return self.consecutive_reuse >= _MAX_CONSECUTIVE_REUSE


def constraints(result: TrialResult) -> dict[str, float]:
    """What the samplers learn besides the objective: the accuracy constraint (> 0: infeasible),
    or the failure constraint of a candidate that cannot be made or built."""
    if result.outcome.is_deterministic:
        return {"failure": FAILURE_VIOLATION}
    return {"accuracy": result.verdict.constraint} if result.verdict is not None else {}


def find_evaluated(study: optuna.Study, candidate: Candidate, exclude: int) -> FrozenTrial | None:
    """An earlier trial with the same parameters that holds its own result (an interrupted one
    does not: its candidate is evaluated again)."""
    found = (t for t in own_results(study.get_trials(deepcopy=False)) if t.number != exclude and t.params == candidate)
    return next(found, None)
