"""A tuning run from a TuneConfig: prepare the model and data, open the study, search, summarize."""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import optuna
from optuna.artifacts import FileSystemArtifactStore

from gpt_optuna.backends import EngineDescription, describe
from gpt_optuna.backends.engine_choice import engine_defaults
from gpt_optuna.core import interrupts
from gpt_optuna.core.errors import EXIT_NO_FEASIBLE, UserError
from gpt_optuna.core.measure_settings import MeasureSettings
from gpt_optuna.core.space import Candidate, CandidateKey, Space, candidate_key
from gpt_optuna.core.words import counted
from gpt_optuna.graph.model_profile import ModelProfile
from gpt_optuna.protocol.jobs import EvaluateJob
from gpt_optuna.remeasure.finalists import ConfirmationFailed, confirm
from gpt_optuna.results.winner import name_objectives, record_winner
from gpt_optuna.search.config import FinalistPlan, TuneConfig
from gpt_optuna.search.engines import KEPT_ENGINES
from gpt_optuna.search.error_objective import error_objective_note
from gpt_optuna.search.lanes import TrialBudget, pinned, started_in, study_device, warming
from gpt_optuna.search.objective import Objective
from gpt_optuna.search.sampling import FreshSampler, check_sampler, make_sampler
from gpt_optuna.search.seeds import WarmStart, speed_seeds, warm_start
from gpt_optuna.search.transfer import TransferQueue
from gpt_optuna.search.your_configuration import your_candidate
from gpt_optuna.study.artifacts import artifact_folder, publish
from gpt_optuna.study.evidence import MORE_ROUNDS
from gpt_optuna.study.folder import StudyFolder
from gpt_optuna.study.record import STUDIES, SearchRecord, record_host, record_setup
from gpt_optuna.study.recovery import recover_interrupted
from gpt_optuna.study.resume import open_study, recorded_fingerprint
from gpt_optuna.study.storage import SQLITE_COMPANIONS, open_storage, storage_file
from gpt_optuna.study.summary import StudySummary, finished_count
from gpt_optuna.study.trial_record import ENGINE_DEFAULTS_ATTR, SEEDED, YOURS_ATTR
from gpt_optuna.usecases.host_check import look
from gpt_optuna.usecases.phases import Phases
from gpt_optuna.usecases.preparation import Prepared, check_resumable, fingerprint, load_inputs, prepare, study_job
from gpt_optuna.usecases.progress import Progress
from gpt_optuna.usecases.session import SearchSession, begin_search
from gpt_optuna.usecases.time_budget import (
    FILL_ROUNDS,
    FINISH_S,
    EndingReserve,
    Refreshed,
    plan_confirmation,
    refresh_s,
)


@dataclass(frozen=True)
class TuneEnd:
    """How a tuning run ended: the study's summary, why it ended there, and its exit code."""

    config: TuneConfig
    summary: StudySummary
    done: int
    """Trials that count towards --n-trials."""
    code: int
    """The process exit code: 0, 3 (no feasible candidate), or 128 + the signal's number where one stopped it."""
    note: str = ""
    took: str = ""
    """The run's time by phase."""
    stopped_by: str | None = None
    """``Ctrl-C``, ``SIGTERM`` or ``SIGHUP`` where a signal stopped the search or the re-measurement."""
    reconfirm: bool = False
    """The finalists' re-measurement was stopped: it is worth running again."""
    covered: bool = False
    """The sampler kept proposing evaluated candidates."""

    @property
    def stopped(self) -> bool:
        """Stopped by a signal before the search's end (not during the re-measurement)."""
        return self.stopped_by is not None and not self.reconfirm

    def advice(self) -> Advice:
        """What is worth doing next (:func:`advise`)."""
        return advise(self.summary, self.covered, self.reconfirm, self.stopped)


def tune(config: TuneConfig, progress: Progress | None = None) -> TuneEnd:
    """Run or resume a search and say how it ended; the caller prints the summary (the progress
    bar is closed by then)."""
    progress = progress or Progress()
    try:
        return _tune(config, progress)
    finally:
        progress.end()


def _tune(config: TuneConfig, progress: Progress) -> TuneEnd:
    """The run's steps: check, prepare, open the study, search, re-measure the finalists."""
    begin_search()
    assert config.storage is not None and config.study_name is not None
    phases = Phases()
    notes: list[str] = [config.engines_chosen] if config.engines_chosen else []
    engine = check_run(config.backend, config.sampler, config.objectives)
    if config.baseline_config is not None and config.baseline_values is None:
        config = replace(config, baseline_values=engine.baseline_values(config.baseline_config))
    host = look()  # before this run's own workers start
    phases.begin("preparing")
    inputs = load_inputs(config.data, notes, progress.note, phases.started)
    storage_path = storage_file(config.storage)
    with contextlib.ExitStack() as stack:
        new = stack.enter_context(removed_if_refused(storage_path, config.workdir))
        storage = open_storage(config.storage, make_dirs=storage_path is not None and storage_path.parent == STUDIES)
        recorded = check_resumable(storage, config.study_name, config.kind, config.data, inputs)
        config = _in_recorded_folder(config, storage, storage_path)
        session = SearchSession(stack, config.workdir, "worker", config.workers, config.gpus)
        first, others = session.workers[0], session.workers[1:]
        start_s = started_in(first, config.backend)  # what each finalists' process will cost to start
        with warming(others, config.backend) as names:  # the others start while the first finds the space
            prepared = prepare(config, first, inputs, notes, progress.note, recorded, phases.started)
        yours = None
        if config.baseline_values is not None:
            assert config.baseline_config is not None
            where = f"--baseline-config {config.baseline_config.name}"
            yours = your_candidate(prepared.space, config.baseline_values, engine, where, notes)
        lanes = session.place([prepared.versions.get("gpu", "none"), *names], engine.runs_on_cpu(prepared.space))
        sampler = make_sampler(config.sampler, config.seed, prepared.space)
        seeds, warm = first_candidates(
            config, prepared.space, prepared.profile, engine, storage, lanes[0].device, notes, yours
        )
        study, resumed = open_study(
            storage,
            config.study_name,
            sampler,
            fingerprint(config.kind, prepared),
            prepared.space.default(),
            len(config.objectives),
            seeds,
        )
        new.clear()  # the study exists: what this run made is its own from here on
        name_objectives(study)
        record_host(study, host.to_record())
        notes += [f"warning: {text}" for text in host.warnings]
        warnings, alone = session.enter(study_device(study), config.allow_mixed_gpus)
        notes += warnings + error_objective_note(config.objectives, config.criterion)
        recovered = recover_interrupted(study, alone)
        done = finished_count(study)
        remaining = None if config.n_trials is None else max(config.n_trials - done, 0)
        deadline = None if config.timeout_s is None else phases.started + config.timeout_s
        sampler.read(study.get_trials(deepcopy=False))
        left = sampler.coverage.left(sampler.ledger.taken())
        named = (config.study_name, config.storage)
        progress.start(named, prepared.space, resumed, done, recovered, remaining, deadline, len(lanes), left)
        for note in notes:
            progress.note(note)
        if remaining == 0:
            return ended(config, study, 0, "the study already has its trials")
        if sampler.ledger.counts()[2] == 0 and sampler.covered():
            return ended(config, study, 0, f"{covered_note(sampler, True)}: nothing is left to search", covered=True)
        ends_at = None if deadline is None else time.time() + deadline - time.monotonic()
        search = SearchRecord(config.sampler, config.n_trials, config.trial_timeout_s, ends_at)
        record_search(study, config.workdir, config.measure, prepared.space, search)
        run = _SearchRun(config, study, session, sampler, progress, phases, deadline, start_s)
        return run.search(prepared, warm)


def _in_recorded_folder(
    config: TuneConfig, storage: optuna.storages.BaseStorage, storage_path: Path | None
) -> TuneConfig:
    """``config`` with the folder the study recorded, where it resumes one whose folder is there (a
    study resumed from another directory keeps its folder); a user error where that folder moved."""
    assert config.study_name is not None
    folder = StudyFolder.recorded(storage, config.study_name)
    if folder is not None and folder.is_dir():
        return replace(config, folder=folder)
    if folder is not None and storage_path is not None:  # moved: a server's study may be another host's
        gone = StudyFolder(folder).gone(config.study_name)
        raise UserError(f"{gone}; or start a new study with another --study-name")
    return config


@dataclass(frozen=True)
class _SearchRun:
    """An opened study's search, from its first trial to the finalists' re-measurement."""

    config: TuneConfig
    study: optuna.Study
    session: SearchSession
    sampler: FreshSampler
    progress: Progress
    phases: Phases
    deadline: float | None
    start_s: float
    """What each finalists' process will cost to start."""

    def search(self, prepared: Prepared, warm: WarmStart) -> TuneEnd:
        """The search, then the finalists re-measured, and how the run ended."""
        config, study, progress = self.config, self.study, self.progress
        job = study_job(
            config.kind, config.measure, config.workdir, prepared.working, prepared.inputs.shapes, prepared.space
        )
        store = artifact_folder(study, config.artifacts)
        publish(study, store, config.workdir)
        kept_s = kept_time(config.finalists, study, self.deadline, self.sampler, progress, self.start_s)
        budget = TrialBudget(
            study, config.n_trials, self.deadline, Refreshed(kept_s, refresh_s(config.timeout_s)), self.sampler
        )
        transfer = TransferQueue.of(warm, budget.has_room, progress.note)
        transfer.update(study)
        objective = Objective(
            prepared.space,
            job,
            config.trial_timeout_s,
            FileSystemArtifactStore(store),
            progress.result,
            config.objectives,
            budget.search_left,
            progress.note,
            self.sampler,
            None if config.keep_all_engines else max(KEPT_ENGINES, config.confirm_top),
        )
        objective.engines.seed(study.get_trials(deepcopy=False))
        self.phases.begin("searching")
        stopped_by = self.session.search(self.sampler, objective, budget, progress, transfer.update)
        if stopped_by is not None:
            code, took = interrupts.exit_code(), self.phases.line()
            return ended(config, study, code, f"stopped by {stopped_by}", took, stopped_by=stopped_by)
        if self.deadline is not None:
            # the search is over: workers that joined it stop, and leave the GPU to the finalists
            replace(SearchRecord.of(study), ends_at=time.time()).write(study)
        covered = budget.covered or objective.space_exhausted
        note = covered_note(self.sampler, budget.covered) if covered else ""
        progress.end()  # the search's bar stops here: the re-measurement says what it does
        return self.finish(job, note, covered)

    def finish(self, job: EvaluateJob, note: str, covered: bool) -> TuneEnd:
        """The finalists re-measured (where the run measures latency and asks for it), and how the run ended."""
        config, study = self.config, self.study
        if not config.dry_run and config.confirm_top > 0:
            self.phases.begin("re-measuring the finalists")
            try:
                pinning = pinned(self.session.gpus[0])
                note = (
                    confirm_finalists(config.finalists, study, job, self.deadline, self.progress, pinning, self.start_s)
                    or note
                )
                interrupts.check()
            except KeyboardInterrupt:
                note = f"the finalists' re-measurement was stopped by {interrupts.cause()}"
                code, took = interrupts.exit_code(), self.phases.line()
                return ended(config, study, code, note, took, stopped_by=interrupts.cause(), reconfirm=True)
        end = ended(config, study, 0, note, self.phases.line(), covered=covered)
        if end.summary.best is None:
            note = "no candidate met the accuracy criterion" if not config.dry_run else "no candidate built"
            end = replace(end, code=EXIT_NO_FEASIBLE, note=note)
        return end


def ended(config: TuneConfig, study: optuna.Study, code: int, note: str = "", took: str = "", **how: Any) -> TuneEnd:
    """How the run ended (``how``: :class:`TuneEnd`'s flags), with the study's summary, its winner
    recorded in the study, and the trials that count so far. The runs that end before the search
    (the study already has its trials, or its space is covered) took no phase worth telling."""
    return TuneEnd(config, record_winner(study), finished_count(study), code, note, took, **how)


def covered_note(sampler: FreshSampler, every: bool) -> str:
    """Why the search ended before its trials: ``every`` candidate of a listed space evaluated
    (or ruled out), else the sampler kept finding none but evaluated ones."""
    if every:
        size = sampler.coverage.size
        return f"every one of the space's {size:,} candidates is evaluated or ruled out: the space is covered"
    return "the sampler kept proposing evaluated candidates: the space looks covered"


def check_run(name: str, sampler: str, objectives: tuple[str, ...]) -> EngineDescription:
    """Refuse, before the model is read or anything is written, what cannot run here: a backend
    that does not load or whose library is missing, a sampler without its libraries, an objective
    the backend cannot measure; the backend ``name``, checked."""
    backend = describe(name)
    missing = backend.missing_library()
    if missing is not None:
        raise missing
    check_sampler(sampler)
    if "memory" in objectives and not backend.reports_device_memory:
        raise UserError(f"backend {name!r} does not report engine device memory; drop memory from --objectives")
    return backend


@contextlib.contextmanager
def removed_if_refused(storage_path: Path | None, workdir: Path) -> Iterator[list[Path]]:
    """Yield the paths a new study's run is about to make (its database file, the study folder,
    ``studies/``) and remove them if the run stops before the study exists: a refused run leaves
    nothing behind. The caller empties the list once the study is made."""
    made = [p for p in (storage_path, workdir, STUDIES) if p is not None and not p.exists()]
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
                for leftover in (path, *(path.with_name(path.name + s) for s in SQLITE_COMPANIONS)):
                    with contextlib.suppress(FileNotFoundError, NotADirectoryError):  # under a file: never made
                        leftover.unlink()
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
    config: TuneConfig,
    space: Space,
    profile: ModelProfile,
    backend: EngineDescription,
    storage: optuna.storages.BaseStorage,
    device: str,
    notes: list[str],
    yours: Candidate | None = None,
) -> tuple[list[tuple[Candidate, dict[str, str]]], WarmStart]:
    """What a new study tries right after its baseline: the user's own configuration (``yours``,
    from ``--baseline-config``), the configurations given (``config.seeds``) and every speed
    feature on (unless ``--no-seeds``), each once, with the user attrs that say why, queued
    with the baseline; then the best of the ``--warm-start`` studies, as many from each as its
    model's likeness to this one (``profile``) earns, ranked, each with where it came from (queued
    one at a time by :class:`TransferQueue`)."""
    seeds: list[tuple[Candidate, dict[str, str]]] = [
        (defaults, {SEEDED: f"{engine}'s defaults", ENGINE_DEFAULTS_ATTR: engine})
        for engine, defaults in engine_defaults(space)
    ]
    if yours is not None:
        assert config.baseline_config is not None
        seeds.append((yours, {SEEDED: "your configuration", YOURS_ATTR: config.baseline_config.name}))
    seeds += [(space.fitted(values), {SEEDED: why}) for values, why in config.seeds]
    if not config.no_seeds:
        seeds += [(speed, {SEEDED: why}) for speed, why in speed_seeds(space, backend)]
    seeds = once_each(seeds)
    if not config.warm_start:
        return seeds, WarmStart([], {}, {}, {})
    assert config.study_name is not None
    warm = warm_start(storage, config.warm_start, config.study_name, config.backend, device, space, profile)
    if recorded_fingerprint(storage, config.study_name) is None:  # a new study: they are queued
        notes.append(f"warm start: {warm.describe() or 'no earlier study of this backend on this device'}")
    return seeds, warm


def once_each(seeds: list[tuple[Candidate, dict[str, str]]]) -> list[tuple[Candidate, dict[str, str]]]:
    """Each candidate once, in the order first given, with every reason it was given (the first's
    where two say the same thing)."""
    kept: dict[CandidateKey, tuple[Candidate, dict[str, str]]] = {}
    for candidate, why in seeds:
        _, reasons = kept.setdefault(candidate_key(candidate), (candidate, {}))
        reasons.update({k: v for k, v in why.items() if k not in reasons})
    return list(kept.values())


def record_search(
    study: optuna.Study, folder: Path, measure: MeasureSettings, space: Space, search: SearchRecord
) -> None:
    """Where the study folder is, and what a worker joining from another host needs besides the
    fingerprint: the latency protocol of this search, its whole space, and its sampler, trial
    target and end (``search``)."""
    StudyFolder(folder).record(study)
    record_setup(study, measure, space.to_record())
    search.write(study)


def kept_time(
    finalists: FinalistPlan,
    study: optuna.Study,
    deadline: float | None,
    sampler: FreshSampler,
    progress: Progress,
    start_s: float,
) -> Callable[[], float]:
    """The seconds the search leaves under --timeout for what follows it (:class:`EndingReserve`,
    which tells ``progress`` where --timeout cannot hold the re-measurement); ``start_s``: a worker
    process's measured start."""
    if finalists.timeout_s is None or deadline is None:
        return lambda: 0.0
    top = 0 if finalists.dry_run else finalists.top
    return EndingReserve(
        study,
        top,
        finalists.processes,
        finalists.measure,
        finalists.timeout_s,
        deadline,
        sampler.ledger.longest_recent_s,
        progress.note,
        start_s,
    )


def confirm_finalists(
    finalists: FinalistPlan,
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
    plan = plan_confirmation(study, finalists.top, finalists.processes, finalists.measure, left, start_s)
    if plan is None:
        return "" if left is None else "no time left before --timeout to re-measure the finalists"
    progress.note(
        f"re-measuring the {counted(plan.top, 'best candidate')} and the baseline"
        f"{' (and your configuration)' if finalists.yours else ''}, interleaved, in"
        f" {counted(plan.processes, 'fresh process', 'fresh processes')} of {plan.rounds} rounds or more while the"
        f" time lasts (about {plan.total_s:.0f} s) ..."
    )
    rounds = plan.rounds if end is None else FILL_ROUNDS  # each process's share of the time ends its rounds
    try:
        log = StudyFolder(finalists.folder).log("confirm")
        result = confirm(study, job, log, plan.top, plan.processes, progress.note, env, end, start_s, rounds)
    except ConfirmationFailed as failure:
        return str(failure)
    done = plan.processes if result is None else result["processes"]
    full = plan_confirmation(study, finalists.top, finalists.processes, finalists.measure, None, start_s)
    if full is not None and (plan.top, done) != (full.top, full.processes):
        measured, processes = counted(plan.top, "finalist"), counted(done, "process", "processes")
        return f"re-measured {measured} in {processes} (of {full.top} in {full.processes}): what fit in --timeout"
    return ""


@dataclass(frozen=True)
class Advice:
    """What is worth doing after a run, whoever phrases it (the command line, a Python call)."""

    resume: bool
    """The run stopped before its end: the same again resumes it."""
    extend: bool
    """Else a larger trial target, where the space is not covered."""
    confirm: bool
    """The finalists were not confirmed (or their re-measurement was stopped)."""
    remeasure_processes: int | None
    """Inconclusive, its processes disagreeing: re-measure on a quiet host in this many processes."""
    remeasure_rounds: int | None
    """Inconclusive, its rounds noisy within each process: re-measure with this many rounds in each."""
    export: bool
    """The winner is a real improvement."""


def advise(summary: StudySummary, covered: bool = False, reconfirm: bool = False, stopped: bool = False) -> Advice:
    """What :class:`Advice` says after a run that ended as ``summary`` says."""
    confirm = summary.verdict in ("unconfirmed", "indicative") or reconfirm
    processes = rounds = None
    confirmation = summary.confirmation
    if not confirm and summary.verdict == "inconclusive" and confirmation is not None:
        top = confirmation.top
        if top is not None and confirmation.widened_by(top) == "rounds":
            rounds = MORE_ROUNDS * confirmation.rounds_each
        else:
            processes = 2 * confirmation.processes
    export = summary.verdict == "faster" and summary.best is not None
    return Advice(stopped, not stopped and not covered, confirm, processes, rounds, export)
