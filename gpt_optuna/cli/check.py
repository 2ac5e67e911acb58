"""``gpt-optuna check``: a CI gate that keeps a model as fast and as accurate as its record.

The record is what ``gpt-optuna export`` wrote (``FILE.json`` with ``FILE.inputs.npz`` and
``FILE.reference.npz`` beside it). The check first runs the (possibly changed) model in fp32 on
the recorded inputs and judges its outputs against the recorded ones with the recorded criterion:
changed outputs fail it. Then it searches within a time budget, starting from the recorded
configuration (tried right after the engine's defaults), confirms the finalists against the
defaults in fresh processes, and compares the winner with the recorded latency. Latency regresses
when every confirmation process measured the winner slower than the record by more than the
tolerance; it improves when every process measured it faster by more than the tolerance.
"""

from __future__ import annotations

import json
import shlex
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpt_optuna.backends.base import read_record
from gpt_optuna.core.errors import EXIT_NO_FEASIBLE, EXIT_REGRESSION, UserError
from gpt_optuna.evaluation.accuracy import parse_criterion
from gpt_optuna.graph import feeds as feeds_io
from gpt_optuna.graph import model as model_io
from gpt_optuna.search.config import TuneConfig, default_storage, study_flags


@dataclass(frozen=True)
class Outcome:
    """One aspect of the check: passed or not, and one line that says why."""

    name: str
    passed: bool
    message: str
    better: bool = False


def _malformed(path: Path, what: str) -> UserError:
    return UserError(f"{path} is not a record gpt-optuna export writes: {what}; export the study again")


def load_record(path: Path) -> dict[str, Any]:
    """The export's side file, checked field by field (each problem one line, a user error), with
    the paths of its sample files resolved beside it."""
    if path.suffix != ".json":
        raise UserError(f"--baseline takes the record FILE.json that gpt-optuna export -o FILE wrote, not {path}")
    record = read_record(path.with_suffix(""))
    if not isinstance(record, dict):
        raise _malformed(path, f"it holds {json.dumps(record)[:40]}, not an object")
    for key, kinds, what in _FIELDS:
        if (
            key not in record
            or not isinstance(record[key], kinds)
            or isinstance(record[key], bool)
            and bool not in kinds
        ):
            raise _malformed(path, f"{key} must be {what}, got {json.dumps(record.get(key))[:80]}")
    if record.get("latency_ms") is None:
        raise UserError(f"{path} has no latency (a dry-run study?): export a measured trial")
    if not record["latency_ms"] > 0:
        raise _malformed(path, f"latency_ms must be positive, got {record['latency_ms']}")
    params = record["params"]
    if not all(isinstance(v, str | int | float | bool) or v is None for v in params.values()):
        raise _malformed(path, "params must map knob names to plain values")
    samples = record["samples"]
    if set(samples) != {"inputs", "reference"} or not all(isinstance(v, str) for v in samples.values()):
        raise _malformed(path, 'samples must be {"inputs": FILE, "reference": FILE}')
    for kind, name in samples.items():
        samples[kind] = path.parent / name
        if not samples[kind].is_file():
            raise UserError(f"{path} needs {samples[kind]} beside it (written by the same export)")
    try:
        parse_criterion(record["accuracy_criterion"], user_metrics=record.get("metric") is not None)
    except UserError as exc:
        raise _malformed(path, f"accuracy_criterion: {exc}") from None
    return record


_FIELDS: tuple[tuple[str, tuple[type, ...], str], ...] = (
    ("backend", (str,), "an engine name"),
    ("params", (dict,), "an object of knob values"),
    ("accuracy_criterion", (str,), "a criterion such as cosine>=0.9999"),
    ("samples", (dict,), "an object naming the sample files"),
    ("latency_ms", (int, float, type(None)), "a number of milliseconds"),
    ("shapes", (dict, type(None)), "an object of input shape ranges"),
    ("metric", (str, type(None)), "module:function"),
    ("interface", (dict, type(None)), "an object describing the inputs and outputs"),
)
"""The record's fields a check reads: name, accepted types, what they must be."""


def recorded_latency(record: dict[str, Any]) -> float:
    """The record's latency: the one its study judged its winner by (confirmed where it was confirmed)."""
    if "measurement" not in record and isinstance(record.get("confirmed"), dict):  # exported before it said which
        return float(record["confirmed"]["median_ms"])
    return float(record["latency_ms"])


def read_samples(record: dict[str, Any], info: model_io.ModelInfo) -> tuple[list[model_io.Feeds], list[model_io.Feeds]]:
    """The recorded inputs and reference outputs, checked against the model's inputs and outputs."""
    loaded = []
    for kind in ("inputs", "reference"):
        try:
            loaded.append(feeds_io.read_npz(record["samples"][kind]))
        except Exception as exc:  # a truncated or foreign file
            raise UserError(f"cannot read the record's {record['samples'][kind]}: {exc}") from None
    inputs, references = loaded
    for kind, arrays, specs in (("inputs", inputs, info.inputs), ("outputs", references, info.outputs)):
        names = sorted(spec.name for spec in specs)
        if sorted(arrays) != names:
            raise UserError(
                f"the record's {kind} ({', '.join(sorted(arrays))}) are not the model's ({', '.join(names)}):"
                " check the model against its own record"
            )
    return feeds_io.unstack(inputs), feeds_io.unstack(references)


def outputs_unchanged(model: Path, record: dict[str, Any]) -> Outcome:
    """The model in fp32 on the recorded inputs, judged against the recorded outputs."""
    info = model_io.load_model_info(model)
    inputs, references = read_samples(record, info)
    metric_spec = record.get("metric")
    criterion = parse_criterion(record["accuracy_criterion"], user_metrics=metric_spec is not None)
    outputs = [feeds_io.reference_outputs(info, feeds) for feeds in inputs]
    user = None
    if metric_spec:
        from gpt_optuna.search.preparation import call_metric

        function = feeds_io.load_function(metric_spec, "the record's metric")
        user = lambda: call_metric(function, outputs, references, inputs)  # noqa: E731  (a failure: one line, exit 2)
    verdict = criterion.evaluate(outputs, references, user)
    if verdict.feasible:
        return Outcome("accuracy", True, f"the model's outputs meet {criterion.text} against the record")
    return Outcome("accuracy", False, f"accuracy regression: the model's outputs changed: {verdict.reason}")


def shape_flags(record: dict[str, Any]) -> list[str]:
    return [
        f"{name}:" + "/".join("x".join(str(d) for d in dims) for dims in ranges)
        for name, ranges in (record.get("shapes") or {}).items()
    ]


def compare_latency(record_ms: float, summary: Any, tolerance: float) -> Outcome:
    """The winner's latency, as its study states it, against the record; a regression or an
    improvement only where every confirmation process agrees."""
    winner = summary.winner
    median = winner.latency_ms
    measured = list(winner.process_ms) or [median]
    low, high = min(measured), max(measured)
    which = f" ({winner.measurement}; processes {low:.4g}-{high:.4g} ms)" if len(measured) > 1 else ""
    which = which or f" ({winner.measurement})"
    change = 100 * (median / record_ms - 1)
    said = f"trial {summary.best.number}: {median:.4g} ms{which} against the recorded {record_ms:.4g} ms"
    if low > record_ms * (1 + tolerance):
        return Outcome("latency", False, f"latency regression: {said}, {change:+.1f} % beyond {tolerance:.0%}")
    if high < record_ms * (1 - tolerance):
        return Outcome("latency", True, f"faster than the record: {said}, {change:+.1f} %", better=True)
    return Outcome("latency", True, f"latency within {tolerance:.0%}: {said}, {change:+.1f} %")


def still_to_measure(study: Any) -> int:
    """How many trials must still run for the baseline and the recorded configuration to be
    measured (a budget spent on the preparation can leave them waiting): the waiting trials up to
    the last of them, since waiting trials run in order."""
    from optuna.trial import TrialState

    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    needed = [t.number for t in waiting if t.user_attrs.get("baseline") or t.user_attrs.get("seeded")]
    return sum(1 for t in waiting if t.number <= max(needed)) if needed else 0


def seeded_failure(study: Any) -> Outcome | None:
    """The recorded configuration's own verdict: it must still meet the criterion."""
    from optuna.trial import TrialState

    for trial in study.get_trials(deepcopy=False):
        if trial.user_attrs.get("seeded") and trial.state is TrialState.PRUNED:
            reason = trial.user_attrs.get("infeasible") or trial.user_attrs.get("failure", "")
            return Outcome("accuracy", False, f"accuracy regression: the recorded configuration fails: {reason}")
    return None


def write_junit(path: Path, outcomes: list[Outcome], seconds: float) -> None:
    """A JUnit XML report: one test case per aspect, a <failure> for each that failed."""
    failures = sum(not o.passed for o in outcomes)
    suite = ET.Element(
        "testsuite", name="gpt-optuna check", tests=str(len(outcomes)), failures=str(failures), time=f"{seconds:.1f}"
    )
    for outcome in outcomes:
        case = ET.SubElement(suite, "testcase", classname="gpt-optuna.check", name=outcome.name)
        if outcome.passed:
            ET.SubElement(case, "system-out").text = outcome.message
        else:
            ET.SubElement(case, "failure", message=outcome.message, type="regression").text = outcome.message
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)


def run_check(
    model: Path,
    record_path: Path,
    budget_s: float,
    tolerance: float,
    base: dict[str, Any],
    junit: Path | None = None,
    update: bool = False,
    quiet: bool = False,
) -> int:
    """The whole check; returns the exit code (0 pass, 1 regression, 130 interrupted)."""
    from gpt_optuna.results.winner import record_winner
    from gpt_optuna.search.progress import Progress
    from gpt_optuna.search.tune import tune
    from gpt_optuna.study.storage import load_study, open_storage
    from gpt_optuna.study.summary import finished_count, summarize_study

    started = time.monotonic()
    record = load_record(record_path)
    record_ms = recorded_latency(record)
    outcomes = [outputs_unchanged(model, record)]
    study_name = None
    if outcomes[0].passed:
        name = study_name = f"check-{model.stem}-{time.strftime('%Y%m%d-%H%M%S')}"
        config = TuneConfig(
            **base,
            model=model,
            backend=record["backend"],
            accuracy=record["accuracy_criterion"],
            metric=record.get("metric"),
            inputs=record["samples"]["inputs"],
            shapes=shape_flags(record),
            timeout_s=budget_s,
            study_name=name,
            seeds=[(record["params"], "the recorded configuration")],
            no_seeds=True,  # the recorded configuration is the one to try first
            allow_io_change=bool((record.get("interface") or {}).get("allow_io_change")),
        )
        code = tune(config, Progress(enabled=not quiet), argv=[], summarize=False)
        study = load_study(open_storage(config.storage, create=False), name)
        more = still_to_measure(study)
        if more and code <= 128:
            print("the budget ended before the baseline and the recorded configuration were measured: measuring them")
            extra = replace(config, timeout_s=None, n_trials=finished_count(study) + more)
            code = tune(extra, Progress(enabled=not quiet), argv=[], summarize=False)
            study = load_study(open_storage(config.storage, create=False), name)
        if code > 128:  # stopped by Ctrl-C, SIGTERM or SIGHUP
            return code
        summary = summarize_study(study)
        if summary.confirmed is None and summary.best is not None:
            # the budget bounds the search; the comparison needs the confirmed finalists
            from gpt_optuna.search.finalists import confirm, template_from_study

            print(f"re-measuring the finalists and the baseline in {config.confirm_processes} processes ...")
            confirm(
                study,
                template_from_study(study),
                config.workdir / "confirm.log",
                config.confirm_top,
                config.confirm_processes,
            )
            summary = record_winner(study)
        failed = seeded_failure(study)
        if failed is not None:
            outcomes.append(failed)
        elif code == EXIT_NO_FEASIBLE or summary.best is None:
            outcomes.append(Outcome("accuracy", False, "accuracy regression: no candidate meets the criterion"))
        else:
            outcomes.append(compare_latency(record_ms, summary, tolerance))
            if outcomes[-1].better and update:
                from gpt_optuna.results.export import export_trial

                export_trial(study, None, record_path.with_name(record_path.name.removesuffix(".json")), force=True)
                outcomes[-1] = Outcome("latency", True, outcomes[-1].message + "; the record is updated")
            elif outcomes[-1].better:
                outcomes[-1] = Outcome("latency", True, outcomes[-1].message + "; --update records it", True)
    if junit is not None:
        write_junit(junit, outcomes, time.monotonic() - started)
    for outcome in outcomes:
        print(("ok: " if outcome.passed else "FAILED: ") + outcome.message)
    if study_name is not None:
        where = shlex.join(study_flags(default_storage(study_name), study_name))
        print(f"the check's own study, for a closer look: gpt-optuna report {where} -o {study_name}.html")
    return 0 if all(o.passed for o in outcomes) else EXIT_REGRESSION
