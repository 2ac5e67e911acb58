"""``gpt-optuna check``: a CI gate that keeps a model as fast and as accurate as its record.

The record is what ``gpt-optuna export`` wrote (``FILE.json`` with ``FILE.inputs.npz`` and
``FILE.reference.npz`` beside it). The check first runs the (possibly changed) model in fp32 on
the recorded inputs and judges its outputs against the recorded ones with the recorded criterion:
changed outputs fail it. Then it measures the engine's defaults and the recorded configuration
on the changed model; where the record's exported model is beside it, that is all the search the
gate needs, and the rest of ``--budget`` goes to the comparison below (with ``--update``, half of
it searches on for a faster configuration to record); without it, the search goes on within
``--budget``.

Latency is judged on this host, never against another host's absolute figure where that can be
avoided: where the record's exported model is beside it (ONNX Runtime), it is timed interleaved
with the changed model under the recorded configuration (and the search's fastest, where that is
another), in fresh processes, by the confirmation's protocol; the
changed model regresses where the interval of its slowdown lies beyond the tolerance, passes where
it lies within, and the check is **inconclusive** (exit 5) where it
straddles the tolerance: a noisy runner is never turned into a pass or a fail. Without the
exported model the recorded latency is the reference, and every confirmation process must agree.
``--budget`` bounds the whole command. The record is read by :mod:`check_record`, each aspect
judged by :mod:`check_outcome`.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from optuna.trial import TrialState

from gpt_optuna.backends.side_file import SideFile
from gpt_optuna.core import interrupts
from gpt_optuna.core.errors import UserError
from gpt_optuna.core.files import writable_file
from gpt_optuna.core.log import RESULT, tell
from gpt_optuna.core.words import counted
from gpt_optuna.graph import model as model_io
from gpt_optuna.protocol.accuracy import Criterion
from gpt_optuna.protocol.jobs import EvaluateJob, MetricJob, reference_outputs
from gpt_optuna.protocol.timing import BLOCK
from gpt_optuna.remeasure.finalists import (
    CPU_SETTLE_S,
    ConfirmationFailed,
    confirm,
    interleave,
    kept_evaluations,
    process_seconds,
    quiet_seconds,
    round_seconds,
    template_from_study,
)
from gpt_optuna.results.export import export_trial
from gpt_optuna.search.config import FinalistPlan, TuneConfig, check_study_name, default_storage, read_toml, study_flags
from gpt_optuna.search.options import DEFAULT_CHECK_BUDGET, DEFAULT_TOLERANCE, parse_duration, parse_tolerance
from gpt_optuna.study.evidence import speedups
from gpt_optuna.study.folder import StudyFolder
from gpt_optuna.study.record import STUDIES
from gpt_optuna.study.summary import finished_count, summarize_study
from gpt_optuna.study.taxonomy import baseline_trial, search_ranking
from gpt_optuna.study.trial_record import TrialRecord
from gpt_optuna.usecases.check_outcome import (
    CheckResult,
    Outcome,
    compare_absolute,
    compare_on_this_host,
    exit_code,
    write_junit,
)
from gpt_optuna.usecases.check_record import exported_model, load_record, read_samples, recorded_latency, shape_flags
from gpt_optuna.usecases.compare import as_recorded

COMPARISON_SHARE = 0.5
"""Of ``--budget``, the share kept for timing the record's model beside the changed one where
``--update`` searches for a faster configuration (with whatever the search leaves unused)."""
GATE_ROUNDS = 30
"""Interleaved rounds each of the comparison's processes is asked for at least: each takes as many
as its share of the budget left allows (:func:`gate_rounds`; three at least), since on a busy
runner a process's ratio needs many rounds to settle."""


def check(
    model: str | Path,
    record: str | Path,
    *,
    budget: str | float = DEFAULT_CHECK_BUDGET,
    tolerance: str | float = DEFAULT_TOLERANCE,
    config: str | Path | None = None,
    junit: str | Path | None = None,
    update: bool = False,
    progress: bool = True,
    metric: str | None = None,
) -> CheckResult:
    """``gpt-optuna check``: keep ``model`` as fast and as accurate as ``record`` (the JSON side file
    an export wrote), within ``budget`` (a duration or seconds) and ``tolerance`` (``"5%"`` or
    0.05). ``config``: a tune.toml whose [measure] and [space] tables, trial_timeout,
    confirm_processes, confirm_top, sampler and seed apply; ``junit``: a JUnit XML report to
    write; ``update``: rewrite the record where the model is found faster; ``metric``: the
    record's metric function from elsewhere (``script.py:function`` or ``module:function``).
    Ctrl-C stops it with KeyboardInterrupt."""
    with interrupts.handled():
        result = gate(
            model,
            record,
            budget,
            tolerance,
            config=config,
            junit=junit,
            update=update,
            progress=progress,
            metric=metric,
        )
    if result.code > 128:  # stopped by a signal: so is the caller
        interrupts.stop_caller("the check")
    return result


def gate(
    model: str | Path,
    record: str | Path,
    budget: str | float,
    tolerance: str | float,
    config: str | Path | None,
    junit: str | Path | None,
    update: bool,
    progress: bool,
    metric: str | None = None,
) -> CheckResult:
    """:func:`check` as the command line runs it: a signal ends it with its exit code."""
    allowed = ("measure", "space", "trial_timeout_s", "confirm_processes", "confirm_top", "sampler", "seed")
    base = {k: v for k, v in (read_toml(Path(config)) if config else {}).items() if k in allowed}
    report = writable_file(Path(junit)) if junit else None
    if report is not None and report.resolve() in (Path(model).resolve(), Path(record).resolve()):
        raise UserError(f"--junit {report} would overwrite the file it checks: choose another path")
    share = parse_tolerance(tolerance)
    budget_s = parse_duration(budget)
    return run_check(Path(model), Path(record), budget_s, share, base, report, update, not progress, metric)


def outputs_unchanged(model: Path, record: SideFile, criterion: Criterion, deadline: float) -> Outcome:
    """The model in fp32 on the recorded inputs, judged against the recorded outputs (the record's
    metric function stopped at ``deadline``, the end of --budget)."""
    info = model_io.load_model_info(model)
    inputs, references = read_samples(record, info)
    metric_spec = record.metric
    outputs = reference_outputs(info, inputs)
    user = None
    if metric_spec:
        from gpt_optuna.usecases.preparation import UserCode

        job = MetricJob(metric_spec, outputs, references, inputs, "recorded --metric")
        user = lambda: UserCode(deadline, tell, "--budget").metric(job)  # noqa: E731  (a failure: one line, exit 2)
    verdict = criterion.evaluate(outputs, references, user)
    if verdict.feasible:
        return Outcome("accuracy", True, f"the model's outputs meet {criterion.text} against the record")
    return Outcome("accuracy", False, f"accuracy regression: the model's outputs changed: {verdict.reason}")


def your_configuration(record: SideFile) -> dict[str, Any]:
    """The TuneConfig fields that measure the user's own configuration the record carries (the
    export of a study tuned with ``--baseline-config``) beside the check's; none without one."""
    yours = record.your_configuration
    if not isinstance(yours, dict) or not isinstance(yours.get("params"), dict):
        return {}
    return {"baseline_config": Path(str(yours.get("file") or "your configuration")), "baseline_values": yours["params"]}


def still_to_measure(study: Any) -> int:
    """How many trials must still run for the baseline and the recorded configuration to be
    measured (a budget spent on the preparation can leave them waiting): the waiting trials up to
    the last of them, since waiting trials run in order."""
    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    last = max((t.number for t in waiting if TrialRecord(t).baseline or TrialRecord(t).seeded), default=None)
    return 0 if last is None else sum(1 for t in waiting if t.number <= last)


def run_check(
    model: Path,
    record_path: Path,
    budget_s: float,
    tolerance: float,
    base: dict[str, Any],
    junit: Path | None = None,
    update: bool = False,
    quiet: bool = False,
    metric: str | None = None,
) -> CheckResult:
    """The whole check within ``budget_s``, each outcome printed as one line (``metric``: check
    --metric, in place of the record's)."""
    from gpt_optuna.results.summary_text import stability_warning, versus_yours
    from gpt_optuna.study.storage import load_study, open_storage
    from gpt_optuna.usecases.progress import Progress
    from gpt_optuna.usecases.tune import tune

    started = time.monotonic()
    deadline = started + budget_s
    record, criterion = load_record(record_path, metric)
    exported, why_not = exported_model(record_path, record)
    outcomes = [outputs_unchanged(model, record, criterion, deadline)]
    study_name = None
    if outcomes[0].passed:
        name = study_name = check_study_name(model)
        gated = exported is not None and not update  # the comparison alone decides: search no further
        kept = COMPARISON_SHARE * budget_s if exported is not None and update else 0.0
        if gated:
            tell(
                "measuring the engine's defaults and the recorded configuration on the changed model; the rest of"
                " --budget times it beside the record's model (--update searches for a faster configuration)"
            )
        config = _check_config(model, record, base, name, max(deadline - kept - time.monotonic(), 1.0), gated, exported)
        progress = Progress(enabled=not quiet)
        code = tune(config, progress).code
        study = load_study(open_storage(config.storage, create=False), name)
        more = still_to_measure(study)
        left = deadline - kept - time.monotonic()
        if more and code <= 128 and left > 1.0:
            tell("the budget ended before the baseline and the recorded configuration were measured: measuring them")
            extra = replace(config, timeout_s=left, n_trials=finished_count(study) + more)
            code = tune(extra, progress).code
            study = load_study(open_storage(config.storage, create=False), name)
        if code > 128:  # stopped by Ctrl-C, SIGTERM or SIGHUP
            return CheckResult(code, tuple(outcomes), study_name)
        latency, summary = judge_latency(
            study, config.finalists, record, record_path, exported, why_not, tolerance, deadline
        )
        outcomes.append(_recorded_where_better(latency, study, record_path, update))
        if summary is not None:
            against = versus_yours(summary).removeprefix("; ")
            if against:
                tell(f"against your configuration: {against}", RESULT)
            for line in (*(f"warning: {w}" for w in summary.host_warnings), stability_warning(summary)):
                if line:
                    tell(line, RESULT)
    if junit is not None:
        write_junit(junit, outcomes, time.monotonic() - started)
    for outcome in outcomes:
        tell(f"{outcome.word}: {outcome.message}", RESULT)
    if study_name is not None:
        page = f"{STUDIES / study_name}.html"
        where = shlex.join([*study_flags(default_storage(study_name), study_name), "-o", page])
        tell(f"the check's own study, for a closer look (its page beside it): gpt-optuna report {where}", RESULT)
    return CheckResult(exit_code(outcomes), tuple(outcomes), study_name)


def _check_config(
    model: Path,
    record: SideFile,
    base: dict[str, Any],
    name: str,
    timeout_s: float,
    gated: bool,
    exported: Path | None,
) -> TuneConfig:
    """The search a check runs on ``model``: the record's engine, criterion, samples and shapes, its
    configuration tried first (``gated``: and the engine's defaults alone, the comparison deciding)."""
    yours = your_configuration(record)
    return TuneConfig(
        **base,
        model=model,
        backend=record.backend,
        accuracy=record.accuracy_criterion,
        metric=record.metric,
        inputs=(record.samples or {})["inputs"],
        shapes=shape_flags(record),
        timeout_s=timeout_s,
        n_trials=2 + bool(yours) if gated else None,  # the defaults, the record's, yours
        confirm_top=0 if exported is not None else base.get("confirm_top", 5),  # the comparison confirms
        study_name=name,
        seeds=[(record.params, "the recorded configuration")],
        **yours,
        no_seeds=True,  # the recorded configuration is the one to try first
        allow_io_change=bool((record.interface or {}).get("allow_io_change")),
    )


def _recorded_where_better(latency: Outcome, study: Any, record_path: Path, update: bool) -> Outcome:
    """The latency outcome; where the check found a faster configuration, written over the record
    (``update``) or said how to."""
    if latency.better and update:
        export_trial(study, latency.trial, record_path.with_name(record_path.name.removesuffix(".json")), True)
        return replace(latency, message=latency.message + "; the record is updated")
    if latency.better:
        return replace(latency, message=latency.message + "; --update records it")
    return latency


def judge_latency(
    study: Any,
    finalists: FinalistPlan,
    record: SideFile,
    record_path: Path,
    exported: Path | None,
    why_not: str,
    tolerance: float,
    deadline: float,
) -> tuple[Outcome, Any]:
    """The latency aspect of the check, from its study (confirmed within the budget where the
    search left it unconfirmed), and the study's summary (None where the recorded configuration
    was never measured)."""
    seeded = seeded_trial(study)
    if seeded is not None and seeded.state == TrialState.PRUNED:
        tried = TrialRecord(seeded)
        reason = tried.infeasible or tried.failure or ""
        return Outcome("accuracy", False, f"accuracy regression: the recorded configuration fails: {reason}"), None
    summary = summarize_study(study)
    if seeded is None or seeded.state != TrialState.COMPLETE:
        return Outcome(
            "latency",
            False,
            "latency not decided: the budget ended before the recorded configuration was measured; give more --budget",
            inconclusive=True,
        ), summary
    template = template_from_study(study)
    if exported is None:
        if summary.confirmed is None and deadline - time.monotonic() > 1.0:
            summary = confirmed_summary(study, template, finalists, deadline)
        tell(f"note: {why_not}: the latency is judged against the recorded figure")
        return compare_absolute(recorded_latency(record), summary, tolerance), summary
    best = search_ranking(list(study.get_trials(deepcopy=False)))[0]  # the search's fastest, timed beside them
    winner = best if best.number != seeded.number and best.values[0] < (seeded.values or [float("inf")])[0] else None
    trials = [seeded, *([winner] if winner is not None else [])]
    timed = [seeded, *trials]  # the record's model first, as costly as the recorded configuration
    exported_job = as_recorded(template, model_io.load_model_info(exported), record.params)
    evaluations = [exported_job, *kept_evaluations(template, study, trials, tell)]
    tell(
        f"timing the record's model {exported.name} beside the changed model, interleaved, in"
        f" {finalists.processes} fresh processes ..."
    )
    try:
        measured = interleave(
            evaluations,
            StudyFolder(finalists.folder).log("compare"),
            finalists.processes,
            tell,
            process_seconds(timed, template.settings),
            quiet_seconds(timed, template.settings),
            deadline=deadline,
            rounds=gate_rounds(timed, finalists.processes, deadline - time.monotonic()),
        )
    except ConfirmationFailed as failure:
        said = f"latency not decided: the models could not be timed ({failure.reason}); give more --budget"
        return Outcome("latency", False, said, inconclusive=True), summary
    gate = speedups(measured.medians[:, :2], measured.processes)  # the question the gate answers, alone
    other = speedups(measured.medians[:, [0, 2]], measured.processes)[1:] if winner is not None else []
    faster = None if winner is None else winner.number
    return compare_on_this_host([*gate, *other], tolerance, seeded.number, faster), summary


def confirmed_summary(study: Any, template: EvaluateJob, finalists: FinalistPlan, deadline: float) -> Any:
    """The study's summary once its finalists and baseline are re-measured within ``deadline``
    (a re-measurement that fails is said and leaves the search's figures)."""
    from gpt_optuna.results.winner import record_winner

    tell(f"re-measuring the finalists and the baseline in {counted(finalists.processes, 'process', 'processes')} ...")
    try:
        log = StudyFolder(finalists.folder).log("confirm")
        confirm(study, template, log, finalists.top, finalists.processes, deadline=deadline)
    except ConfirmationFailed as failure:
        tell(f"note: {failure}")
    return record_winner(study)


def gate_rounds(timed: list[Any], processes: int, left_s: float) -> int:
    """The rounds each of the comparison's ``processes`` is asked for: as many as its share of the
    ``left_s`` seconds holds by the search latencies of the ``timed`` trials (each one ``BLOCK``
    launches a round, twice over for the timer's own work; on the CPU, the pause before each),
    :data:`GATE_ROUNDS` at least; a process still ends its rounds when its share of the time does."""
    round_s = round_seconds(timed, BLOCK)
    if all(TrialRecord(t).gpu == "cpu" for t in timed):
        round_s += len(timed) * CPU_SETTLE_S
    return max(GATE_ROUNDS, int(left_s / max(processes, 1) / round_s) if round_s > 0 else GATE_ROUNDS)


def seeded_trial(study: Any) -> Any:
    """The trial of the recorded configuration (its latest try holding a result; the baseline's
    where the recorded configuration is the engine's defaults, which is never queued twice), or None."""
    trials = study.get_trials(deepcopy=False)
    queued = [t for t in trials if TrialRecord(t).seeded]
    if not queued:
        return baseline_trial(trials)
    tried = [t for t in queued if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    return tried[-1] if tried else None
