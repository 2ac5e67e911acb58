"""A study read as every reader reads it, from Python: :func:`load` and :class:`TunedStudy`.

The verdict, the winner with the one set of figures ``gpt-optuna best --json`` prints, the
baseline, the trials as a table, the figures as plotly objects, and the report, export and
re-measurement, each as the command of the same name does it.
"""

from __future__ import annotations

import html
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import optuna

from gpt_optuna.api.exporting import Exported, export
from gpt_optuna.core import interrupts
from gpt_optuna.core.errors import UserError
from gpt_optuna.core.files import atomic_write, writable_file
from gpt_optuna.core.log import RESULT, tell
from gpt_optuna.core.words import counted
from gpt_optuna.protocol.timing import ROUNDS
from gpt_optuna.results.export import figures_record
from gpt_optuna.results.rows import ErrorAxis, TrialRow, collect, criterion_of, error_axis, marks
from gpt_optuna.results.summary_text import format_summary, headline
from gpt_optuna.search.config import storage_url as config_storage_url
from gpt_optuna.search.config import study_flags
from gpt_optuna.search.options import (
    DEFAULT_CHECK_BUDGET,
    DEFAULT_PROCESSES,
    DEFAULT_PROFILE_ROUNDS,
    DEFAULT_PROFILE_RUNS,
    DEFAULT_TOLERANCE,
    DEFAULT_TOP,
    parse_duration,
)
from gpt_optuna.study.sources import StudySources
from gpt_optuna.study.storage import load_study, open_storage, storage_file
from gpt_optuna.study.summary import StudySummary
from gpt_optuna.study.summary_record import study_summary
from gpt_optuna.study.trial_record import TrialRecord

if TYPE_CHECKING:
    import pandas

    from gpt_optuna.usecases.check_outcome import CheckResult
    from gpt_optuna.usecases.compare import Comparison
    from gpt_optuna.usecases.profile import Profile


def _teller(progress: bool) -> Callable[[str], None]:
    """What a long command says as it goes: on stdout at once, or nothing."""
    return tell if progress else (lambda _: None)


def best_record(summary: StudySummary) -> dict[str, Any]:
    """The winner as ``best --json`` prints it: the verdict, the latencies of one measurement and
    their ratio (the export's side file states them alike)."""
    best = summary.best
    assert best is not None
    figures = figures_record(summary, best)
    if summary.dry_run:
        figures |= {"latency_ms": None, "baseline_latency_ms": None, "search_latency_ms": None}
    stability = summary.stability
    return {
        "number": best.number,
        "params": best.params,
        "baseline_wins": summary.baseline_wins,
        **figures,
        "build_s": TrialRecord(best).build_s,
        "dry_run": summary.dry_run,
        "confirmed": summary.confirmed,
        "accuracy": TrialRecord(best).accuracy or {},
        "allow_io_change": summary.allow_io_change,
        "io_changes": summary.io_changes,
        "unstable_measurements": None if stability is None else [stability.unstable, stability.measured],
    }


@dataclass(frozen=True)
class Winner:
    """The study's best candidate with the latencies of one measurement (``measurement``:
    ``confirmed``, ``indicative`` or ``search``), their ratio and its 95 % interval, as every reader
    states them; :meth:`to_dict` is what ``gpt-optuna best --json`` prints. It is the study's winner
    where the verdict deploys it (:attr:`deployed`); an ``inconclusive`` or ``not_significant``
    verdict keeps the baseline instead (:attr:`TunedStudy.deploy`)."""

    number: int
    params: dict[str, Any]
    verdict: str
    headline: str
    measurement: str
    latency_ms: float | None
    baseline_latency_ms: float | None
    speedup: float | None
    speedup_ci95: tuple[float, float] | None
    significant: bool | None
    search_latency_ms: float | None
    baseline_wins: bool
    accuracy: dict[str, float]
    record: dict[str, Any] = field(repr=False)

    @classmethod
    def of(cls, summary: StudySummary) -> Winner:
        record = best_record(summary)
        values = {f.name: record[f.name] for f in fields(cls) if f.name != "record"}
        interval = values["speedup_ci95"]
        values |= {
            "params": dict(values["params"]),
            "accuracy": dict(values["accuracy"]),
            "speedup_ci95": tuple(interval) if interval else None,
        }
        return cls(**values, record=record)

    @property
    def deployed(self) -> bool:
        """Whether the verdict deploys this trial (it is :attr:`TunedStudy.deploy`)."""
        return bool(self.record["decided"])

    def to_dict(self) -> dict[str, Any]:
        """Every field of ``gpt-optuna best --json``."""
        return dict(self.record)


@dataclass(frozen=True)
class Baseline:
    """The engine's default configuration as the study measured it: ``latency_ms`` in the
    measurement the winner is judged by (the winner's ``baseline_latency_ms``)."""

    number: int
    params: dict[str, Any]
    latency_ms: float | None
    search_latency_ms: float | None
    feasible: bool


@dataclass(frozen=True)
class DeployChoice:
    """The trial the study recommends deploying, and which one it is: ``role`` is ``winner`` (the
    study's winner), ``baseline`` (the default configuration, kept where nothing is shown faster)
    or ``yours`` (the configuration the user gave, kept where nothing is shown faster than it);
    ``verdict`` is the study's."""

    number: int
    role: Literal["winner", "baseline", "yours"]
    params: dict[str, Any]
    verdict: str

    @classmethod
    def of(cls, summary: StudySummary) -> DeployChoice | None:
        trial = summary.decided
        if trial is None:
            return None
        role: Literal["winner", "baseline", "yours"] = "winner"
        if summary.baseline is not None and trial.number == summary.baseline.number:
            role = "baseline"
        elif summary.best is None or trial.number != summary.best.number:
            role = "yours"
        return cls(number=trial.number, role=role, params=dict(trial.params), verdict=summary.verdict)


def storage_url(storage: str | Path) -> str:
    """An Optuna storage URL for a URL or an SQLite file's path (``studies/x.db``), a file's made
    absolute: the same study from any folder."""
    if not isinstance(storage, str | Path):
        raise TypeError(f"storage: a URL or an SQLite file's path, not {type(storage).__name__}")
    return config_storage_url(str(storage))


def open_existing_study(storage: str | Path, study_name: str | None = None, writable: bool = False) -> optuna.Study:
    """The study in ``storage`` (a URL or a file): the one named, or the only one it holds. Opened
    read-only unless ``writable``: reading creates and locks nothing."""
    url = storage_url(storage)
    path = storage_file(url)
    if url.startswith("sqlite:") and path is not None and not path.is_file():
        if path.is_dir():
            raise UserError(f"{path} is a folder, not a study database")
        raise UserError(f"no study database at {path}")
    opened = open_storage(url, create=False, read_only=not writable)
    if study_name is None:
        names = optuna.get_all_study_names(opened)
        if not names:
            raise UserError(f"{url} holds no study")
        if len(names) > 1:
            raise UserError(
                f"the storage holds {len(names)} studies ({', '.join(names)}); choose one with --study-name"
                " (in Python: study_name=)"
            )
        study_name = names[0]
    return load_study(opened, study_name)


def load(storage: str | Path, study_name: str | None = None) -> TunedStudy:
    """Open a study as gpt-optuna reads it: ``storage`` is an Optuna storage URL or an SQLite file's
    path (``studies/model-onnxruntime.db``); ``study_name`` may be left out where it holds one
    study. Only reads (an SQLite file is opened read-only): this works while a search is running
    (:meth:`TunedStudy.refresh` reads it again)."""
    return TunedStudy(open_existing_study(storage, study_name), storage_url(storage))


class TunedStudy:
    """A gpt-optuna study: its verdict, winner, baseline, trials and figures, and what can be done
    with it (report, export, confirm, check). ``study`` is the Optuna study itself, for
    ``optuna.visualization`` and the rest of Optuna's tools (which rank trials by their search
    values: the winner here is the one the re-measurement decided)."""

    def __init__(self, study: optuna.Study, storage: str) -> None:
        self.study = study
        self.storage = storage
        """The storage's URL (a file's absolute)."""

    @cached_property
    def summary(self) -> StudySummary:
        """What every reader says about the study (read once, from its record where that speaks for it;
        :meth:`refresh` reads again)."""
        return study_summary(self.study)

    @property
    def study_name(self) -> str:
        return self.study.study_name

    @property
    def verdict(self) -> str:
        """``faster``, ``inconclusive``, ``not_significant``, ``baseline``, ``indicative``,
        ``unconfirmed``, ``none`` (no feasible trial yet) or ``dry_run``: what the study found."""
        return self.summary.verdict

    @property
    def headline(self) -> str:
        """The verdict in one sentence, as the summary opens."""
        return headline(self.summary)

    @cached_property
    def best(self) -> Winner | None:
        """The best candidate and its figures, as ``gpt-optuna best`` names it (None before any
        feasible trial): the confirmation's fastest finalist where the finalists were re-measured,
        else the search's fastest. The verdict deploys it where ``best.deployed``; else
        :attr:`deploy` names the trial it keeps."""
        return Winner.of(self.summary) if self.summary.best is not None else None

    @property
    def winner(self) -> Winner | None:
        """The former name of :attr:`best`, kept: the best candidate, whether or not it is deployed."""
        return self.best

    @property
    def baseline(self) -> Baseline | None:
        """The default configuration's trial (None before it was evaluated)."""
        trial = self.summary.baseline
        if trial is None:
            return None
        feasible = trial.state is optuna.trial.TrialState.COMPLETE
        search = self.summary.baseline_search_value
        return Baseline(trial.number, dict(trial.params), self.summary.baseline_value, search, feasible)

    @property
    def deploy(self) -> DeployChoice | None:
        """The trial the study recommends deploying: the winner, or the baseline where the verdict
        keeps the default configuration (what :meth:`export` writes without ``trial``); None before
        any feasible trial."""
        return DeployChoice.of(self.summary)

    def disk_used(self) -> tuple[int, int, Path]:
        """The bytes and files the study's artifact store holds (its engines and data), and its folder."""
        from gpt_optuna.search.engines import disk_used
        from gpt_optuna.study.artifacts import artifact_folder

        folder = artifact_folder(self.study)
        return (*disk_used(folder), folder)

    def refresh(self) -> TunedStudy:
        """Read the study again (a search still running has added trials since); returns itself."""
        self.study = open_existing_study(self.storage, self.study_name)
        for cached in ("summary", "rows", "best"):
            self.__dict__.pop(cached, None)
        return self

    def __str__(self) -> str:
        return format_summary(self.summary)

    def __repr__(self) -> str:
        return f"<TunedStudy {self.study_name!r}: {self.headline}>"

    def _repr_html_(self) -> str:
        return f"<pre>{html.escape(str(self))}</pre>"

    @cached_property
    def rows(self) -> list[TrialRow]:
        """Every trial as the report shows it: status, search latency, error, metrics, reason."""
        return collect(self.study)

    def trials_dataframe(self) -> pandas.DataFrame:
        """One row per trial: its number, status, search latency, the accuracy metrics it recorded,
        its ``params_*`` (as Optuna names them), why it ended where it did, where it was measured,
        and which trials are the baseline, the one to deploy and the best candidate (``winner``, its
        former name: deployed only where ``deploy`` is true too) (needs pandas)."""
        try:
            import pandas
        except ImportError:
            raise UserError("trials_dataframe needs pandas: pip install pandas") from None
        winner = self.summary.best.number if self.summary.best is not None else None
        deploy = self.deploy.number if self.deploy is not None else None
        records = [
            {"number": r.number, "status": r.status, "latency_ms": r.latency_ms}
            | {"deploy": r.number == deploy, "winner": r.number == winner, "baseline": r.baseline}
            | {f"accuracy_{k}": v for k, v in r.accuracy.items()}
            | {f"params_{k}": v for k, v in r.params.items()}
            | {"reason": r.reason, "reused_from": r.reused_from, "measured_on": r.measured_on}
            for r in self.rows
        ]
        columns = [
            *("number", "status", "latency_ms", "deploy", "winner", "baseline"),
            *("reason", "reused_from", "measured_on"),
        ]
        return pandas.DataFrame.from_records(records, columns=None if records else columns, index="number")

    def error_axis(self, error: str | None = None) -> ErrorAxis:
        """The accuracy metric ``error`` names as the Pareto front is drawn against it (default:
        the first metric whose values differ between the feasible trials, the criterion's clauses
        before the output metrics)."""
        return error_axis(self.rows, criterion_of(self.study), error)

    def pareto_front(self, error: str | None = None) -> list[int]:
        """The trials on the Pareto front of search latency against ``error`` (an accuracy metric,
        as :meth:`error_axis` takes it), fastest first."""
        from gpt_optuna.results.rows import pareto_front

        return [r.number for r in pareto_front(self.rows, self.error_axis(error))]

    def pareto_figure(self, error: str | None = None) -> Any:
        """Latency against an accuracy metric (``error``: one of the criterion's clauses or the
        output metrics; default: the first metric that differs between the feasible trials), the
        Pareto front, infeasible trials by reason, every trial at its search latency, and the
        baseline, the best candidate and the trial to deploy marked on their points, the
        finalists' re-measured latencies beside them."""
        from gpt_optuna.results.figures import pareto_figure

        return pareto_figure(self.rows, self.error_axis(error), marks(self.summary))

    def history_figure(self) -> Any:
        """Each feasible trial's search latency and the best so far, the baseline, the best candidate
        and the trial to deploy marked on their own trials."""
        from gpt_optuna.results.figures import history_figure

        return history_figure(self.rows, marks(self.summary))

    def importance_figure(self) -> Any | None:
        """The importances for latency of the parameters that varied (None below 20 feasible trials)."""
        from gpt_optuna.results.figures import importance_figure

        return importance_figure(self.study)

    def build_figure(self) -> Any:
        """Build time against latency."""
        from gpt_optuna.results.figures import build_figure

        return build_figure(self.rows)

    def outcomes_figure(self) -> Any:
        """How many candidates were feasible, infeasible and failed, by reason."""
        from gpt_optuna.results.figures import outcomes_figure

        return outcomes_figure(self.rows)

    def report(self, path: str | Path, error: str | None = None) -> Path:
        """Write the HTML report (``gpt-optuna report``); ``error`` as for :meth:`pareto_figure`."""
        import shlex

        from gpt_optuna.results.report import render

        out = writable_file(Path(path))
        StudySources.of(self.study, self.storage).refuse([out], "the report")
        atomic_write(out, render(self.study, shlex.join(study_flags(self.storage, self.study_name)), error))
        return out

    def export(
        self,
        path: str | Path,
        *,
        trial: int | None = None,
        format: str = "file",
        force: bool = False,
        model_name: str | None = None,
    ) -> Exported:
        """Write a trial (default: :attr:`deploy`) as ``gpt-optuna export`` does: ``format="file"``,
        the engine or model with its JSON record beside it; ``"triton"``, a Triton model repository
        entry under ``path`` (``model_name``: default the model file's)."""
        return export(self.study, Path(path), trial, format, force, model_name, self.storage)

    def confirm(
        self,
        *,
        top: int = DEFAULT_TOP,
        processes: int = DEFAULT_PROCESSES,
        rounds: int = ROUNDS,
        timeout: str | float | None = None,
    ) -> TunedStudy:
        """Re-measure the ``top`` best candidates and the baseline interleaved in ``processes``
        fresh processes (``gpt-optuna confirm``), printing its progress and the summary; returns
        itself, read again. Ctrl-C (a notebook's interrupt) keeps the rounds measured so far, prints
        the summary and raises KeyboardInterrupt."""
        from gpt_optuna.remeasure.finalists import confirm, template_from_study
        from gpt_optuna.results.winner import record_winner
        from gpt_optuna.study.folder import StudyFolder

        if top < 1 or processes < 1 or rounds < 3:
            raise UserError("--top and --processes must be at least 1, --rounds at least 3")
        deadline = time.monotonic() + parse_duration(timeout) if timeout else None
        study = open_existing_study(self.storage, self.study_name, writable=True)
        finalists, fresh = counted(top, "best candidate"), counted(processes, "process", "processes")
        tell(f"re-measuring the {finalists} and the baseline in {fresh} ...")
        try:
            with interrupts.handled():
                found = confirm(
                    study, template_from_study(study), StudyFolder.of(study).log("confirm"), top, processes, tell,
                    deadline=deadline, rounds=rounds,
                )  # fmt: skip
        except KeyboardInterrupt:
            tell(format_summary(record_winner(study)), RESULT)
            interrupts.stop_caller("the re-measurement", "what it measured is kept")
        if found is None:
            raise UserError(f"study {self.study_name} has no measured baseline and feasible candidate to confirm")
        tell(format_summary(record_winner(study)), RESULT)
        return self.refresh()

    def dashboard(self) -> TunedStudy:
        """Write the winner's figure and notes for optuna-dashboard into a study decided before it
        was installed (``gpt-optuna dashboard``); returns itself, read again. A user error where
        optuna-dashboard is not installed or there is no winner yet."""
        from gpt_optuna.results.winner import write_dashboard

        write_dashboard(open_existing_study(self.storage, self.study_name, writable=True))
        return self.refresh()

    def compare(
        self,
        a: str | int,
        b: str | int,
        *,
        processes: int = DEFAULT_PROCESSES,
        rounds: int = ROUNDS,
        timeout: str | float | None = None,
        progress: bool = True,
    ) -> Comparison:
        """Time ``a`` and ``b`` (trial numbers, ``"baseline"``, ``"yours"`` or ONNX model paths) on
        the study's inputs, interleaved in fresh processes (``gpt-optuna compare``); the verdict is
        B's speedup over A, beside each one's outputs against the study's reference."""
        from gpt_optuna.usecases.compare import compare

        timeout_s = parse_duration(timeout) if timeout else None
        with interrupts.handled():
            return compare(self.study, str(a), str(b), processes, rounds, timeout_s, _teller(progress))

    def profile(
        self,
        trial: str | int | None = None,
        *,
        runs: int = DEFAULT_PROFILE_RUNS,
        rounds: int = DEFAULT_PROFILE_ROUNDS,
        progress: bool = True,
    ) -> Profile:
        """Where ``trial``'s time goes (default: :attr:`deploy`'s), operator by operator, beside the
        baseline's, by the engine's own profiler, in ``rounds`` rounds of fresh processes
        (``gpt-optuna profile``)."""
        from gpt_optuna.usecases.profile import profile

        return profile(self.study, None if trial is None else str(trial), runs, _teller(progress), rounds)

    def check(
        self,
        model: str | Path,
        *,
        budget: str | float = DEFAULT_CHECK_BUDGET,
        tolerance: str | float = DEFAULT_TOLERANCE,
        config: str | Path | None = None,
        progress: bool = True,
    ) -> CheckResult:
        """Check a (changed) model against what this study recommends deploying, as ``gpt-optuna
        check`` does against an export's record: :attr:`deploy` is exported with its record into
        ``checks/`` in the study's folder, and :func:`gpt_optuna.check` runs with the options."""
        from gpt_optuna.study.folder import StudyFolder
        from gpt_optuna.usecases.check import check

        folder = StudyFolder.of(self.study).check_run(time.strftime("%Y%m%d-%H%M%S"))
        folder.mkdir(parents=True, exist_ok=True)
        exported = self.export(folder / "record", force=True)
        return check(model, exported.record, budget=budget, tolerance=tolerance, config=config, progress=progress)
