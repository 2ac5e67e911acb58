"""``gpt-optuna check``: a CI gate that keeps a model as fast and as accurate as its record.

The record is what ``gpt-optuna export`` wrote (``FILE.json`` with ``FILE.inputs.npz`` and
``FILE.reference.npz`` beside it). The check first runs the (possibly changed) model in fp32 on
the recorded inputs and judges its outputs against the recorded ones with the recorded criterion:
changed outputs fail it. Then it searches within part of ``--budget``, starting from the recorded
configuration (tried right after the engine's defaults), and confirms the finalists.

Latency is judged on this host, never against another host's absolute figure where that can be
avoided: where the record's exported model is beside it (ONNX Runtime), it is timed interleaved
with the changed model under the recorded configuration (and the check's winner, where that was
confirmed faster than the defaults), in fresh processes, by the confirmation's protocol; the
changed model regresses where the interval of its slowdown lies beyond the tolerance, passes where
it lies within, and the check is **inconclusive** (exit :data:`EXIT_INCONCLUSIVE`) where it
straddles the tolerance: a noisy runner is never turned into a pass or a fail. Without the
exported model the recorded latency is the reference, and every confirmation process must agree.
``--budget`` bounds the whole command.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpt_optuna.backends.base import read_record
from gpt_optuna.core.errors import EXIT_INCONCLUSIVE, EXIT_REGRESSION, UserError
from gpt_optuna.evaluation.accuracy import parse_criterion
from gpt_optuna.graph import feeds as feeds_io
from gpt_optuna.graph import model as model_io
from gpt_optuna.graph.transforms import is_transform_knob
from gpt_optuna.results.export import export_trial
from gpt_optuna.search.config import TuneConfig, default_storage, study_flags
from gpt_optuna.search.finalists import interleave, process_seconds, quiet_seconds
from gpt_optuna.study.evidence import MIN_PROCESSES, Speedup, speedups
from gpt_optuna.study.summary import finished_count
from gpt_optuna.study.taxonomy import search_ranking

COMPARISON_SHARE = 0.5
"""Of ``--budget``, the share kept for timing the record's model beside the changed one (with
whatever the search leaves unused)."""
GATE_ROUNDS = 6
"""Interleaved rounds in each of the comparison's processes: the gate needs processes more than rounds."""


@dataclass(frozen=True)
class Outcome:
    """One aspect of the check: passed, failed or inconclusive, and one line that says why."""

    name: str
    passed: bool
    message: str
    better: bool = False
    """Faster than the record beyond the tolerance: ``trial`` is what ``--update`` records."""
    inconclusive: bool = False
    trial: int | None = None

    @property
    def word(self) -> str:
        return "INCONCLUSIVE" if self.inconclusive else "ok" if self.passed else "FAILED"


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
    """The record's input shapes as ``--shape`` flags (a scalar input has none to give)."""
    return [
        f"{name}:" + "/".join("x".join(str(d) for d in dims) for dims in ranges)
        for name, ranges in (record.get("shapes") or {}).items()
        if any(ranges)
    ]


def compare_absolute(record_ms: float, summary: Any, tolerance: float) -> Outcome:
    """The winner's latency, as its study states it, against the record's figure (measured where
    the record was made): a regression or an improvement only where every confirmation process
    agrees, within the tolerance where none is beyond it, else inconclusive."""
    winner = summary.winner
    median = winner.latency_ms
    measured = list(winner.process_ms) or [median]
    low, high = min(measured), max(measured)
    which = f" ({winner.measurement}; processes {low:.4g}-{high:.4g} ms)" if len(measured) > 1 else ""
    which = which or f" ({winner.measurement})"
    change = 100 * (median / record_ms - 1)
    said = (
        f"trial {summary.best.number}: {median:.4g} ms{which} against the recorded {record_ms:.4g} ms (a figure of"
        f" the host that made the record), {change:+.1f} %"
    )
    if low > record_ms * (1 + tolerance):
        return Outcome("latency", False, f"latency regression: {said} beyond {tolerance:.0%}")
    if high < record_ms * (1 - tolerance):
        return Outcome("latency", True, f"faster than the record: {said}", better=True, trial=summary.best.number)
    if high <= record_ms * (1 + tolerance):
        return Outcome("latency", True, f"latency within {tolerance:.0%}: {said}")
    return Outcome(
        "latency",
        False,
        f"latency not decided: {said}; the processes straddle {tolerance:.0%}: export the record's model beside"
        " it, so it is timed on this host, or give more --budget",
        inconclusive=True,
    )


def compare_on_this_host(found: list[Speedup], tolerance: float, seeded: int, winner: int | None) -> Outcome:
    """The record's model (``found[0]``), the changed model under the recorded configuration (trial
    ``seeded``, ``found[1]``) and the search's fastest where it is another (``winner``,
    ``found[2]``), timed interleaved on this host, each interval on its own: the slowdown's
    interval against the tolerance decides; the other can only find the record slower."""
    record, changed = found[0], found[1]
    slowdown = (1 / changed.high, 1 / changed.estimate, 1 / changed.low)
    if changed.processes < MIN_PROCESSES:
        return Outcome(
            "latency",
            False,
            f"latency not decided: the record's model and the changed one were timed in {changed.processes} process"
            f" only ({slowdown[1]:.3f}x its latency), which cannot tell this host's noise from a change; give more"
            " --budget",
            inconclusive=True,
        )
    said = (
        f"the changed model under the recorded configuration (trial {seeded}): {changed.latency_ms:.4g} ms against"
        f" the record's model's {record.latency_ms:.4g} ms, timed interleaved here in {changed.processes}"
        f" processes: {slowdown[1]:.3f}x its latency [95% CI {slowdown[0]:.3f}-{slowdown[2]:.3f}]"
    )
    if slowdown[0] > 1 + tolerance:
        return Outcome("latency", False, f"latency regression: {said}, beyond {tolerance:.0%}")
    if winner is not None and 1 / found[2].low < 1 - tolerance:
        other = found[2]
        return Outcome(
            "latency",
            True,
            f"faster than the record: trial {winner}: {other.latency_ms:.4g} ms against the record's model's"
            f" {record.latency_ms:.4g} ms, {1 / other.estimate:.3f}x its latency [95% CI {1 / other.high:.3f}-"
            f"{1 / other.low:.3f}]",
            better=True,
            trial=winner,
        )
    if slowdown[2] < 1 - tolerance:
        return Outcome("latency", True, f"faster than the record: {said}", better=True, trial=seeded)
    if slowdown[2] <= 1 + tolerance:
        return Outcome("latency", True, f"latency within {tolerance:.0%}: {said}")
    return Outcome(
        "latency",
        False,
        f"latency not decided: {said}, an interval that reaches past {tolerance:.0%}: this host was too noisy to"
        " tell; run it on a quieter runner or with more --budget",
        inconclusive=True,
    )


def exported_model(record_path: Path, record: dict[str, Any]) -> tuple[Path | None, str]:
    """The record's exported model where it is beside the record, unchanged, and can be timed here
    (an ONNX Runtime model); else None and why."""
    path = record_path.with_name(record_path.name.removesuffix(".json"))
    if record.get("backend") != "onnxruntime" or path.suffix != ".onnx":
        return None, f"a {record.get('backend')} record's engine is not timed here"
    if not path.is_file():
        return None, f"the record's model {path} is not beside it"
    if hashlib.sha256(path.read_bytes()).hexdigest() != record.get("model_sha256"):
        return None, f"the record's model {path} changed since it was exported"
    return path, ""


def still_to_measure(study: Any) -> int:
    """How many trials must still run for the baseline and the recorded configuration to be
    measured (a budget spent on the preparation can leave them waiting): the waiting trials up to
    the last of them, since waiting trials run in order."""
    from optuna.trial import TrialState

    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    needed = [t.number for t in waiting if t.user_attrs.get("baseline") or t.user_attrs.get("seeded")]
    return sum(1 for t in waiting if t.number <= max(needed)) if needed else 0


def write_junit(path: Path, outcomes: list[Outcome], seconds: float) -> None:
    """A JUnit XML report: one test case per aspect, a <failure> for each that failed, <skipped>
    for each the check could not decide."""
    failures = sum(not o.passed and not o.inconclusive for o in outcomes)
    suite = ET.Element(
        "testsuite",
        name="gpt-optuna check",
        tests=str(len(outcomes)),
        failures=str(failures),
        skipped=str(sum(o.inconclusive for o in outcomes)),
        time=f"{seconds:.1f}",
    )
    for outcome in outcomes:
        case = ET.SubElement(suite, "testcase", classname="gpt-optuna.check", name=outcome.name)
        if outcome.inconclusive:
            ET.SubElement(case, "skipped", message=outcome.message)
        elif outcome.passed:
            ET.SubElement(case, "system-out").text = outcome.message
        else:
            ET.SubElement(case, "failure", message=outcome.message, type="regression").text = outcome.message
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)


def exit_code(outcomes: list[Outcome]) -> int:
    """1 where any aspect regressed, :data:`EXIT_INCONCLUSIVE` where none did but one was not decided, else 0."""
    if any(not o.passed and not o.inconclusive for o in outcomes):
        return EXIT_REGRESSION
    return EXIT_INCONCLUSIVE if any(o.inconclusive for o in outcomes) else 0


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
    """The whole check within ``budget_s``; returns the exit code (0 pass, 1 regression, 5
    inconclusive, 130 interrupted)."""
    from gpt_optuna.results.summary_text import stability_warning
    from gpt_optuna.search.progress import Progress
    from gpt_optuna.search.tune import tune
    from gpt_optuna.study.storage import load_study, open_storage

    started = time.monotonic()
    deadline = started + budget_s
    record = load_record(record_path)
    exported, why_not = exported_model(record_path, record)
    outcomes = [outputs_unchanged(model, record)]
    study_name = None
    if outcomes[0].passed:
        name = study_name = f"check-{model.stem}-{time.strftime('%Y%m%d-%H%M%S')}"
        kept = COMPARISON_SHARE * budget_s if exported is not None else 0.0
        config = TuneConfig(
            **base,
            model=model,
            backend=record["backend"],
            accuracy=record["accuracy_criterion"],
            metric=record.get("metric"),
            inputs=record["samples"]["inputs"],
            shapes=shape_flags(record),
            timeout_s=max(deadline - kept - time.monotonic(), 1.0),
            confirm_top=0 if exported is not None else base.get("confirm_top", 5),  # the comparison confirms
            study_name=name,
            seeds=[(record["params"], "the recorded configuration")],
            no_seeds=True,  # the recorded configuration is the one to try first
            allow_io_change=bool((record.get("interface") or {}).get("allow_io_change")),
        )
        progress = Progress(enabled=not quiet)
        code = tune(config, progress, argv=[], summarize=False)
        study = load_study(open_storage(config.storage, create=False), name)
        more = still_to_measure(study)
        left = deadline - kept - time.monotonic()
        if more and code <= 128 and left > 1.0:
            print("the budget ended before the baseline and the recorded configuration were measured: measuring them")
            extra = replace(config, timeout_s=left, n_trials=finished_count(study) + more)
            code = tune(extra, progress, argv=[], summarize=False)
            study = load_study(open_storage(config.storage, create=False), name)
        if code > 128:  # stopped by Ctrl-C, SIGTERM or SIGHUP
            return code
        latency, summary = judge_latency(study, config, record, record_path, exported, why_not, tolerance, deadline)
        outcomes.append(latency)
        if latency.better and update:
            export_trial(study, latency.trial, record_path.with_name(record_path.name.removesuffix(".json")), True)
            outcomes[-1] = replace(latency, message=latency.message + "; the record is updated")
        elif latency.better:
            outcomes[-1] = replace(latency, message=latency.message + "; --update records it")
        if summary is not None:
            for line in (*(f"warning: {w}" for w in summary.host_warnings), stability_warning(summary)):
                if line:
                    print(line)
    if junit is not None:
        write_junit(junit, outcomes, time.monotonic() - started)
    for outcome in outcomes:
        print(f"{outcome.word}: {outcome.message}")
    if study_name is not None:
        where = shlex.join(study_flags(default_storage(study_name), study_name))
        print(f"the check's own study, for a closer look: gpt-optuna report {where} -o {study_name}.html")
    return exit_code(outcomes)


def judge_latency(
    study: Any,
    config: TuneConfig,
    record: dict[str, Any],
    record_path: Path,
    exported: Path | None,
    why_not: str,
    tolerance: float,
    deadline: float,
) -> tuple[Outcome, Any]:
    """The latency aspect of the check, from its study (confirmed within the budget where the
    search left it unconfirmed), and the study's summary (None where the recorded configuration
    was never measured)."""
    from gpt_optuna.results.winner import record_winner
    from gpt_optuna.search.finalists import ConfirmationFailed, confirm, template_from_study
    from gpt_optuna.study.summary import summarize_study

    seeded = seeded_trial(study)
    if seeded is not None and seeded.state.name == "PRUNED":
        reason = seeded.user_attrs.get("infeasible") or seeded.user_attrs.get("failure", "")
        return Outcome("accuracy", False, f"accuracy regression: the recorded configuration fails: {reason}"), None
    summary = summarize_study(study)
    if seeded is None or seeded.state.name != "COMPLETE":
        return Outcome(
            "latency",
            False,
            "latency not decided: the budget ended before the recorded configuration was measured; give more --budget",
            inconclusive=True,
        ), summary
    template = template_from_study(study)
    if exported is None:
        if summary.confirmed is None and deadline - time.monotonic() > 1.0:
            print(f"re-measuring the finalists and the baseline in {config.confirm_processes} processes ...")
            try:
                confirm(
                    study,
                    template,
                    config.workdir / "confirm.log",
                    config.confirm_top,
                    config.confirm_processes,
                    deadline=deadline,
                )
            except ConfirmationFailed as failure:
                print(f"note: {failure}")
            summary = record_winner(study)
        print(f"note: {why_not}: the latency is judged against the recorded figure")
        return compare_absolute(recorded_latency(record), summary, tolerance), summary
    best = search_ranking(list(study.get_trials(deepcopy=False)))[0]  # the search's fastest, timed beside them
    winner = best if best.number != seeded.number and best.values[0] < (seeded.values or [float("inf")])[0] else None
    trials = [seeded, *([winner] if winner is not None else [])]
    exported_job = replace(
        template,
        model=model_io.load_model_info(exported),
        candidate={k: v for k, v in record["params"].items() if not is_transform_knob(k)},
    )
    evaluations = [exported_job, *(replace(template, candidate=dict(t.params)) for t in trials)]
    print(
        f"timing the record's model {exported.name} beside the changed model, interleaved, in"
        f" {config.confirm_processes} fresh processes ..."
    )
    try:
        measured = interleave(
            evaluations,
            config.workdir / "compare.log",
            config.confirm_processes,
            print,
            process_seconds([seeded, *trials], template.settings),
            quiet_seconds([seeded, *trials], template.settings),
            deadline=deadline,
            rounds=GATE_ROUNDS,
        )
    except ConfirmationFailed as failure:
        said = f"latency not decided: the models could not be timed ({failure.reason}); give more --budget"
        return Outcome("latency", False, said, inconclusive=True), summary
    gate = speedups(measured.medians[:, :2], measured.processes)  # the question the gate answers, alone
    other = speedups(measured.medians[:, [0, 2]], measured.processes)[1:] if winner is not None else []
    faster = None if winner is None else winner.number
    return compare_on_this_host([*gate, *other], tolerance, seeded.number, faster), summary


def seeded_trial(study: Any) -> Any:
    """The trial of the recorded configuration (its latest try holding a result; the baseline's
    where the recorded configuration is the engine's defaults, which is never queued twice), or None."""
    from optuna.trial import TrialState

    from gpt_optuna.study.taxonomy import baseline_trial

    trials = study.get_trials(deepcopy=False)
    queued = [t for t in trials if t.user_attrs.get("seeded")]
    if not queued:
        return baseline_trial(trials)
    tried = [t for t in queued if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    return tried[-1] if tried else None
