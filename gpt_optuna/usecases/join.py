"""``gpt-optuna worker``: join a study's search from any host that reaches its storage.

Everything the worker needs comes from the study: the model's hash, backend, criterion, shapes
and metric (its fingerprint), the whole space, the latency protocol, the sampler and the trial
target; the inputs, reference outputs and calibration samples come from the study's artifact
store. Only the model file is the host's own, and it must have the recorded hash.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path

from optuna.artifacts import FileSystemArtifactStore

from gpt_optuna.backends import describe
from gpt_optuna.core import interrupts
from gpt_optuna.core.errors import UserError
from gpt_optuna.core.log import RESULT, tell
from gpt_optuna.core.space import Space
from gpt_optuna.core.words import counted
from gpt_optuna.graph.model import load_model_info
from gpt_optuna.remeasure.finalists import template_from_study
from gpt_optuna.results.summary_text import format_summary
from gpt_optuna.search.config import DEFAULT_TRIAL_TIMEOUT_S
from gpt_optuna.search.lanes import TrialBudget, measured_on, study_device, warming
from gpt_optuna.search.objective import OWNER, Objective
from gpt_optuna.search.sampling import make_sampler
from gpt_optuna.study.artifacts import artifact_folder, fetch
from gpt_optuna.study.folder import StudyFolder
from gpt_optuna.study.record import SearchRecord, StudyRecord, recorded_space
from gpt_optuna.study.storage import load_study, open_storage
from gpt_optuna.study.summary import finished_count, summarize_study
from gpt_optuna.study.trial_record import TrialRecord
from gpt_optuna.usecases.progress import Progress
from gpt_optuna.usecases.session import SearchSession, begin_search


@dataclass(frozen=True)
class JoinConfig:
    """What ``gpt-optuna worker`` is told; the rest is read from the study."""

    storage: str
    study_name: str
    model: Path | None = None
    n_trials: int | None = None
    timeout_s: float | None = None
    artifacts: Path | None = None
    workers: int | None = None
    gpus: str | None = None
    allow_mixed_gpus: bool = False


def checked_model(record: StudyRecord, given: Path | None) -> Path:
    """The model file this worker runs: ``given`` or the recorded path, with the recorded hash."""
    path = given or record.model or Path()
    if not path.is_file():
        raise UserError(f"no model file at {path}" + ("" if given else " (the path the study recorded): give --model"))
    if load_model_info(path).sha256 != record.model_sha256:
        raise UserError(
            f"{path} is not the study's model (its content hash differs from "
            f"{str(record.model_sha256)[:12]}): give the same file with --model"
        )
    return path


def join(config: JoinConfig, progress: Progress) -> int:
    """Search with this host's workers until the study holds its target of trials."""
    begin_search()
    if config.n_trials is not None and config.n_trials < 1:
        raise UserError(f"--n-trials must be at least 1, got {config.n_trials}")
    started = time.monotonic()
    storage = open_storage(config.storage, create=False)
    study = load_study(storage, config.study_name)
    record = StudyRecord.of(study)
    recorded = recorded_space(study)
    if record is None or recorded is None:
        raise UserError(f"study {config.study_name!r} has no search to join: start it with gpt-optuna tune")
    if record.dry_run:
        raise UserError(f"study {config.study_name!r} is a dry run: workers join searches that measure latency")
    model = checked_model(record, config.model)
    workdir = StudyFolder.named(config.study_name).root
    store = artifact_folder(study, config.artifacts)
    not_here = (
        f"the study's artifact store {store} is not on this host: mount the same store and give its path"
        " with --artifacts"
    )
    fetch(study, store, workdir, not_here)
    job = template_from_study(study, model, workdir)
    space = Space.from_record(recorded)
    search = SearchRecord.of(study)
    target = config.n_trials or search.n_trials
    sampler = make_sampler(search.sampler, None, space)
    with contextlib.ExitStack() as stack:
        log = f"worker-{OWNER.replace(':', '-')}"  # apart from a tuner's logs in the same folder
        session = SearchSession(stack, workdir, log, config.workers, config.gpus)
        with warming(session.workers, record.backend) as names:
            pass  # nothing to do meanwhile: the names are there once every worker has started
        on_cpu = describe(record.backend).runs_on_cpu(space)
        lanes = session.place(names, on_cpu)
        creator = measured_on(record.versions["gpu"], on_cpu) if "gpu" in record.versions else None
        notes, _ = session.enter(study_device(study) or creator, config.allow_mixed_gpus)
        done = finished_count(study)
        remaining = None if target is None else max(target - done, 0)
        deadline = search_deadline(search.ends_at, None if config.timeout_s is None else started + config.timeout_s)
        progress.note(
            f"joining study {config.study_name} in {config.storage} ({counted(done, 'trial')} done"
            + (f" of {target}" if target else "")
            + f"); {counted(len(lanes), 'worker')} on {lanes[0].device}"
        )
        for note in notes:
            progress.note(note)
        timeout = search.trial_timeout_s or DEFAULT_TRIAL_TIMEOUT_S
        artifacts = FileSystemArtifactStore(store)
        objective = Objective(
            space, job, timeout, artifacts, progress.result, record.objectives, note=progress.note,
            sampler=sampler,
        )  # fmt: skip
        progress.begin(remaining, deadline, len(lanes))
        budget = TrialBudget(study, target, deadline, sampler=sampler)
        try:
            stopped_by = session.search(sampler, objective, budget, progress, lambda *_: None)
        except UserError:
            progress.end()
            raise
        if stopped_by is not None:
            progress.end()
            tell(format_summary(summarize_study(study)), RESULT)
            return interrupts.exit_code()
    progress.end()
    mine = sum(1 for t in study.get_trials(deepcopy=False) if TrialRecord(t).owner == OWNER)
    tell(format_summary(summarize_study(study)), RESULT)
    tell(f"this host's workers evaluated {counted(mine, 'trial')} in {time.monotonic() - started:.1f} s", RESULT)
    return 0


def search_deadline(ends_at: float | None, own: float | None) -> float | None:
    """When this worker stops (``time.monotonic``): at its own ``--timeout`` or when the search it
    joined ends (``ends_at``, wall-clock time, where the tuner had a ``--timeout``), whichever is first."""
    shared = None if ends_at is None else time.monotonic() + ends_at - time.time()
    return min((d for d in (shared, own) if d is not None), default=None)
