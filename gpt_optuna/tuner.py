"""A tuning run from a TuneConfig: prepare the model and data, open the study, search, summarize."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import shlex
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from optuna.artifacts import FileSystemArtifactStore

from gpt_optuna import interrupts
from gpt_optuna import model as model_io
from gpt_optuna.backends import load_backend
from gpt_optuna.config import STUDIES, TuneConfig, study_flags
from gpt_optuna.confirm import confirm
from gpt_optuna.errors import EXIT_NO_FEASIBLE, UserError
from gpt_optuna.evaluate import (
    CALIBRATION_FILE,
    INPUTS_FILE,
    REFERENCE_FILE,
    EvaluateJob,
    SpaceJob,
)
from gpt_optuna.export import export_suffix
from gpt_optuna.objective import Objective
from gpt_optuna.parallel import (
    TrialBudget,
    check_devices,
    lane_gpus,
    make_lanes,
    open_workers,
    pinned,
    run_lanes,
    started_in,
    study_device,
    warming,
)
from gpt_optuna.phases import Phases
from gpt_optuna.precision import QUANTIZED
from gpt_optuna.progress import Progress, warm_summary
from gpt_optuna.seeds import speed_seed, warm_start
from gpt_optuna.shared_data import artifact_folder, publish
from gpt_optuna.space import Candidate, Space
from gpt_optuna.space_check import check_space
from gpt_optuna.study import (
    FOLDER_ATTR,
    MEASURE_ATTR,
    SEARCH_ATTR,
    SPACE_ATTR,
    StudySummary,
    check_sampler,
    finished_count,
    make_sampler,
    open_storage,
    open_study,
    recorded_fingerprint,
    recorded_folder,
    recover_interrupted,
    refuse_if_different,
    storage_file,
    tuner_presence,
)
from gpt_optuna.time_budget import FINISH_S, kept_for_confirmation, plan_confirmation
from gpt_optuna.winner import name_objectives, record_winner
from gpt_optuna.worker import JobFailure, Worker

SPACE_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Inputs:
    """The user's model and data (one sample or many), checked and in memory, with the fp32
    reference outputs of each sample: nothing written anywhere yet."""

    info: model_io.ModelInfo
    shapes: dict[str, model_io.ShapeRange]
    samples: list[model_io.Feeds]
    references: list[model_io.Feeds]

    @functools.cached_property
    def inputs_sha256(self) -> str:
        return model_io.samples_sha256(self.samples)

    @property
    def shapes_record(self) -> dict[str, list[list[int]]]:
        return {name: [list(r.min), list(r.opt), list(r.max)] for name, r in self.shapes.items()}


@dataclass(frozen=True)
class Prepared:
    """The model the candidates run (a working copy where its dimensions needed names) and the
    discovered, checked search space; the study folder caches inputs, reference and calibration."""

    inputs: Inputs
    working: model_io.ModelInfo
    space: Space
    versions: dict[str, str]
    calibration_sha256: str = ""


def load_inputs(config: TuneConfig, notes: list[str]) -> Inputs:
    """The checked model, every input's shape range, the input data (given or generated) and the
    fp32 reference outputs; warnings go to ``notes``. Reads only."""
    info = model_io.load_model_info(config.model)
    model_io.check_numeric_inputs(info)
    shapes = model_io.parse_shapes(config.shapes)
    if config.inputs is not None:
        samples = model_io.load_samples(config.inputs, info, shapes, config.samples)
        shapes = {n: shapes.get(n, model_io.ShapeRange.fixed(tuple(a.shape))) for n, a in samples[0].items()}
    else:
        shapes = model_io.resolve_shapes(info, shapes)
        samples = [model_io.synthetic_feeds(info, shapes)]
        notes.append(
            "warning: no --inputs: accuracy is judged on one batch of generated N(0, 1) data, which says little"
            " about real inputs; give real samples with --inputs (an .npz, a folder of them, or module:function)"
        )
    references = [model_io.reference_outputs(info, feeds) for feeds in samples]
    model_io.check_reference(references, generated=config.inputs is None, notes=notes)
    config.criterion.check_applicable(references[0])
    if config.metric is not None:
        metric = model_io.load_function(config.metric, "--metric")
        config.criterion.check_user_metrics(call_metric(metric, references, references, samples))
    return Inputs(info, shapes, samples, references)


def call_metric(
    metric: Callable[..., Any],
    outputs: list[model_io.Feeds],
    references: list[model_io.Feeds],
    inputs: list[model_io.Feeds],
) -> dict[str, Any]:
    """The user's metric function on all samples; its failure is the user's to see, in one line."""
    try:
        return dict(metric(outputs, references, inputs))
    except Exception as exc:
        raise UserError(f"the --metric function failed on the reference outputs: {type(exc).__name__}: {exc}") from exc


SLOW_STEP_S = 3.0
"""A step of the preparation still going after this long says what it does."""


def discover_space(
    config: TuneConfig,
    worker: Worker,
    inputs: Inputs,
    working: model_io.ModelInfo,
    workdir: Path,
    notes: list[str],
    say: Callable[[str], None],
) -> tuple[Space, dict[str, str], str]:
    """The backend's search space (found in the worker process) with the ``[space]`` overrides,
    each graph transform it offers made and loaded once (:func:`check_space`); the space, the
    library versions and the calibration data's hash (empty without int8/fp8). Transformed
    models and the calibration data are kept in ``workdir``; what was dropped goes to ``notes``."""
    slow = threading.Timer(
        SLOW_STEP_S, say, ["finding the search space (a transformer's fusion takes a while on a large graph) ..."]
    )
    slow.start()
    try:
        job = SpaceJob(config.backend, working, inputs.shapes, workdir / "models", config.allow_io_change)
        space, versions, left_out = worker.run(job, SPACE_TIMEOUT_S)
    except JobFailure as failure:
        raise UserError(f"backend {config.backend!r} could not describe its search space: {failure}") from None
    finally:
        slow.cancel()
    notes += left_out
    space = space.with_overrides(config.space)
    calibration_sha256 = ""
    if set(space.choices("precision")) & set(QUANTIZED):
        samples = calibration_samples(config, inputs, notes)
        calibration_sha256 = model_io.feeds_sha256(samples)
        model_io.cache_npz(workdir / CALIBRATION_FILE, samples, calibration_sha256)
    template = EvaluateJob.in_study(
        workdir,
        config.backend,
        working,
        inputs.shapes,
        config.criterion,
        config.measure,
        space.defaults(),
        config.dry_run,
        config.metric,
    )
    space = remembered_check(space, template, worker, config, versions, calibration_sha256, notes, say)
    return space, versions, calibration_sha256


def remembered_check(
    space: Space,
    template: EvaluateJob,
    worker: Worker,
    config: TuneConfig,
    versions: dict[str, str],
    calibration_sha256: str,
    notes: list[str],
    say: Callable[[str], None],
) -> Space:
    """:func:`check_space`, remembered in the study folder under a key of what decides it (the
    working model's hash, the backend, the library versions and GPU, the space before the check,
    the shapes, the calibration data, the trial timeout): a resume with the same of each reuses it
    and its notes, and so does ``gpt-optuna space`` beside the study (it writes its own elsewhere)."""
    decided_by = {
        "model": template.model.sha256,
        "backend": config.backend,
        "versions": versions,
        "space": space.to_record(),
        "shapes": {name: [list(r.min), list(r.opt), list(r.max)] for name, r in template.shapes.items()},
        "calibration": calibration_sha256,
        "trial_timeout_s": config.trial_timeout_s,
    }
    key = hashlib.sha256(json.dumps(decided_by, sort_keys=True, default=str).encode()).hexdigest()[:24]
    name = f"space-check-{key}.json"
    path = template.workdir / name
    if not path.is_file() and (config.workdir / name).is_file():  # `space` beside a study made before
        path = config.workdir / name
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
    checked = check_space(space, template, worker, config.trial_timeout_s, found.append, say)
    notes += found
    path = template.workdir / name
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(json.dumps({"decided_by": decided_by, "space": checked.to_record(), "notes": found}))
    partial.replace(path)
    return checked


def offered_space(config: TuneConfig, notes: list[str], say: Callable[[str], None]) -> tuple[Space, dict[str, str]]:
    """The space a search of ``config`` would have, with the library versions: found and checked
    as :func:`tune` does, in a scratch folder removed afterwards."""
    inputs = load_inputs(config, notes)
    with tempfile.TemporaryDirectory() as tmp, Worker(Path(tmp) / "worker.log") as worker:
        working = model_io.with_distinct_dims(inputs.info, Path(tmp) / "models")
        space, versions, _ = discover_space(config, worker, inputs, working, Path(tmp), notes, say)
    return space, versions


def check_resumable(storage: optuna.storages.BaseStorage, config: TuneConfig, inputs: Inputs) -> None:
    """Refuse, before anything is written, to resume a study made with another model, data, shapes,
    criterion, backend or objective (the space is compared once it is discovered)."""
    assert config.study_name is not None
    recorded = recorded_fingerprint(storage, config.study_name)
    if recorded is None:
        return
    now = run_identity(config, inputs)
    if recorded.get("calibration_sha256"):
        now["calibration_sha256"] = model_io.feeds_sha256(calibration_samples(config, inputs, []))
    refuse_if_different(config.study_name, {k: recorded.get(k) for k in now}, now)


def prepare(
    config: TuneConfig, worker: Worker, inputs: Inputs, notes: list[str], say: Callable[[str], None]
) -> Prepared:
    """Cache the inputs and reference outputs in the study folder (only when missing or stale),
    make the working copy of the model, and discover and check the space (telling ``say``)."""
    workdir = config.workdir
    key = f"samples:{inputs.info.sha256}:{inputs.inputs_sha256}"  # stacked on a sample axis
    model_io.cache_npz(workdir / INPUTS_FILE, model_io.stack(inputs.samples), key)
    model_io.cache_npz(workdir / REFERENCE_FILE, model_io.stack(inputs.references), key)
    working = model_io.with_distinct_dims(inputs.info, workdir / "models")
    space, versions, calibration_sha256 = discover_space(config, worker, inputs, working, workdir, notes, say)
    return Prepared(inputs, working, space, versions, calibration_sha256)


CALIBRATION_SAMPLES = 16


def calibration_samples(config: TuneConfig, inputs: Inputs, notes: list[str]) -> model_io.Feeds:
    """Calibration inputs stacked on a new leading axis: from --calibration, else the --inputs
    samples, else generated."""
    if config.calibration is not None:
        return model_io.load_calibration(config.calibration, inputs.info, inputs.shapes)
    if config.inputs is not None:
        return model_io.stack(inputs.samples)
    notes.append(
        "warning: no --calibration data; int8/fp8 candidates are calibrated on generated inputs, "
        "so their accuracy will be poor"
    )
    samples = [model_io.synthetic_feeds(inputs.info, inputs.shapes, seed=i) for i in range(1, CALIBRATION_SAMPLES + 1)]
    return {name: np.stack([s[name] for s in samples]) for name in samples[0]}


def run_identity(config: TuneConfig, inputs: Inputs) -> dict[str, Any]:
    """What a study must share with a run that resumes it, known before anything is discovered."""
    return {
        "model_sha256": inputs.info.sha256,
        "backend": config.backend,
        "accuracy": config.criterion.text,
        "metric": config.metric,
        "inputs_sha256": inputs.inputs_sha256,
        "shapes": inputs.shapes_record,
        "objective": "build_s" if config.dry_run else "latency_ms",
        "objectives": list(config.objectives),
        "allow_io_change": config.allow_io_change,
    }


def fingerprint(config: TuneConfig, prepared: Prepared) -> dict[str, Any]:
    """The study's record of how it was made (compared on every resume, except ``model`` and ``versions``)."""
    return {
        **run_identity(config, prepared.inputs),
        "model": str(prepared.inputs.info.path.resolve()),
        "space": prepared.space.describe(),
        "calibration_sha256": prepared.calibration_sha256,
        "versions": prepared.versions,
    }


def tune(
    config: TuneConfig, progress: Progress | None = None, argv: list[str] | None = None, summarize: bool = True
) -> int:
    """Run or resume a search; returns the process exit code (128 + the signal's number when one
    stopped it: 130 after Ctrl-C).

    ``argv`` are the command's arguments, printed at the end as the command that resumes. Without
    ``summarize`` (a caller that judges the study itself, as ``check`` does) nothing is printed at
    the end: no summary, no next steps.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    interrupts.install()
    logging.getLogger("optuna").setLevel(logging.ERROR)
    assert config.storage is not None and config.study_name is not None
    phases = Phases()
    progress = progress or Progress()
    finish = progress.finish if summarize else progress.quiet_finish
    notes: list[str] = []
    check_run(config)
    phases.begin("preparing")
    inputs = load_inputs(config, notes)
    storage_path = storage_file(config.storage)
    with contextlib.ExitStack() as stack:
        new = stack.enter_context(removed_if_refused(config, storage_path))
        storage = open_storage(config.storage, make_dirs=storage_path is not None and storage_path.parent == STUDIES)
        check_resumable(storage, config, inputs)
        folder = recorded_folder(storage, config.study_name)
        if folder is not None and folder.is_dir():  # a study resumed from another directory keeps its folder
            config = replace(config, folder=folder)
        gpus = lane_gpus(config.workers, config.gpus, config.workdir / "worker.log")
        workers = open_workers(stack, gpus, config.workdir, "worker")
        start_s = started_in(workers[0], config.backend)  # what each finalists' process will cost to start
        with warming(workers[1:], config.backend) as names:  # the others start while the first finds the space
            prepared = prepare(config, workers[0], inputs, notes, progress.note)
        lanes = make_lanes(workers, gpus, [prepared.versions.get("gpu", "none"), *names], prepared.space)
        sampler = make_sampler(config.sampler, config.seed, prepared.space)
        study, resumed = open_study(
            storage,
            config.study_name,
            sampler,
            fingerprint(config, prepared),
            prepared.space.default(),
            len(config.objectives),
            first_candidates(config, prepared.space, storage, lanes[0].device, notes),
        )
        new.clear()  # the study exists: what this run made is its own from here on
        name_objectives(study)
        notes += check_devices(lanes, study_device(study), config.allow_mixed_gpus)
        alone = stack.enter_context(tuner_presence(config.workdir))
        recovered = recover_interrupted(study, alone)
        done = finished_count(study)
        remaining = None if config.n_trials is None else max(config.n_trials - done, 0)
        deadline = None if config.timeout_s is None else phases.started + config.timeout_s
        progress.start(config, prepared.space, resumed, done, recovered, remaining, deadline, len(lanes))
        for note in notes:
            progress.note(note)
        if remaining == 0:
            summary = record_winner(study)
            steps = next_steps(config, args, done, summary)
            finish(summary, steps, note="the study already has its trials")
            return 0
        record_search(study, config, prepared, deadline)
        job = EvaluateJob.in_study(
            config.workdir,
            config.backend,
            prepared.working,
            prepared.inputs.shapes,
            config.criterion,
            config.measure,
            prepared.space.defaults(),
            config.dry_run,
            config.metric,
        )
        store = artifact_folder(study, config.artifacts)
        publish(study, store, config.workdir)
        artifacts = FileSystemArtifactStore(store)
        budget = TrialBudget(study, config.n_trials, deadline, lambda: kept_time(config, study, start_s))
        objective = Objective(
            prepared.space,
            job,
            config.trial_timeout_s,
            artifacts,
            progress.result,
            config.objectives,
            budget.search_left,
            progress.note,
        )
        phases.begin("searching")
        try:
            run_lanes(config.study_name, storage, sampler, lanes, objective, budget, progress.trial_done)
        except (KeyboardInterrupt, UserError) as exc:
            if isinstance(exc, UserError):
                raise
            summary = record_winner(study)
            steps = next_steps(config, args, finished_count(study), summary, stopped=True)
            finish(summary, steps, note=f"stopped by {interrupts.cause()}", took=phases.line())
            return interrupts.exit_code()
        if deadline is not None:  # the search is over: workers that joined it stop, and leave the GPU to the finalists
            study.set_user_attr(SEARCH_ATTR, study.user_attrs[SEARCH_ATTR] | {"ends_at": time.time()})
        note = (
            "the sampler kept proposing evaluated candidates: the space looks covered"
            if objective.space_exhausted
            else ""
        )
        progress.end()  # the search's bar stops here: the re-measurement says what it does
        if not config.dry_run and config.confirm_top > 0:
            phases.begin("re-measuring the finalists")
            try:
                note = confirm_finalists(config, study, job, deadline, progress, pinned(gpus[0]), start_s) or note
                interrupts.check()
            except KeyboardInterrupt:
                note = f"the finalists' re-measurement was stopped by {interrupts.cause()}"
                summary = record_winner(study)
                steps = next_steps(config, args, finished_count(study), summary, reconfirm=True)
                finish(summary, steps, note=note, took=phases.line())
                return interrupts.exit_code()
        summary = record_winner(study)
        if summary.best is None:
            note = "no candidate met the accuracy criterion" if not config.dry_run else "no candidate built"
        steps = next_steps(config, args, finished_count(study), summary, covered=objective.space_exhausted)
        finish(summary, steps, note=note, took=phases.line())
    return EXIT_NO_FEASIBLE if summary.best is None else 0


def check_run(config: TuneConfig) -> None:
    """Refuse, before the model is read or anything is written, what cannot run here: a backend
    that does not load or whose library is missing, a sampler without its libraries, an objective
    the backend cannot measure."""
    backend = load_backend(config.backend)
    missing = backend.missing_library()
    if missing is not None:
        raise missing
    check_sampler(config.sampler)
    if "memory" in config.objectives and not backend.reports_device_memory:
        raise UserError(
            f"backend {config.backend!r} does not report engine device memory; drop memory from --objectives"
        )


@contextlib.contextmanager
def removed_if_refused(config: TuneConfig, storage_path: Path | None) -> Iterator[list[Path]]:
    """Yield the paths a new study's run is about to make (its database file, the study folder,
    ``studies/``) and remove them if the run stops before the study exists: a refused run leaves
    nothing behind. The caller empties the list once the study is made."""
    made = [p for p in (storage_path, config.workdir, STUDIES) if p is not None and not p.exists()]
    try:
        yield made
    except BaseException:
        for path in made:
            if path == STUDIES:
                with contextlib.suppress(OSError):
                    path.rmdir()  # only where nothing else is in it
            elif path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            elif not holds_a_study(path):  # another tuner may have made its study there meanwhile
                for leftover in (path, *(path.with_name(path.name + s) for s in ("-wal", "-shm", "-journal"))):
                    leftover.unlink(missing_ok=True)
        raise


def holds_a_study(path: Path) -> bool:
    """Whether a storage file holds any study (a journal file: whether it holds anything)."""
    if not path.is_file():
        return False
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as connection:
            return bool(connection.execute("SELECT count(*) FROM studies").fetchone()[0])
    except sqlite3.DatabaseError:  # no studies table yet, or not SQLite (a journal file)
        with path.open("rb") as file:
            return path.stat().st_size > 0 and not file.read(16).startswith(b"SQLite format 3")


def first_candidates(
    config: TuneConfig, space: Space, storage: optuna.storages.BaseStorage, device: str, notes: list[str]
) -> list[tuple[Candidate, dict[str, str]]]:
    """What a new study tries right after its baseline, with the user attrs that say why: the
    configurations given (``config.seeds``), every speed feature on (unless ``--no-seeds``), and
    the best of the ``--warm-start`` studies."""
    seeds = [(space.fitted(values), {"seeded": why}) for values, why in config.seeds]
    speed = None if config.no_seeds else speed_seed(space)
    if speed is not None:
        seeds.append((speed, {"seeded": "every speed feature on"}))
    if config.warm_start:
        assert config.study_name is not None
        warm = warm_start(storage, config.warm_start, config.study_name, config.backend, device, space)
        seeds += [(candidate, {"warm_start_from": source}) for candidate, source in warm]
        if recorded_fingerprint(storage, config.study_name) is None:  # a new study: they are queued
            notes.append(f"warm start: {warm_summary([source for _, source in warm]) or 'no earlier feasible trial'}")
    return seeds


def record_search(study: optuna.Study, config: TuneConfig, prepared: Prepared, deadline: float | None) -> None:
    """Where the study folder is, and what a worker joining from another host needs besides the
    fingerprint: the latency protocol
    of this search, its whole space, sampler, trial target and end (``deadline`` on this host's
    monotonic clock, stored as wall-clock time)."""
    if study.user_attrs.get(FOLDER_ATTR) is None:
        study.set_user_attr(FOLDER_ATTR, str(config.workdir.resolve()))
    study.set_user_attr(MEASURE_ATTR, asdict(config.measure))
    study.set_user_attr(SPACE_ATTR, prepared.space.to_record())
    ends_at = None if deadline is None else time.time() + deadline - time.monotonic()
    search = {"sampler": config.sampler, "n_trials": config.n_trials, "trial_timeout_s": config.trial_timeout_s}
    study.set_user_attr(SEARCH_ATTR, search | {"ends_at": ends_at})


def kept_time(config: TuneConfig, study: optuna.Study, start_s: float) -> float:
    """The seconds the search leaves under --timeout for what follows it (see :mod:`time_budget`);
    ``start_s``: a worker process's measured start."""
    if config.timeout_s is None:
        return 0.0
    top = 0 if config.dry_run else config.confirm_top
    return kept_for_confirmation(study, top, config.confirm_processes, config.measure, config.timeout_s, start_s)


def confirm_finalists(
    config: TuneConfig,
    study: optuna.Study,
    job: EvaluateJob,
    deadline: float | None,
    progress: Progress,
    env: dict[str, str],
    start_s: float,
) -> str:
    """Re-measure the finalists within what is left of --timeout (as many as fit, by the time the
    search measured and ``start_s``, a worker's measured start), on the first worker's device
    (``env`` pins it); a note where that could not be done in full."""
    end = None if deadline is None else deadline - FINISH_S
    left = None if end is None else end - time.monotonic()
    plan = plan_confirmation(study, config.confirm_top, config.confirm_processes, config.measure, left, start_s)
    if plan is None:
        return "" if left is None else "no time left before --timeout to re-measure the finalists"
    progress.note(
        f"re-measuring the {plan.top} best candidates and the baseline, interleaved, in {plan.processes} fresh"
        f" process{'es' if plan.processes > 1 else ''} (about {plan.total_s:.0f} s) ..."
    )
    try:
        result = confirm(
            study, job, config.workdir / "confirm.log", plan.top, plan.processes, progress.note, env, end, start_s
        )
    except JobFailure as failure:
        return f"the finalists could not be re-measured: {failure}"
    done = plan.processes if result is None else result["processes"]
    full = plan_confirmation(study, config.confirm_top, config.confirm_processes, config.measure, None, start_s)
    if full is not None and (plan.top, done) != (full.top, full.processes):
        finalists = f"{plan.top} finalist{'s' if plan.top > 1 else ''}"
        processes = f"{done} process{'es' if done > 1 else ''}"
        return f"re-measured {finalists} in {processes} (of {full.top} in {full.processes}): what fit in --timeout"
    return ""


def next_steps(
    config: TuneConfig,
    args: list[str],
    done: int,
    summary: StudySummary,
    covered: bool = False,
    reconfirm: bool = False,
    stopped: bool = False,
) -> list[str]:
    """The commands worth running next, each runnable as printed from any folder: resume the search
    (the same command) where it was ``stopped`` before its end, else extend it (a larger --n-trials;
    not where the space is ``covered``), confirm the finalists where they were not (or
    ``reconfirm``), report, and export the winner where it is a real improvement."""
    extended, skip = [], False
    for index, arg in enumerate(args):
        if skip:
            skip = False
            continue
        if arg == "--n-trials":
            skip = index + 1 < len(args)
            continue
        if not arg.startswith("--n-trials="):
            extended.append(arg)
    target = max(done, config.n_trials or 0) + max(10, done // 2)
    here = shlex.quote(str(Path.cwd()))
    where = shlex.join(study_flags(str(config.storage), str(config.study_name)))
    extend = shlex.join([*extended, "--n-trials", str(target)])
    if stopped:
        steps = [f"resume with: cd {here} && gpt-optuna {shlex.join(args)}"]
    else:
        steps = [] if covered else [f"extend with: cd {here} && gpt-optuna {extend}"]
    if summary.verdict == "unconfirmed" or reconfirm:
        steps.append(f"confirm the finalists: gpt-optuna confirm {where}")
    steps.append(f"report: gpt-optuna report {where} -o {shlex.quote(str(Path('report.html').resolve()))}")
    if summary.verdict == "faster" and summary.best is not None:
        out = Path("best").resolve().with_suffix(export_suffix(summary.best))
        steps.append(f"export the winner: gpt-optuna export {where} -o {shlex.quote(str(out))}")
    return steps
