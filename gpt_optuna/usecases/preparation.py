"""Before a search: the model, inputs and reference outputs, the space the engine offers, the fingerprint."""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import optuna

from gpt_optuna.backends import describe
from gpt_optuna.core.errors import UserError
from gpt_optuna.core.files import atomic_write
from gpt_optuna.core.measure_settings import MeasureSettings
from gpt_optuna.core.space import Space, Value
from gpt_optuna.graph import feeds as feeds_io
from gpt_optuna.graph import model as model_io
from gpt_optuna.graph.fusion import FUSION_KNOB
from gpt_optuna.graph.model_cache import with_distinct_dims
from gpt_optuna.graph.model_copy import external_data_sha256
from gpt_optuna.graph.model_profile import ModelProfile, profile_of
from gpt_optuna.graph.precision import QUANTIZED
from gpt_optuna.graph.program import onnx_model
from gpt_optuna.protocol.jobs import EvaluateJob, LoaderJob, MetricJob, SpaceJob, reference_outputs
from gpt_optuna.protocol.process import FailureKind, JobFailure, Worker
from gpt_optuna.search.config import DEFAULT_TRIAL_TIMEOUT_S, DataSource, StudyKind, TuneConfig
from gpt_optuna.search.space_check import PRECISION, check_space
from gpt_optuna.search.your_configuration import holding_yours
from gpt_optuna.study.artifacts import CALIBRATION_FILE, INPUTS_FILE, REFERENCE_FILE
from gpt_optuna.study.folder import StudyFolder
from gpt_optuna.study.resume import recorded_fingerprint, refuse_if_different

SPACE_TIMEOUT_S = 300.0
SLOW_STEP_S = 3.0
"""A step of the preparation still going after this long says what it does."""

T = TypeVar("T")


@dataclass(frozen=True)
class UserCode:
    """How the tuner calls the user's functions (data loaders, the metric on the reference outputs):
    each in a worker process of its own, stopped at ``deadline`` (monotonic seconds: the end of
    ``deadline_flag``) or, without one, after ``timeout_s`` (--trial-timeout); a call still
    running after :data:`SLOW_STEP_S` says so to ``say``. A hang, a crash or an exception ends in
    one line that names the function."""

    deadline: float | None
    say: Callable[[str], None]
    deadline_flag: str = "--timeout"
    timeout_s: float = DEFAULT_TRIAL_TIMEOUT_S

    def loader(self, flag: str) -> Callable[[str], list[model_io.Feeds]]:
        """The data loader ``flag`` names (``--inputs``, ``--calibration``), as :func:`load_samples` calls it."""
        return lambda spec: self.call(LoaderJob(spec), f"the {flag} data loader {spec}")

    def metric(self, job: MetricJob) -> dict[str, Any]:
        """The metrics the job's function returns."""
        return self.call(job, f"the {job.named} function {job.spec}")

    def call(self, job: Callable[[], T], what: str) -> T:
        """What ``job`` returns; ``what``: the function it calls, for the errors. A crash keeps the
        worker's log (with the traceback where the process died) and names it."""
        if self.deadline is None:
            timeout_s, bound = self.timeout_s, "--trial-timeout"
        else:  # a second at least: the function is called, even where the time is spent
            timeout_s, bound = max(self.deadline - time.monotonic(), 1.0), f"what was left of {self.deadline_flag}"
        folder = Path(tempfile.mkdtemp(prefix="gpt-optuna-user-code-"))
        log = folder / "worker.log"
        slow = threading.Timer(SLOW_STEP_S, self.say, [f"waiting for {what} (stopped after {timeout_s:.0f} s) ..."])
        slow.start()
        kept = False
        try:
            with Worker(log) as worker:
                return worker.run(job, timeout_s)
        except JobFailure as failure:
            if failure.kind is FailureKind.TIMEOUT:
                raise UserError(f"{what} did not return within {timeout_s:.0f} s ({bound}): it was stopped") from None
            kept = failure.kind is FailureKind.CRASH
            how = f"crashed its process ({failure.detail}); its log: {log}" if kept else f"failed: {failure.detail}"
            raise UserError(f"{what} {how}") from None
        finally:
            slow.cancel()
            if not kept:
                shutil.rmtree(folder, ignore_errors=True)


@dataclass(frozen=True)
class Inputs:
    """The user's model and data (one sample or many), checked and in memory, with the fp32
    reference outputs of each sample: nothing written anywhere yet."""

    info: model_io.ModelInfo
    shapes: dict[str, model_io.ShapeRange]
    samples: list[model_io.Feeds]
    references: list[model_io.Feeds]
    user_code: UserCode
    """How the user's functions are called (a --calibration data loader is, later)."""

    @functools.cached_property
    def inputs_sha256(self) -> str:
        return feeds_io.samples_sha256(self.samples)


def shapes_record(shapes: dict[str, model_io.ShapeRange]) -> dict[str, list[list[int]]]:
    """Each input's shape range as the study records it: its min, opt and max as lists."""
    return {name: [list(r.min), list(r.opt), list(r.max)] for name, r in shapes.items()}


@dataclass(frozen=True)
class Prepared:
    """The model the candidates run (a working copy where its dimensions needed names) and the
    discovered, checked search space; the study folder caches inputs, reference and calibration."""

    inputs: Inputs
    working: model_io.ModelInfo
    space: Space
    versions: dict[str, str]
    profile: ModelProfile
    """What the model is made of (recorded, for warm starts of later studies)."""
    calibration_sha256: str = ""


def load_inputs(
    config: DataSource, notes: list[str], say: Callable[[str], None], started: float | None = None
) -> Inputs:
    """The checked model, every input's shape range, the input data (given or generated) and the
    fp32 reference outputs; warnings go to ``notes``. Reads only. The user's data loader and
    metric run as :class:`UserCode` says, until the end of --timeout counted from ``started``
    (monotonic seconds; default: now)."""
    started = time.monotonic() if started is None else started
    deadline = None if config.timeout_s is None else started + config.timeout_s
    user_code = UserCode(deadline, say, timeout_s=config.trial_timeout_s)
    info = model_io.load_model_info(onnx_model(config.model, config.trial_timeout_s))
    feeds_io.check_numeric_inputs(info)
    shapes = model_io.parse_shapes(config.shapes)
    if config.inputs is not None:
        samples = feeds_io.load_samples(config.inputs, info, shapes, config.samples, load=user_code.loader("--inputs"))
        shapes = {n: shapes.get(n, model_io.ShapeRange.fixed(tuple(a.shape))) for n, a in samples[0].items()}
    else:
        shapes = model_io.resolve_shapes(info, shapes)
        samples = [feeds_io.synthetic_feeds(info, shapes)]
        notes.append(
            "warning: no --inputs: accuracy is judged on one batch of generated N(0, 1) data, which says little"
            " about real inputs; give real samples with --inputs (an .npz, a folder of them, or module:function)"
        )
    references = reference_outputs(info, samples)
    feeds_io.check_reference(references, generated=config.inputs is None, notes=notes)
    config.criterion.check_applicable(references[0])
    if config.metric is not None:
        returned = user_code.metric(MetricJob(config.metric, references, references, samples))
        config.criterion.check_user_metrics(returned)
    return Inputs(info, shapes, samples, references, user_code)


PREPARATION_SHARE = 0.25
"""Of ``--timeout``, counted from the run's start (reading the model and its reference outputs
count towards it), the time by which making the graph transforms (a third of it at most for the
fused models) and checking the space end, so that the search gets its trials; what the
configurations the search must run (``--baseline-config``, a check's record) need is made and
checked whatever the time."""


def discover_space(
    config: TuneConfig,
    worker: Worker,
    inputs: Inputs,
    working: model_io.ModelInfo,
    workdir: Path,
    notes: list[str],
    say: Callable[[str], None],
    recorded: list[dict[str, Any]] | None = None,
    started: float | None = None,
) -> tuple[Space, dict[str, str], str]:
    """The backend's search space (found in the worker process) with the ``[space]`` overrides,
    each graph transform it offers made and loaded once (:func:`check_space`); the space, the
    library versions and the calibration data's hash (empty without int8/fp8). Transformed
    models and the calibration data are kept in ``workdir``; what was dropped goes to ``notes``.
    A resumed study's space (``recorded``) keeps the graph fusions and precisions it was made with,
    made and checked whatever the time (so that the resume finds the space the study has). The
    preparation's share of ``--timeout`` counts from ``started`` (the run's start, monotonic
    seconds; default: now)."""
    held = [values for values, _ in config.seeds] + [config.baseline_values or {}]
    always = {(v.get(FUSION_KNOB, "none"), v.get(PRECISION, "fp32")) for v in held if v}
    graphs = {k["name"]: tuple(k["choices"]) for k in recorded or () if k["name"] in (FUSION_KNOB, PRECISION)}
    share_s = None if config.timeout_s is None or recorded is not None else PREPARATION_SHARE * config.timeout_s
    since = time.monotonic() if started is None else started
    deadline = None if share_s is None else since + share_s
    slow = threading.Timer(
        SLOW_STEP_S, say, ["finding the search space (a transformer's fusion takes a while on a large graph) ..."]
    )
    slow.start()
    try:
        fusion_budget_s = None if share_s is None else max(0.0, min(share_s / 3, since + share_s - time.monotonic()))
        needed = frozenset(str(fusion) for fusion, _ in always)
        job = SpaceJob(
            config.backend,
            working,
            inputs.shapes,
            StudyFolder(workdir).models,
            config.allow_io_change,
            fusion_budget_s,
            needed,
            _fusions_to_make(recorded, graphs.get(FUSION_KNOB)),
        )
        space, versions, left_out = worker.run(job, SPACE_TIMEOUT_S)
    except JobFailure as failure:
        raise UserError(f"backend {config.backend!r} could not describe its search space: {failure}") from None
    finally:
        slow.cancel()
    notes += left_out
    space = space.with_overrides(config.space)
    if config.baseline_values is not None:
        assert config.baseline_config is not None
        where = f"--baseline-config {config.baseline_config.name}"
        space = holding_yours(space, config.baseline_values, describe(config.backend), where)
    calibration_sha256 = ""
    if set(space.choices("precision")) & set(QUANTIZED):
        samples = calibration_samples(config.data, inputs, notes)
        calibration_sha256 = feeds_io.feeds_sha256(samples)
        feeds_io.cache_npz(workdir / CALIBRATION_FILE, samples, calibration_sha256)
    for knob, choices in graphs.items():  # after the calibration data, which the study recorded as it was
        if set(space.choices(knob)) > set(choices):
            space = space.restricted(knob, choices)
    template = study_job(config.kind, config.measure, workdir, working, inputs.shapes, space)
    space = remembered_check(
        space,
        template,
        worker,
        notes,
        say,
        versions=versions,
        calibration_sha256=calibration_sha256,
        trial_timeout_s=config.trial_timeout_s,
        beside=StudyFolder(config.workdir),
        deadline=deadline,
        always=always,
    )
    return space, versions, calibration_sha256


def study_job(
    kind: StudyKind,
    measure: MeasureSettings,
    workdir: Path,
    working: model_io.ModelInfo,
    shapes: dict[str, model_io.ShapeRange],
    space: Space,
) -> EvaluateJob:
    """The template evaluation of a study of ``kind`` in the study folder ``workdir``
    (:meth:`EvaluateJob.in_study`): the ``working`` model, measured by ``measure``, with ``space``'s
    defaults."""
    return EvaluateJob.in_study(
        workdir, kind.backend, working, shapes, kind.criterion, measure, space.defaults(), kind.dry_run, kind.metric
    )


def _fusions_to_make(
    recorded: list[dict[str, Any]] | None, fusions: tuple[Value, ...] | None
) -> tuple[str, ...] | None:
    """The graph fusions to make: every one for a new study (None); for a resumed one those it has,
    or every one where it has the knob at ``none`` alone (the knob, then cut to that, is its space)."""
    if recorded is None:
        return None
    if fusions is None:
        return ()
    return tuple(map(str, fusions[1:])) or None


def remembered_check(
    space: Space,
    template: EvaluateJob,
    worker: Worker,
    notes: list[str],
    say: Callable[[str], None],
    *,
    versions: dict[str, str],
    calibration_sha256: str,
    trial_timeout_s: float,
    beside: StudyFolder,
    deadline: float | None = None,
    always: AbstractSet[tuple[Value, Value]] = frozenset(),
) -> Space:
    """:func:`check_space` (until ``deadline``, but for the graphs in ``always``), remembered in the
    study folder under a key of what decides it (the working model's hash, the backend, the library
    versions and GPU, the space before the check, the shapes, the calibration data, the trial
    timeout): a resume with the same of each reuses it and its notes, and so does ``gpt-optuna
    space`` beside the study folder ``beside`` (it writes its own elsewhere). A check cut short is
    not remembered."""
    decided_by = {
        "model": template.model.sha256,
        "backend": template.backend,
        "versions": versions,
        "space": space.to_record(),
        "shapes": shapes_record(template.shapes),
        "calibration": calibration_sha256,
        "trial_timeout_s": trial_timeout_s,
    }
    key = hashlib.sha256(json.dumps(decided_by, sort_keys=True, default=str).encode()).hexdigest()[:24]
    own = StudyFolder(template.workdir).space_check(key)
    theirs = beside.space_check(key)
    path = theirs if not own.is_file() and theirs.is_file() else own  # `space` beside a study made before
    if path.is_file():
        try:
            kept = json.loads(path.read_text())
            checked = Space.from_record(kept["space"])
        except (ValueError, KeyError, TypeError):  # a damaged file: check again (and write it anew)
            pass
        else:
            say(f"checking the space: as checked before ({path.name}) for this model, backend, versions and GPU")
            notes += kept["notes"]
            return checked
    found: list[str] = []
    checked, complete = check_space(space, template, worker, trial_timeout_s, found.append, say, deadline, always)
    notes += found
    if not complete:  # what decides a check cut short includes the time it had: the next run checks anew
        return checked
    atomic_write(own, json.dumps({"decided_by": decided_by, "space": checked.to_record(), "notes": found}))
    return checked


def offered_space(config: TuneConfig, notes: list[str], say: Callable[[str], None]) -> tuple[Space, dict[str, str]]:
    """The space a search of ``config`` would have, with the library versions: found and checked
    as :func:`tune` does, in a scratch folder removed afterwards."""
    inputs = load_inputs(config.data, notes, say)
    with tempfile.TemporaryDirectory() as tmp, Worker(StudyFolder(Path(tmp)).log("worker")) as worker:
        working = with_distinct_dims(inputs.info, StudyFolder(Path(tmp)).models)
        space, versions, _ = discover_space(config, worker, inputs, working, Path(tmp), notes, say)
    return space, versions


def check_resumable(
    storage: optuna.storages.BaseStorage, name: str, kind: StudyKind, data: DataSource, inputs: Inputs
) -> list[dict[str, Any]] | None:
    """Refuse, before anything is written, to resume the study ``name`` made with another model,
    data, shapes, criterion, backend or objective (the space is compared once it is discovered);
    the space the study was made with (None for a new study)."""
    recorded = recorded_fingerprint(storage, name)
    if recorded is None:
        return None
    now = run_identity(kind, inputs)
    if recorded.get("calibration_sha256"):
        now["calibration_sha256"] = feeds_io.feeds_sha256(calibration_samples(data, inputs, []))
    refuse_if_different(name, {k: recorded.get(k) for k in now}, now)
    return recorded.get("space")


def prepare(
    config: TuneConfig,
    worker: Worker,
    inputs: Inputs,
    notes: list[str],
    say: Callable[[str], None],
    recorded: list[dict[str, Any]] | None = None,
    started: float | None = None,
) -> Prepared:
    """Cache the inputs and reference outputs in the study folder (only when missing or stale),
    make the working copy of the model, and discover and check the space (telling ``say``); a
    resumed study's space (``recorded``) has the graph fusions and precisions it was made with;
    ``started``: the run's start, from which the preparation's share of --timeout counts."""
    workdir = config.workdir
    key = f"samples:{inputs.info.sha256}:{inputs.inputs_sha256}"  # stacked on a sample axis
    feeds_io.cache_npz(workdir / INPUTS_FILE, feeds_io.stack(inputs.samples), key)
    feeds_io.cache_npz(workdir / REFERENCE_FILE, feeds_io.stack(inputs.references), key)
    working = with_distinct_dims(inputs.info, StudyFolder(workdir).models)
    space, versions, calibration_sha256 = discover_space(
        config, worker, inputs, working, workdir, notes, say, recorded, started
    )
    return Prepared(inputs, working, space, versions, profile_of(inputs.info.path), calibration_sha256)


CALIBRATION_SAMPLES = 16


def calibration_samples(config: DataSource, inputs: Inputs, notes: list[str]) -> model_io.Feeds:
    """Calibration inputs stacked on a new leading axis: from --calibration, else the --inputs
    samples, else generated."""
    if config.calibration is not None:
        load = inputs.user_code.loader("--calibration")
        return feeds_io.load_calibration(config.calibration, inputs.info, inputs.shapes, load)
    if config.inputs is not None:
        return feeds_io.stack(inputs.samples)
    notes.append(
        "warning: no --calibration data; int8/fp8 candidates are calibrated on generated inputs, "
        "so their accuracy will be poor"
    )
    samples = [feeds_io.synthetic_feeds(inputs.info, inputs.shapes, seed=i) for i in range(1, CALIBRATION_SAMPLES + 1)]
    return feeds_io.stack(samples)


def run_identity(kind: StudyKind, inputs: Inputs) -> dict[str, Any]:
    """What a study must share with a run that resumes it, known before anything is discovered."""
    return {
        "model_sha256": inputs.info.sha256,
        "backend": kind.backend,
        "accuracy": kind.criterion.text,
        "metric": kind.metric,
        "inputs_sha256": inputs.inputs_sha256,
        "shapes": shapes_record(inputs.shapes),
        "objective": "build_s" if kind.dry_run else "latency_ms",
        "objectives": list(kind.objectives),
        "allow_io_change": kind.allow_io_change,
        "your_configuration": kind.baseline_values,
    }


def fingerprint(kind: StudyKind, prepared: Prepared) -> dict[str, Any]:
    """The study's record of how it was made (compared on every resume, except ``model``, the
    hashes of its external weights, ``model_profile`` and ``versions``)."""
    return {
        **run_identity(kind, prepared.inputs),
        "model": str(prepared.inputs.info.path.resolve()),
        "external_data_sha256": external_data_sha256(prepared.inputs.info.path),
        "model_profile": prepared.profile.to_record(),
        "space": prepared.space.describe(),
        "calibration_sha256": prepared.calibration_sha256,
        "versions": prepared.versions,
    }
