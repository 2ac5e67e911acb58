"""What a worker does for the jobs of a search (:mod:`gpt_optuna.protocol.jobs`): load an engine,
discover its space, make a candidate's graph, build it, check its outputs against the reference,
and time it."""

from __future__ import annotations

import functools
import json
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpt_optuna.backends import Backend, BuildError, Built, Runner, load_backend
from gpt_optuna.backends.base import CANNOT_RUN
from gpt_optuna.core.errors import UserError
from gpt_optuna.core.files import atomic_write
from gpt_optuna.core.space import Condition, Space
from gpt_optuna.graph.feeds import feeds_sha256, load_function, read_npz, unstack
from gpt_optuna.graph.fusion import fused_path, fusion_knobs, fusion_of, graph_ops
from gpt_optuna.graph.interface import check_interface, dtype_changes
from gpt_optuna.graph.model import Feeds, ModelInfo, load_model_info
from gpt_optuna.graph.model_cache import TransformFailed
from gpt_optuna.graph.precision import QUANTIZED, PrecisionSetting, precision_knobs, transform
from gpt_optuna.protocol.jobs import CheckJob, EvaluateJob, SpaceJob, WarmUpJob
from gpt_optuna.protocol.outcome import Outcome, TrialResult
from gpt_optuna.protocol.process import gpu_names, report_progress
from gpt_optuna.worker.failures import MetricFailed, build_failure, failure
from gpt_optuna.worker.measure import measure
from gpt_optuna.worker.sensitivity import rank_sensitive_nodes

PROGRESS_EVERY_S = 5.0
"""How often a long step inside a job (the fp16 sensitivity ranking) tells the tuner how far it is."""


@functools.cache
def backend_of(spec: str) -> Backend:
    """The backend ``spec`` names, loaded once in this worker."""
    return load_backend(spec)


@functools.cache
def _read_once(read: Callable[[Path], Any], path: Path, mtime: float) -> Any:
    """``read(path)``, once per version of the file (``mtime``: its time of change) in this worker."""
    return read(path)


def _npz(path: Path) -> Feeds:
    return _read_once(read_npz, path, path.stat().st_mtime)  # type: ignore[no-any-return]


def _model_info(path: Path) -> ModelInfo:
    """A transformed model's info (parsed, checked, hashed), read once per file in this worker."""
    return _read_once(load_model_info, path, path.stat().st_mtime)  # type: ignore[no-any-return]


def gpu_name() -> str:
    """The name of the GPU CUDA numbers 0 here, ``none`` without one."""
    names = gpu_names()
    return names[0] if names else "none"


@functools.cache
def _metric_function(spec: str) -> Callable[..., Any]:
    return load_function(spec, "--metric")


def warm_up(job: WarmUpJob) -> str:
    """Load the backend's libraries in a new worker process, before its first candidate."""
    backend_of(job.backend)
    return gpu_name()


def discover_space(job: SpaceJob) -> tuple[Space, dict[str, str], list[str]]:
    """The space, the library versions (and GPU), and a line for each transform left out."""
    import onnx

    backend = backend_of(job.backend)
    graph = onnx.load(str(job.model.path), load_external_data=False)
    precision = precision_knobs(graph, backend.precisions(), job.allow_io_change)
    notes: list[str] = []
    fusion = fusion_knobs(
        job.model,
        tuple(f for f in backend.fusions() if job.fusions is None or f in job.fusions),
        job.cache_dir,
        graph_ops(graph),
        notes.append,
        job.fusion_budget_s,
        job.needed_fusions,
    )
    knobs = list(backend.space(job.model, job.shapes).knobs)
    if precision:  # weak-typing flags only where the graph itself stays fp32
        graph_fp32 = Condition("precision", ("fp32",))
        knobs = [replace(k, condition=graph_fp32) if k.name in backend.weak_typing_knobs else k for k in knobs]
    return backend.with_graph_knobs(fusion + precision, knobs), {**backend.versions(), "gpu": gpu_name()}, notes


def evaluate(job: EvaluateJob) -> TrialResult:
    """The candidate built, its outputs checked and (where feasible) timed; the evaluation's time in ``eval_s``."""
    start = time.perf_counter()
    result = _evaluate(job)
    return replace(result, eval_s=time.perf_counter() - start)


def _evaluate(job: EvaluateJob) -> TrialResult:
    backend = backend_of(job.backend)
    model = _made_model(job)
    if isinstance(model, TrialResult):
        return model
    try:
        built = built_or_loaded(backend, model, job)
    except BuildError as exc:
        return build_failure(exc)
    if model is not job.model:
        changes = dtype_changes(job.model, model) or None
        built.facts = replace(built.facts, transformed_model=model.path.name, io_changes=changes)
    engine = _save_engine(job, backend.serialize(built))
    if job.dry_run:
        return TrialResult(Outcome.OK, "", build_s=built.build_s, build=built.facts, engine_path=engine)
    references = unstack(_npz(job.reference_path))
    samples = samples_of(job, model)
    with backend.open(built, samples[0], templates_of(job, model)) as runner:
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
            verdict = job.criterion.evaluate(outputs, references, _user_metric(job, outputs, references))
        except MetricFailed as exc:
            return failure(Outcome.METRIC_ERROR, str(exc), exc.log)
        verdict = replace(verdict, metrics={**verdict.metrics, "samples": len(samples)})
        latency, measure_s = None, None
        if verdict.feasible or job.measure_infeasible:
            if len(samples) > 1:
                runner.set_inputs(samples[0])  # timed on the first sample, as every candidate is
            started = time.perf_counter()
            latency = measure(runner, job.settings)
            measure_s = time.perf_counter() - started
        run = runner.facts
    outcome = Outcome.OK if verdict.feasible else Outcome.INFEASIBLE
    return TrialResult(
        outcome,
        verdict.reason,
        latency,
        verdict,
        built.build_s,
        built.facts,
        run,
        measure_s=measure_s,
        engine_path=engine,
    )


def _user_metric(
    job: EvaluateJob, outputs: list[Feeds], references: list[Feeds]
) -> Callable[[], dict[str, float]] | None:
    """The user's metric over all samples, its failure a MetricFailed with the traceback."""
    if job.metric is None:
        return None
    spec = job.metric

    def compute() -> dict[str, float]:
        try:
            function = _metric_function(spec)
            return dict(function(outputs, references, unstack(_npz(job.feeds_path))))
        except Exception as exc:
            raise MetricFailed(f"--metric {spec} failed: {type(exc).__name__}: {exc}", traceback.format_exc()) from exc

    return compute


def check(job: CheckJob) -> TrialResult:
    """The candidate's graph made and loaded by the engine (see :meth:`Backend.check_model`)."""
    evaluation = job.job
    model = _made_model(evaluation)
    if isinstance(model, TrialResult):
        return model
    try:
        candidate = evaluation.engine_candidate
        backend = backend_of(evaluation.backend)
        limits = backend.check_model(model, job.space, candidate, evaluation.engine_paths, evaluation.shapes)
    except BuildError as exc:
        return build_failure(exc)
    return TrialResult(Outcome.OK, limits=tuple(limits))


def _made_model(job: EvaluateJob) -> ModelInfo | TrialResult:
    """The candidate's graph, or the transform error that making it raised."""
    try:
        return transformed_model(job)
    except UserError:  # a missing library: the user's to fix
        raise
    except Exception as exc:  # a graph the optimizer, an op the converter or quantizer cannot handle
        log = exc.log if isinstance(exc, TransformFailed) else traceback.format_exc()
        detail = str(exc) if isinstance(exc, TransformFailed) else f"{type(exc).__name__}: {exc}"
        return failure(Outcome.TRANSFORM_ERROR, f"{job.transforms} transform failed: {detail}", log)


def samples_of(job: EvaluateJob, model: ModelInfo) -> list[Feeds]:
    """Every input sample, in the dtypes of the (possibly transformed) model."""
    given = unstack(_npz(job.feeds_path))
    return [{spec.name: feeds[spec.name].astype(spec.dtype, copy=False) for spec in model.inputs} for feeds in given]


def templates_of(job: EvaluateJob, model: ModelInfo) -> Feeds:
    """Output templates (the first sample's reference, in the model's output dtypes): they size
    the output buffers."""
    reference = _npz(job.reference_path)
    return {spec.name: reference[spec.name][0].astype(spec.dtype, copy=False) for spec in model.outputs}


def open_candidate(job: EvaluateJob) -> Runner:
    """Load the candidate's kept engine (where the job names one the engine can load), else build
    the candidate, and open it on the first sample, raising on any failure (for re-measuring
    finalists)."""
    backend = backend_of(job.backend)
    model = transformed_model(job)
    built = built_or_loaded(backend, model, job)
    return backend.open(built, samples_of(job, model)[0], templates_of(job, model))


def built_or_loaded(backend: Backend, model: ModelInfo, job: EvaluateJob) -> Built:
    """The job's kept engine, loaded where it names one the engine can load, else the candidate built."""
    if job.saved_engine is not None:
        loaded = backend.load(model, job.engine_candidate, job.saved_engine.read_bytes())
        if loaded is not None:
            return loaded
    return backend.build(model, job.engine_candidate, job.engine_paths, job.shapes)


def transformed_model(job: EvaluateJob) -> ModelInfo:
    """The model the candidate runs: the original, or a cached copy fused and/or in another precision."""
    cache = job.engine_paths.models
    fused = fused_path(job.model.path, job.model.sha256, fusion_of(job.candidate), cache)
    base = job.model if fused == job.model.path else _model_info(fused)
    check_interface(job.model, base, dtypes_may_change=False)
    setting = PrecisionSetting.from_candidate(job.candidate)
    if setting.precision == "fp32":
        return base
    ranking_path = job.ranking_path()
    ranking = [] if ranking_path is None else _ranking(job, base, ranking_path)
    samples: list[Feeds] = []
    calibration_sha = ""
    if setting.precision in QUANTIZED:
        assert job.calibration_path is not None, "int8/fp8 candidates need calibration data"
        stacked = _npz(job.calibration_path)
        samples = unstack(stacked)
        calibration_sha = feeds_sha256(stacked)
    made = _model_info(transform(base.path, base.sha256, setting, ranking, samples, calibration_sha, cache))
    check_interface(job.model, made, dtypes_may_change=not setting.keep_io)
    return made


def _ranking(job: EvaluateJob, model: ModelInfo, path: Path) -> list[str]:
    """The nodes of ``model`` (the candidate's graph before its precision) by fp16 sensitivity,
    read from ``path``, or computed and kept there."""
    if path.is_file():
        try:
            return list(json.loads(path.read_text())["nodes"])
        except (ValueError, KeyError, TypeError):  # damaged (a partial copy, an edit): ranked again
            path.unlink(missing_ok=True)
    first = unstack(_npz(job.feeds_path))[0], unstack(_npz(job.reference_path))[0]
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


def _save_engine(job: EvaluateJob, data: bytes | None) -> Path | None:
    if data is None:
        return None
    folder = job.engine_folder
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{uuid.uuid4().hex}.engine"
    try:
        path.write_bytes(data)
    except BaseException:  # a full disk leaves no partial engine behind
        path.unlink(missing_ok=True)
        raise
    return path
