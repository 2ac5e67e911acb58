"""The jobs the tuner sends its worker processes, as data: each names the worker's function that
runs it (``module:function`` under :mod:`gpt_optuna.worker`), imported only in the process that
runs it, so that the tuner never loads the engines' code nor runs the user's model itself."""

from __future__ import annotations

import importlib
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpt_optuna.core.engine_paths import EnginePaths
from gpt_optuna.core.errors import UserError
from gpt_optuna.core.measure_settings import MeasureSettings
from gpt_optuna.core.space import Candidate, Space
from gpt_optuna.graph.fusion import fusion_of
from gpt_optuna.graph.model import Feeds, ModelInfo, ShapeRange
from gpt_optuna.graph.precision import PrecisionSetting
from gpt_optuna.protocol.accuracy import Criterion
from gpt_optuna.protocol.outcome import Outcome, TrialResult
from gpt_optuna.protocol.process import FailureKind, JobFailure, Worker
from gpt_optuna.protocol.timing import BLOCK, ROUNDS, ROUNDS_BUDGET_S
from gpt_optuna.study.artifacts import CALIBRATION_FILE, INPUTS_FILE, REFERENCE_FILE
from gpt_optuna.study.folder import StudyFolder


class Job:
    """A job: data the worker's function named by ``RUNS`` is called with."""

    RUNS = ""

    def __call__(self) -> Any:
        module, _, function = self.RUNS.partition(":")
        return getattr(importlib.import_module(module), function)(self)


@dataclass(frozen=True)
class WarmUpJob(Job):
    """Load the backend's libraries in a new worker process, before its first candidate; returns
    the name of the GPU it sees (``none`` without one)."""

    RUNS = "gpt_optuna.worker.evaluate:warm_up"
    backend: str


@dataclass(frozen=True)
class SpaceJob(Job):
    """Discover the backend's search space for a model, with the library versions (the space, the
    versions and GPU, and a line for each transform left out).

    ``cache_dir`` keeps the transformed models made while looking (see :func:`fusion_knobs`).
    """

    RUNS = "gpt_optuna.worker.evaluate:discover_space"
    backend: str
    model: ModelInfo
    shapes: dict[str, ShapeRange]
    cache_dir: Path
    allow_io_change: bool = False
    """Offer reduced-precision inputs and outputs (``keep_io_fp32``); the interface stays otherwise."""
    fusion_budget_s: float | None = None
    """Making the fused models stops after this long (see :func:`fusion_knobs`), but for ``needed_fusions``."""
    needed_fusions: frozenset[str] = frozenset()
    """Fusions a configuration the search must run uses: made whatever the time."""
    fusions: tuple[str, ...] | None = None
    """The graph fusions to try (None: every one the backend runs)."""


@dataclass(frozen=True)
class ReferenceJob(Job):
    """The unmodified model run with ONNX Runtime on the CPU in fp32 on each sample: the accuracy
    reference (in a worker, so that a model that crashes ONNX Runtime does not take the tuner down)."""

    RUNS = "gpt_optuna.worker.reference:run_reference"
    model: ModelInfo
    samples: tuple[Feeds, ...]


@dataclass(frozen=True)
class LoaderJob(Job):
    """Call the user's data loader (``module:function`` or ``script.py:function``): the samples it
    yields, each a dict of arrays (in a worker, so that a loader that hangs can be stopped)."""

    RUNS = "gpt_optuna.worker.user_code:load"
    spec: str


@dataclass(frozen=True)
class MetricJob(Job):
    """Call the user's metric function on the outputs, references and inputs of every sample: the
    metrics it returns (in a worker, so that a metric that hangs can be stopped)."""

    RUNS = "gpt_optuna.worker.user_code:metric"
    spec: str
    outputs: list[Feeds]
    references: list[Feeds]
    inputs: list[Feeds]
    named: str = "--metric"
    """What named the function, for its errors (``--metric``, or a check's ``recorded --metric``)."""


@dataclass(frozen=True)
class EvaluateJob(Job):
    """Build one candidate, check its outputs against the reference, and time it.

    An infeasible candidate is not timed unless ``measure_infeasible`` (the baseline always is).
    A ``dry_run`` only builds: no device is needed, and the build time stands in for latency.
    An engine file the backend produces is written to ``engines/`` in the study folder, named in
    the result, for the parent to keep as an artifact.
    """

    RUNS = "gpt_optuna.worker.evaluate:evaluate"
    backend: str
    model: ModelInfo
    candidate: Candidate
    workdir: Path
    shapes: dict[str, ShapeRange]
    feeds_path: Path
    """The samples' inputs stacked on a leading sample axis (the study's ``inputs.npz``)."""
    reference_path: Path
    """Their reference outputs, stacked the same way."""
    criterion: Criterion
    settings: MeasureSettings
    measure_infeasible: bool = False
    dry_run: bool = False
    calibration_path: Path | None = None
    defaults: Candidate = field(default_factory=dict)
    """Every knob's default: a knob inactive in ``candidate`` is at its default for the engine."""
    metric: str | None = None
    """The user's metric function (``module:function``), called on every sample's outputs."""
    saved_engine: Path | None = None
    """The engine the trial built and kept: a re-measurement loads it where the engine can
    (:meth:`Backend.load`) instead of building the candidate again."""

    @classmethod
    def in_study(
        cls,
        workdir: Path,
        backend: str,
        model: ModelInfo,
        shapes: dict[str, ShapeRange],
        criterion: Criterion,
        settings: MeasureSettings,
        defaults: Candidate,
        dry_run: bool = False,
        metric: str | None = None,
    ) -> EvaluateJob:
        """The template job of a study folder, reading the inputs, reference outputs and calibration
        data cached there; the tuner and the finalists' re-measurement fill in ``candidate``."""
        workdir = workdir.resolve()
        calibration = workdir / CALIBRATION_FILE
        return cls(
            backend=backend,
            model=model,
            candidate={},
            workdir=workdir,
            shapes=shapes,
            feeds_path=workdir / INPUTS_FILE,
            reference_path=workdir / REFERENCE_FILE,
            criterion=criterion,
            settings=settings,
            dry_run=dry_run,
            calibration_path=calibration if calibration.is_file() else None,
            defaults=defaults,
            metric=metric,
        )

    @property
    def engine_candidate(self) -> Candidate:
        """The candidate as the engine takes it: every knob set, inactive ones at their defaults."""
        return {**self.defaults, **self.candidate}

    @property
    def engine_paths(self) -> EnginePaths:
        """The files the study's builds share (its model cache, caches), for the engine."""
        return StudyFolder(self.workdir).engine_paths

    @property
    def engine_folder(self) -> Path:
        """Where the worker writes the engine it built, for the tuner to keep."""
        return StudyFolder(self.workdir).engines

    @property
    def transforms(self) -> str:
        """The candidate's graph transforms, e.g. ``transformer+fp16``."""
        steps = [fusion_of(self.candidate), PrecisionSetting.from_candidate(self.candidate).precision]
        return "+".join(s for s in steps if s not in ("none", "fp32"))

    def ranking_path(self) -> Path | None:
        """Where the fp16 sensitivity ranking this candidate needs is kept (None: it needs none): one
        per graph (the model and its fusion), made by the first candidate that needs it, which runs
        the graph once per ranked node."""
        if not PrecisionSetting.from_candidate(self.candidate).keep_nodes:
            return None
        return StudyFolder(self.workdir).sensitivity(fusion_of(self.candidate), self.model.sha256)


@dataclass(frozen=True)
class CheckJob(Job):
    """Make the candidate's graph and have the engine load it, without building or running it (see
    :meth:`Backend.check_model`): OK with the knob limits in its ``limits``, or the transform or
    build error (in the worker: a library that crashes on a graph takes the worker with it, not the
    tuner)."""

    RUNS = "gpt_optuna.worker.evaluate:check"
    job: EvaluateJob
    space: Space


@dataclass(frozen=True)
class RoundTimed:
    """One interleaved round's medians (ms, in the job's candidate order), reported as soon as it
    is timed: the tuner keeps every round a process measured, even where the process is stopped."""

    medians: tuple[float, ...]


@dataclass(frozen=True)
class ConfirmJob(Job):
    """Open every candidate in this process, warm each up, then time them in interleaved rounds
    (until ``rounds_until``, monotonic seconds, where given: three rounds at least), reporting how
    far it is and each round (:class:`RoundTimed`); returns the number of rounds timed. Host
    runners (the CPU's) are timed once the process is idle again, so that one candidate's spinning
    threads do not slow the next."""

    RUNS = "gpt_optuna.worker.confirm:confirm"
    evaluations: tuple[EvaluateJob, ...]
    """Each candidate as an evaluation of its model (one study's template with its candidate, or
    another model's: an exported one beside a changed one)."""
    rounds: int = ROUNDS
    block: int = BLOCK
    budget_s: float = ROUNDS_BUDGET_S
    rounds_until: float | None = None


@dataclass(frozen=True)
class ProfileJob(Job):
    """Profile ``evaluation``'s candidate over ``runs`` runs on the study's first sample: where its
    time goes, operator by operator or layer by layer (:meth:`Backend.layer_times`)."""

    RUNS = "gpt_optuna.worker.profile:profile"
    evaluation: EvaluateJob
    runs: int


@dataclass(frozen=True)
class SelfTestJob(Job):
    """The engine's library versions, the knobs it offers for the small CNN shipped with the package
    (each with the values it would search), and its build and run of the model with the engine's
    defaults."""

    RUNS = "gpt_optuna.worker.self_test:self_test"
    backend: str


def run_evaluation(
    worker: Worker,
    job: Callable[[], TrialResult],
    timeout: float | None,
    on_progress: Callable[[str], None] = lambda _: None,
) -> TrialResult:
    """Run a job in the worker (what it reports on the way goes to ``on_progress``); a crash,
    hang or exception becomes a failed TrialResult."""
    try:
        return worker.run(job, timeout, on_progress)
    except JobFailure as failure:
        return TrialResult(Outcome(failure.kind.value), failure.detail, log=failure.log_tail)


def reference_outputs(model: ModelInfo, samples: list[Feeds]) -> list[Feeds]:
    """The accuracy reference of each sample (:class:`ReferenceJob`), from a worker process of its
    own: a model that crashes ONNX Runtime ends this step with a one-line error that names the
    worker's log (kept), not the tuner."""
    folder = Path(tempfile.mkdtemp(prefix="gpt-optuna-reference-"))
    log = folder / "worker.log"
    keep = False
    try:
        with Worker(log) as worker:
            return list(worker.run(ReferenceJob(model, tuple(samples)), None))
    except JobFailure as failure:
        if failure.kind is not FailureKind.EXCEPTION:  # a crash or a hang: the model's; its log is kept
            keep = True
            raise UserError(
                f"ONNX Runtime cannot run {model.path} on CPU for the reference: {failure}; its log: {log}"
            ) from None
        raise RuntimeError(f"the reference run failed: {failure.detail}") from None  # ours: an internal error
    finally:
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)
