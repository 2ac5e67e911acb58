"""The jobs the worker process runs: discover a space; build, validate and measure a candidate."""

from __future__ import annotations

import json
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gpt_optuna.backends import Backend, BuildError, Runner, load_backend
from gpt_optuna.backends.base import CANNOT_RUN
from gpt_optuna.core.errors import UserError
from gpt_optuna.core.files import atomic_write
from gpt_optuna.core.space import Candidate, Condition, Space
from gpt_optuna.evaluation.accuracy import Criterion
from gpt_optuna.evaluation.measure import MeasureSettings, measure
from gpt_optuna.evaluation.outcome import MetricFailed, Outcome, TrialResult, build_failure, failure
from gpt_optuna.evaluation.sensitivity import rank_sensitive_nodes
from gpt_optuna.evaluation.worker import JobFailure, Worker, report_progress
from gpt_optuna.graph.feeds import feeds_sha256, load_function, read_npz, unstack
from gpt_optuna.graph.fusion import fused_path, fusion_knobs, fusion_of, graph_ops
from gpt_optuna.graph.interface import check_interface, dtype_changes
from gpt_optuna.graph.model import Feeds, ModelInfo, ShapeRange, load_model_info
from gpt_optuna.graph.model_cache import TransformFailed
from gpt_optuna.graph.precision import QUANTIZED, PrecisionSetting, precision_knobs, transform
from gpt_optuna.study.artifacts import CALIBRATION_FILE, INPUTS_FILE, REFERENCE_FILE
from gpt_optuna.study.folder import StudyFolder
from gpt_optuna.study.trial_record import IO_CHANGE_ATTR, TRANSFORMED_MODEL

PROGRESS_EVERY_S = 5.0
"""How often a long step inside a job (the fp16 sensitivity ranking) tells the tuner how far it is."""


_backends: dict[str, Backend] = {}


_arrays: dict[tuple[Path, float], Feeds] = {}


_infos: dict[tuple[Path, float], ModelInfo] = {}


def _backend(spec: str) -> Backend:
    if spec not in _backends:
        _backends[spec] = load_backend(spec)
    return _backends[spec]


def _npz(path: Path) -> Feeds:
    key = (path, path.stat().st_mtime)
    if key not in _arrays:
        _arrays[key] = read_npz(path)
    return _arrays[key]


def _model_info(path: Path) -> ModelInfo:
    """A transformed model's info (parsed, checked, hashed), read once per file in this worker."""
    key = (path, path.stat().st_mtime)
    if key not in _infos:
        _infos[key] = load_model_info(path)
    return _infos[key]


def gpu_name() -> str:
    """The name of the GPU CUDA numbers 0 here, ``none`` without one."""
    names = gpu_names()
    return names[0] if names else "none"


def gpu_names() -> list[str]:
    """The names of the GPUs this process sees, in CUDA's order; none without CuPy, a driver or a device."""
    try:
        import cupy

        names = [cupy.cuda.runtime.getDeviceProperties(i)["name"] for i in range(cupy.cuda.runtime.getDeviceCount())]
    except Exception:
        return []
    return [name.decode() if isinstance(name, bytes) else str(name) for name in names]


_metrics: dict[str, Callable[..., Any]] = {}


def _metric_function(spec: str) -> Callable[..., Any]:
    if spec not in _metrics:
        _metrics[spec] = load_function(spec, "--metric")
    return _metrics[spec]


@dataclass(frozen=True)
class WarmUpJob:
    """Load the backend's libraries in a new worker process, before its first candidate; returns
    the name of the GPU it sees (``none`` without one)."""

    backend: str

    def __call__(self) -> str:
        _backend(self.backend)
        return gpu_name()


@dataclass(frozen=True)
class SpaceJob:
    """Discover the backend's search space for a model, with the library versions.

    ``cache_dir`` keeps the transformed models made while looking (see :func:`fusion_knobs`).
    """

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

    def __call__(self) -> tuple[Space, dict[str, str], list[str]]:
        """The space, the library versions (and GPU), and a line for each transform left out."""
        import onnx

        backend = _backend(self.backend)
        graph = onnx.load(str(self.model.path), load_external_data=False)
        precision = precision_knobs(graph, backend.precisions(), self.allow_io_change)
        notes: list[str] = []
        fusion = fusion_knobs(
            self.model,
            tuple(f for f in backend.fusions() if self.fusions is None or f in self.fusions),
            self.cache_dir,
            graph_ops(graph),
            notes.append,
            self.fusion_budget_s,
            self.needed_fusions,
        )
        knobs = list(backend.space(self.model, self.shapes).knobs)
        if precision:  # weak-typing flags only where the graph itself stays fp32
            graph_fp32 = Condition("precision", ("fp32",))
            knobs = [replace(k, condition=graph_fp32) if k.name in backend.weak_typing_knobs else k for k in knobs]
        return Space(fusion + precision + knobs), {**backend.versions(), "gpu": gpu_name()}, notes


@dataclass(frozen=True)
class EvaluateJob:
    """Build one candidate, check its outputs against the reference, and time it.

    An infeasible candidate is not timed unless ``measure_infeasible`` (the baseline always is).
    A ``dry_run`` only builds: no device is needed, and the build time stands in for latency.
    An engine file the backend produces is written to ``engines/`` in the study folder, named in
    the result, for the parent to keep as an artifact.
    """

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

    def __call__(self) -> TrialResult:
        start = time.perf_counter()
        result = self._evaluate()
        return replace(result, attrs={**result.attrs, "eval_s": time.perf_counter() - start})

    def _evaluate(self) -> TrialResult:
        backend = _backend(self.backend)
        model = self._made_model()
        if isinstance(model, TrialResult):
            return model
        try:
            built = backend.build(model, self.engine_candidate, self.workdir, self.shapes)
        except BuildError as exc:
            return build_failure(exc)
        if model is not self.model:
            built.attrs[TRANSFORMED_MODEL] = model.path.name
            changes = dtype_changes(self.model, model)
            if changes:
                built.attrs[IO_CHANGE_ATTR] = changes
        engine = self._save_engine(backend.serialize(built))
        if self.dry_run:
            return TrialResult(Outcome.OK, "", build_s=built.build_s, attrs=built.attrs, engine_path=engine)
        references = unstack(_npz(self.reference_path))
        samples = self.samples(model)
        with backend.open(built, samples[0], self.templates(model)) as runner:
            outputs = []
            for index, feeds in enumerate(samples):
                if index:
                    runner.set_inputs(feeds)
                try:
                    outputs.append(runner.infer())
                except Exception as exc:
                    reason = backend.refused_run(exc)
                    if reason is None:
                        raise
                    return failure(Outcome.BUILD_ERROR, f"{CANNOT_RUN}: {reason}", traceback.format_exc())
            try:
                verdict = self.criterion.evaluate(outputs, references, self._user_metric(outputs, references))
            except MetricFailed as exc:
                return failure(Outcome.METRIC_ERROR, str(exc), exc.log)
            verdict = replace(verdict, metrics={**verdict.metrics, "samples": len(samples)})
            latency, timing = None, {}
            if verdict.feasible or self.measure_infeasible:
                if len(samples) > 1:
                    runner.set_inputs(samples[0])  # timed on the first sample, as every candidate is
                started = time.perf_counter()
                latency = measure(runner, self.settings)
                timing = {"measure_s": time.perf_counter() - started}
            attrs = {**built.attrs, **runner.attrs, **timing}
        outcome = Outcome.OK if verdict.feasible else Outcome.INFEASIBLE
        return TrialResult(outcome, verdict.reason, latency, verdict, built.build_s, attrs, engine_path=engine)

    def _user_metric(self, outputs: list[Feeds], references: list[Feeds]) -> Callable[[], dict[str, float]] | None:
        """The user's metric over all samples, its failure a MetricFailed with the traceback."""
        if self.metric is None:
            return None
        spec = self.metric

        def compute() -> dict[str, float]:
            try:
                function = _metric_function(spec)
                return dict(function(outputs, references, unstack(_npz(self.feeds_path))))
            except Exception as exc:
                raise MetricFailed(
                    f"--metric {spec} failed: {type(exc).__name__}: {exc}", traceback.format_exc()
                ) from exc

        return compute

    def check(self, space: Space) -> TrialResult:
        """Make the candidate's graph and have the engine load it, without building or running
        it (see :meth:`Backend.check_model`): OK with the knob limits in ``attrs["limits"]``, or the
        transform or build error."""
        model = self._made_model()
        if isinstance(model, TrialResult):
            return model
        try:
            candidate = self.engine_candidate
            limits = _backend(self.backend).check_model(model, space, candidate, self.workdir, self.shapes)
        except BuildError as exc:
            return build_failure(exc)
        return TrialResult(Outcome.OK, attrs={"limits": limits})

    def _made_model(self) -> ModelInfo | TrialResult:
        """The candidate's graph, or the transform error that making it raised."""
        try:
            return self.transformed_model()
        except UserError:  # a missing library: the user's to fix
            raise
        except Exception as exc:  # a graph the optimizer, an op the converter or quantizer cannot handle
            log = exc.log if isinstance(exc, TransformFailed) else traceback.format_exc()
            detail = str(exc) if isinstance(exc, TransformFailed) else f"{type(exc).__name__}: {exc}"
            return failure(Outcome.TRANSFORM_ERROR, f"{self._transforms()} transform failed: {detail}", log)

    def samples(self, model: ModelInfo) -> list[Feeds]:
        """Every input sample, in the dtypes of the (possibly transformed) model."""
        given = unstack(_npz(self.feeds_path))
        return [
            {spec.name: feeds[spec.name].astype(spec.dtype, copy=False) for spec in model.inputs} for feeds in given
        ]

    def templates(self, model: ModelInfo) -> Feeds:
        """Output templates (the first sample's reference, in the model's output dtypes): they size
        the output buffers."""
        reference = _npz(self.reference_path)
        return {spec.name: reference[spec.name][0].astype(spec.dtype, copy=False) for spec in model.outputs}

    def open_candidate(self) -> Runner:
        """Build the candidate and open it on the first sample, raising on any failure (for
        re-measuring finalists)."""
        backend = _backend(self.backend)
        model = self.transformed_model()
        built = backend.build(model, self.engine_candidate, self.workdir, self.shapes)
        return backend.open(built, self.samples(model)[0], self.templates(model))

    def transformed_model(self) -> ModelInfo:
        """The model the candidate runs: the original, or a cached copy fused and/or in another precision."""
        cache = StudyFolder(self.workdir).models
        fused = fused_path(self.model.path, self.model.sha256, fusion_of(self.candidate), cache)
        base = self.model if fused == self.model.path else _model_info(fused)
        check_interface(self.model, base, dtypes_may_change=False)
        setting = PrecisionSetting.from_candidate(self.candidate)
        if setting.precision == "fp32":
            return base
        ranking_path = self.ranking_path()
        ranking = [] if ranking_path is None else self._ranking(base, ranking_path)
        samples: list[Feeds] = []
        calibration_sha = ""
        if setting.precision in QUANTIZED:
            assert self.calibration_path is not None, "int8/fp8 candidates need calibration data"
            stacked = _npz(self.calibration_path)
            samples = unstack(stacked)
            calibration_sha = feeds_sha256(stacked)
        made = _model_info(transform(base.path, base.sha256, setting, ranking, samples, calibration_sha, cache))
        check_interface(self.model, made, dtypes_may_change=not setting.keep_io)
        return made

    def _transforms(self) -> str:
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

    def _ranking(self, model: ModelInfo, path: Path) -> list[str]:
        """The nodes of ``model`` (the candidate's graph before its precision) by fp16 sensitivity,
        read from ``path``, or computed and kept there."""
        if path.is_file():
            try:
                return list(json.loads(path.read_text())["nodes"])
            except (ValueError, KeyError, TypeError):  # damaged (a partial copy, an edit): ranked again
                path.unlink(missing_ok=True)
        first = unstack(_npz(self.feeds_path))[0], unstack(_npz(self.reference_path))[0]
        started = told = time.monotonic()

        def progress(done: int, total: int) -> None:
            nonlocal told
            now = time.monotonic()
            if done in (0, total) or now - told >= PROGRESS_EVERY_S:
                told = now
                report_progress(f"fp16 sensitivity: {done}/{total} nodes ranked, {now - started:.1f} s")

        nodes = rank_sensitive_nodes(model.path, *first, progress=progress)
        atomic_write(path, json.dumps({"model": model.sha256, "nodes": nodes}))
        return nodes

    def _save_engine(self, data: bytes | None) -> Path | None:
        if data is None:
            return None
        folder = StudyFolder(self.workdir).engines
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{uuid.uuid4().hex}.engine"
        try:
            path.write_bytes(data)
        except BaseException:  # a full disk leaves no partial engine behind
            path.unlink(missing_ok=True)
            raise
        return path


@dataclass(frozen=True)
class CheckJob:
    """Run :meth:`EvaluateJob.check` in the worker (a library that crashes on a graph takes the
    worker with it, not the tuner)."""

    job: EvaluateJob
    space: Space

    def __call__(self) -> TrialResult:
        return self.job.check(self.space)


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
