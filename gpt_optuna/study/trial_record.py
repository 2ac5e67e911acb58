"""What a trial records about itself: the names of its attrs, and :class:`TrialRecord`, the one
place that reads them (the tuner writes them by these names; Optuna's own queue marks included)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Protocol

from gpt_optuna.core.engine_facts import BuildFacts, RunFacts

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

BASELINE = "baseline"
"""The engine's default configuration: queued first in every study."""
SEEDED = "seeded"
"""Why a candidate was queued before the sampler's (your configuration, every speed feature on, ...)."""
WARM_START_ATTR = "warm_start_from"
"""The earlier trial (``STUDY:TRIAL``) a warm-start candidate came from."""
YOURS_ATTR = "your_configuration"
"""On the trial of the user's own configuration (``--baseline-config``): the file it was read from."""
PROPOSED_ATTR = "proposed_by"
"""Where the sampler's candidate came from (its wrapped sampler, a neighbour, the nearest untried
candidate, a random one, or a repeat in a covered space)."""
ENGINE_DEFAULTS_ATTR = "engine_defaults"
"""On the trial of an engine's defaults in a study of several engines (not the baseline's engine):
that engine's name."""
WHY_TRIED = (BASELINE, SEEDED, WARM_START_ATTR, YOURS_ATTR, ENGINE_DEFAULTS_ATTR, PROPOSED_ATTR)
"""The attrs that say why a candidate was tried: a retry keeps them."""

OWNER = "owner"
"""The tuner process (``host:pid``) that runs the trial."""
HOST = "host"
WORKER = "worker"
GPU = "gpu"
"""The name of the device the trial was measured on (``cpu`` on the CPU)."""

OUTCOME = "outcome"
"""The evaluation's outcome (:class:`gpt_optuna.protocol.outcome.Outcome`'s value)."""
LATENCY = "latency"
"""The latency protocol's figures (median, interval, stability), measured even where infeasible."""
ACCURACY = "accuracy"
"""The accuracy metrics against the reference outputs."""
BUILD_S = "build_s"
REBUILD_S = "rebuild_s"
"""What a confirmation process pays for the trial's engine instead of its build: a build again
from the caches the first one left (Inductor, where the first took long), or loading the kept
plan (TensorRT)."""
INFEASIBLE = "infeasible"
"""Why the candidate missed the accuracy criterion."""
FAILURE = "failure"
"""Why the candidate could not be made, built or run."""
LOG = "log"
"""The end of a failed evaluation's log."""
IO_CHANGE_ATTR = "io_dtypes"
"""The dtypes the trial's model changed at its inputs and outputs, where it changed any (only in a
study that allowed it)."""
TRANSFORMED_MODEL = "transformed_model"
"""The file name of the candidate's transformed model in the study folder's model cache."""
ENGINE_IO = "engine_io"
"""The dtypes the engine itself was built to take and return."""
ENGINE_BYTES = "engine_bytes"
ENGINE_SHA256 = "engine_sha256"
BUILD_ROUTE = "build_route"
BUILD_LOG = "build_log"
DEVICE_MEMORY = "device_memory_bytes"
CUDA_GRAPH = "cuda_graph"
"""Why the engine ran without the CUDA graph it was asked for."""
EVAL_S = "eval_s"
"""The whole evaluation's time in the worker."""
MEASURE_S = "measure_s"
ENGINE_ARTIFACT = "engine_artifact"
"""The artifact id of the kept engine."""
ENGINE_DROPPED = "engine_dropped"
"""Why the trial's engine was not kept."""

REUSED_FROM = "reused_from"
"""The earlier trial of the same candidate whose result this one copies."""
INTERRUPTED = "interrupted"
"""Why the trial was stopped before its candidate's result: it is queued again."""
INTERRUPTED_BY = "interrupted_by"
"""The process that failed an interrupted trial (and queues its retry)."""
ONE_OFF = "one_off"
"""One-time work the trial did for later trials too (an fp16 sensitivity ranking): its time says
nothing of what a trial costs."""

REUSED_ATTRS = (
    OUTCOME,
    FAILURE,
    INFEASIBLE,
    ACCURACY,
    BUILD_S,
    REBUILD_S,
    LATENCY,
    ENGINE_ARTIFACT,
    TRANSFORMED_MODEL,
    IO_CHANGE_ATTR,
    ENGINE_IO,
    LOG,
)
"""The result a trial of an already evaluated candidate copies from the earlier one."""

FIXED_PARAMS = "fixed_params"
"""Optuna's system attr of an enqueued trial: its candidate."""
RETRY_HISTORY = "retry_history"
"""Optuna's system attr of a retry: the trials it retries, oldest first."""
FAILED_TRIAL = "failed_trial"
"""Optuna's system attr of a retry: the first trial of its candidate that was interrupted."""
QUEUED_MARKS = frozenset({FIXED_PARAMS, RETRY_HISTORY})
"""The system attrs of a trial that came from the queue (enqueued, or a retry)."""


LOG_CHARS = 20000
"""The end of a failed candidate's worker log a trial keeps."""


class _Outcome(Protocol):
    """How an evaluation ended (:class:`gpt_optuna.protocol.outcome.Outcome`, a ``StrEnum``)."""

    value: str

    @property
    def is_failure(self) -> bool: ...

    @property
    def is_infeasible(self) -> bool: ...


class _Evaluation(Protocol):
    """What a trial records of its evaluation (:class:`gpt_optuna.protocol.outcome.TrialResult`)."""

    outcome: _Outcome
    detail: str
    latency: Any
    verdict: Any
    build_s: float | None
    build: BuildFacts
    run: RunFacts
    eval_s: float | None
    measure_s: float | None
    log: str


def result_attrs(result: _Evaluation) -> dict[str, Any]:
    """The attrs a trial records of its evaluation: its outcome, timings, latency statistics,
    accuracy metrics, why it failed, and its engine's facts."""
    attrs: dict[str, Any] = {OUTCOME: result.outcome.value, **facts_attrs(result.build, result.run)}
    timed = {EVAL_S: result.eval_s, MEASURE_S: result.measure_s, BUILD_S: result.build_s}
    attrs |= {name: seconds for name, seconds in timed.items() if seconds is not None}
    if result.latency is not None:
        attrs[LATENCY] = asdict(result.latency)
    if result.verdict is not None:
        attrs[ACCURACY] = result.verdict.metrics
    if result.outcome.is_infeasible:
        attrs[INFEASIBLE] = result.detail
    elif result.outcome.is_failure:
        attrs[FAILURE] = result.detail
        if result.log:
            attrs[LOG] = result.log[-LOG_CHARS:]
    return attrs


def facts_attrs(build: BuildFacts, run: RunFacts) -> dict[str, Any]:
    """The attrs a trial records of its engine: each fact its build and run learnt, by its name."""
    named = {
        ENGINE_BYTES: build.engine_bytes,
        ENGINE_SHA256: build.engine_sha256,
        ENGINE_IO: build.engine_io,
        BUILD_ROUTE: build.build_route,
        BUILD_LOG: build.build_log,
        TRANSFORMED_MODEL: build.transformed_model,
        IO_CHANGE_ATTR: build.io_changes,
        DEVICE_MEMORY: run.device_memory_bytes,
        CUDA_GRAPH: run.cuda_graph,
        REBUILD_S: run.rebuild_s if run.rebuild_s is not None else build.rebuild_s,
    }
    return {name: value for name, value in named.items() if value is not None}


def mark_interrupted(trial: optuna.Trial, reason: str) -> None:
    """The trial's candidate was not evaluated (``reason``): the tuner queues it again."""
    trial.set_user_attr(INTERRUPTED, reason)


def mark_reused(trial: optuna.Trial, earlier: int) -> None:
    """The trial copies the result of trial ``earlier``, which evaluated the same candidate."""
    trial.set_user_attr(REUSED_FROM, earlier)


def mark_one_off(trial: optuna.Trial, work: str) -> None:
    """The trial does one-time work (``work``) that holds it up."""
    trial.set_user_attr(ONE_OFF, work)


def mark_engine_kept(trial: optuna.Trial, artifact: str) -> None:
    """The trial's engine is kept in the artifact store as ``artifact``."""
    trial.set_user_attr(ENGINE_ARTIFACT, artifact)


def mark_engine_dropped(trial: optuna.Trial, why: str) -> None:
    """The trial's engine was not kept, and why."""
    trial.set_user_attr(ENGINE_DROPPED, why)


def source_study(source: str) -> str:
    """The earlier study of a warm-start source (``STUDY:TRIAL``)."""
    return source.rpartition(":")[0]


def _read(name: str, kind: Callable[[Any], Any] = str, doc: str | None = None) -> Any:
    """A :class:`TrialRecord` property: attr ``name`` as ``kind`` (None where the trial has none)."""

    def read(self: TrialRecord) -> Any:
        value = self._attrs.get(name)
        return None if value is None else kind(value)

    return property(read, doc=doc)


def _marked(name: str, doc: str | None = None) -> Any:
    """A :class:`TrialRecord` property: whether the trial holds attr ``name``."""
    return property(lambda self: name in self._attrs, doc=doc)


class TrialRecord:
    """What one trial recorded (an Optuna ``Trial`` or ``FrozenTrial``): each attr by its meaning,
    and what an absent one means. A view, made per read: it holds the attrs as they were read.
    Optuna's queue marks (:attr:`queue_attrs` and what reads them) are a ``FrozenTrial``'s only."""

    __slots__ = ("_attrs", "_trial", "number")

    def __init__(self, trial: optuna.Trial | FrozenTrial) -> None:
        self._trial = trial
        self._attrs: Mapping[str, Any] = trial.user_attrs
        self.number = trial.number

    @property
    def baseline(self) -> bool:
        return bool(self._attrs.get(BASELINE))

    @property
    def seeded(self) -> str | None:
        """Why it was queued before the sampler's candidates; None where it was not."""
        value = self._attrs.get(SEEDED)
        return str(value) if value else None

    warm_start_from = _read(WARM_START_ATTR)
    your_configuration = _read(
        YOURS_ATTR, doc="The file of the user's own configuration, on its trial; None elsewhere."
    )
    engine_defaults = _read(
        ENGINE_DEFAULTS_ATTR,
        doc="The engine whose defaults the trial is, in a study of several engines; None elsewhere.",
    )
    proposed_by = _read(
        PROPOSED_ATTR,
        doc="Where the sampler's candidate came from (``sampler``, ``screen``, ...); None for a queued one.",
    )
    is_yours = _marked(YOURS_ATTR)
    owner = _read(OWNER)
    host = _read(HOST)
    gpu = _read(GPU, doc="The device it was measured on (``cpu``); None before it ran.")
    outcome = _read(OUTCOME, doc="Its evaluation's outcome; None before one was recorded (an interrupted trial).")

    @property
    def latency(self) -> dict[str, Any] | None:
        """The latency protocol's figures; None where none was measured."""
        return self._attrs.get(LATENCY) or None

    @property
    def latency_ms(self) -> float | None:
        """The measured median latency (measured even where it was infeasible)."""
        latency = self.latency
        return float(latency["median_ms"]) if latency else None

    @property
    def latency_stable(self) -> bool:
        """The latency met its precision target (true where none was measured)."""
        return bool((self.latency or {}).get("stable", True))

    @property
    def latency_rel_ci(self) -> float:
        """The latency median's 95 % half-width as a fraction of it."""
        return float((self.latency or {}).get("rel_ci", 0.0))

    @property
    def accuracy(self) -> dict[str, float] | None:
        return self._attrs.get(ACCURACY)

    build_s = _read(BUILD_S, float)

    @property
    def fresh_build_s(self) -> float | None:
        """What building it in another process costs: the rebuild from the caches where one was
        timed, else the build."""
        value = self._attrs.get(REBUILD_S)
        return self.build_s if value is None else float(value)

    infeasible = _read(INFEASIBLE)
    failure = _read(FAILURE)
    failed = _marked(FAILURE, "It recorded a failure: the candidate could not be made, built or run.")
    interrupted = _read(INTERRUPTED)
    marked_interrupted = _marked(
        INTERRUPTED, "It carries the mark of an interruption (a kill can land before it is written)."
    )
    interrupted_by = _read(INTERRUPTED_BY)
    reused_from = _read(REUSED_FROM, int)
    reused = _marked(REUSED_FROM)
    one_off = _marked(ONE_OFF, "The trial did one-time work (:data:`ONE_OFF`).")

    @property
    def io_changes(self) -> dict[str, dict[str, list[str]]]:
        return dict(self._attrs.get(IO_CHANGE_ATTR) or {})

    @property
    def engine_io(self) -> dict[str, Any] | None:
        return self._attrs.get(ENGINE_IO)

    transformed_model = _read(TRANSFORMED_MODEL)
    engine_artifact = _read(ENGINE_ARTIFACT)
    engine_dropped = _read(ENGINE_DROPPED)

    @property
    def why_tried(self) -> dict[str, Any]:
        """The attrs that say why it was tried (:data:`WHY_TRIED`): what a retry keeps."""
        return {k: v for k, v in self._attrs.items() if k in WHY_TRIED}

    @property
    def as_queued(self) -> dict[str, Any]:
        """Every attr but the mark of its interruption: a queued trial given up before it ran, as it was queued."""
        return {k: v for k, v in self._attrs.items() if k != INTERRUPTED}

    @property
    def result(self) -> dict[str, Any]:
        """Its candidate's result (:data:`REUSED_ATTRS`): what a later trial of the same candidate copies."""
        return {k: v for k, v in self._attrs.items() if k in REUSED_ATTRS}

    @property
    def pruned_because(self) -> str:
        """Why it was pruned: its failure with the outcome, or its accuracy verdict."""
        if self.failed:
            return f"{self.outcome or 'failed'}: {self.failure}"
        return self.infeasible or "infeasible"

    @property
    def queue_attrs(self) -> Mapping[str, Any]:
        """Optuna's system attrs of a ``FrozenTrial`` (its queue marks), read where asked for."""
        return self._trial.system_attrs  # type: ignore[attr-defined]

    @property
    def fixed_params(self) -> dict[str, Any]:
        """The candidate it was queued with (empty for a sampled trial)."""
        return dict(self.queue_attrs.get(FIXED_PARAMS) or {})

    @property
    def candidate(self) -> dict[str, Any]:
        """Its candidate: its params, or (queued and not yet run) the ones it was queued with."""
        return dict(self._trial.params) or self.fixed_params

    @property
    def retry_history(self) -> list[int]:
        """The trials this one retries, oldest first (empty for a first try)."""
        return [int(n) for n in self.queue_attrs.get(RETRY_HISTORY) or ()]

    @property
    def failed_trial(self) -> int:
        """The first interrupted trial of its candidate (its own number for a first try)."""
        return int(self.queue_attrs.get(FAILED_TRIAL, self.number))

    @property
    def enqueued(self) -> bool:
        """It was queued with its candidate (its params are fixed, not sampled)."""
        return FIXED_PARAMS in self.queue_attrs

    @property
    def queued(self) -> bool:
        """It came from the queue: enqueued, or a retry."""
        return bool(self.queue_attrs.keys() & QUEUED_MARKS)
