"""``gpt_optuna.tune``: the search ``gpt-optuna tune`` runs, from Python, returning the study read back.

Every keyword is the flag of the same name (``timeout`` and ``trial_timeout`` take a duration or
seconds); one left out (None) keeps the value of ``config``'s tune.toml, else the default. The
candidates are built and timed in worker processes, as on the command line: a crash, hang or
timeout ends a trial, never the caller's Python.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import optuna

from gpt_optuna.api.study import TunedStudy, load, storage_url
from gpt_optuna.core import interrupts
from gpt_optuna.core.errors import UserError
from gpt_optuna.search.config import TuneConfig, absolute_storage, config_from, measure_settings, read_toml
from gpt_optuna.search.options import OPTIONS, Option, parse_duration
from gpt_optuna.usecases.progress import Progress, in_notebook
from gpt_optuna.usecases.tune import TuneEnd
from gpt_optuna.usecases.tune import tune as run_search


def tune(
    model: str | Path,
    *,
    inputs: str | Path | None = None,
    accuracy: str | None = None,
    backend: str | None = None,
    n_trials: int | None = None,
    timeout: str | float | None = None,
    storage: str | Path | None = None,
    study_name: str | None = None,
    space: dict[str, Any] | None = None,
    config: str | Path | None = None,
    metric: str | None = None,
    samples: int | None = None,
    calibration: str | Path | None = None,
    shapes: dict[str, str] | Sequence[str] | None = None,
    sampler: str | None = None,
    seed: int | None = None,
    objectives: str | Sequence[str] | None = None,
    measure: dict[str, Any] | None = None,
    trial_timeout: str | float | None = None,
    confirm_top: int | None = None,
    confirm_processes: int | None = None,
    workers: int | None = None,
    gpus: str | None = None,
    artifacts: str | Path | None = None,
    allow_mixed_gpus: bool | None = None,
    no_seeds: bool | None = None,
    keep_all_engines: bool | None = None,
    warm_start: str | None = None,
    allow_io_change: bool | None = None,
    dry_run: bool | None = None,
    baseline_config: str | Path | None = None,
    progress: bool = True,
) -> TunedStudy:
    """Run or resume a search for the fastest configuration of ``model`` that meets ``accuracy``,
    re-measure the finalists, print the summary, and return the study as :func:`gpt_optuna.load`
    reads it. ``storage`` is a URL or an SQLite file's path (default ``studies/<study_name>.db``);
    ``space`` is tune.toml's [space] table and ``measure`` its [measure] table, as dicts; ``shapes``
    maps input names to dims (``{"x": "1x3x224x224"}``). ``progress``: a bar (a widget in a
    notebook with ipywidgets) and a line per note.

    Interrupted (Ctrl-C, a notebook's interrupt), the running trials are marked and queued again,
    the summary is printed and KeyboardInterrupt is raised: the same call resumes the study.
    Raises :class:`gpt_optuna.UserError` for what cannot run (a bad model, criterion or option),
    before anything is written.
    """
    given = config_values(dict(locals()))
    values = read_toml(Path(config)) if config is not None else {}
    tune_config = config_from(values | given)
    shown = Progress(enabled=progress, widgets=progress and in_notebook())
    try:
        with interrupts.handled():
            end = run_tune(tune_config, shown)
    except KeyboardInterrupt:  # before the search began: nothing to summarize
        interrupts.stop_caller("the search", "the same call starts it")
    assert end.config.storage is not None and end.config.study_name is not None
    where = f"gpt_optuna.load({absolute_storage(end.config.storage)!r}, {end.config.study_name!r})"
    shown.finish(end.summary, python_steps(end, where), end.note, end.took)
    if end.reconfirm:
        then = f"the search is complete: {where}.confirm() re-measures the finalists"
        interrupts.stop_caller("the finalists' re-measurement", then)
    if end.stopped_by is not None:
        interrupts.stop_caller("the search", "the same call resumes it")
    return load(end.config.storage, end.config.study_name)


KEYWORDS = {"shape": "shapes"}
"""The keyword of a tune option (:data:`~gpt_optuna.search.options.OPTIONS`) where it is not the option's name."""
TABLES = ("space", "measure")
"""Keywords of tune.toml's tables, which no flag sets."""


def keyword_of(option: Option) -> str:
    """The :func:`tune` keyword that sets ``option``."""
    return KEYWORDS.get(option.dest, option.dest)


def config_values(given: dict[str, Any]) -> dict[str, Any]:
    """The TuneConfig fields the keywords ``given`` set (None: left out), each read as its flag is;
    ``storage`` may also be an SQLite file's path, ``shapes`` a dict and ``objectives`` a list."""
    readers: dict[str, Callable[[Any], Any]] = {
        "shape": _shape_flags,
        "storage": storage_url,
        "objectives": lambda value: value if isinstance(value, str) else tuple(value),
        "timeout": parse_duration,
        "trial_timeout": parse_duration,
    }
    values = {
        option.field: readers.get(option.dest, option.kind.from_flag)(given[keyword_of(option)])
        for option in OPTIONS
        if option.field and given[keyword_of(option)] is not None
    }
    if given["space"] is not None:
        values["space"] = dict(given["space"])
    if given["measure"] is not None:
        values["measure"] = measure_settings("measure", given["measure"])
    return values


def _shape_flags(shapes: dict[str, str] | Sequence[str]) -> list[str]:
    """``{"x": "1x3x224x224"}`` (or ``["x:1x3x224x224"]``) as the ``--shape`` flags' values."""
    if isinstance(shapes, str):
        raise UserError('shapes: give a dict such as {"x": "1x3x224x224"}, or a list of "x:1x3x224x224"')
    if isinstance(shapes, dict):
        return [f"{name}:{dims}" for name, dims in shapes.items()]
    return list(shapes)


def run_tune(config: TuneConfig, progress: Progress) -> TuneEnd:
    """The search ``config`` asks for, as :func:`tune` and ``gpt-optuna tune`` run it (``progress``
    closed when it ends, Optuna's log level as it was before: the search quiets Optuna, its
    progress is ours); how it ended, for the caller to tell."""
    verbosity = optuna.logging.get_verbosity()
    try:
        return run_search(config, progress)
    finally:
        optuna.logging.set_verbosity(verbosity)


def python_steps(end: TuneEnd, where: str) -> list[str]:
    """What is worth doing next (:meth:`TuneEnd.advice`), as Python calls on the returned study
    (``where``: the call that opens it, where a signal stopped the run and nothing is returned)."""
    advice = end.advice()
    steps = [f"the study: study = {where}"] if end.stopped_by is not None else []
    if advice.resume:
        steps.append("resume with: the same gpt_optuna.tune(...) call")
    if advice.extend:
        steps.append("extend with: the same gpt_optuna.tune(...) call with a larger n_trials")
    if advice.confirm:
        steps.append("confirm the finalists: study.confirm()")
    if advice.remeasure_processes is not None:
        steps.append(f"re-measure on a quiet host: study.confirm(processes={advice.remeasure_processes})")
    if advice.remeasure_rounds is not None:
        steps.append(f"re-measure with more rounds: study.confirm(rounds={advice.remeasure_rounds})")
    steps.append('report: study.report("report.html")')
    if advice.export:
        steps.append('export the winner: study.export("best")')
    return steps
