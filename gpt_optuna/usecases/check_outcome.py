"""The aspects of a ``check`` (accuracy, latency), each passed, failed or not decided with one line
that says why; the latency judged against the record; the JUnit report and the exit code."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpt_optuna.core.errors import EXIT_INCONCLUSIVE, EXIT_REGRESSION
from gpt_optuna.core.files import atomic_path
from gpt_optuna.study.evidence import MIN_PROCESSES, Speedup


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


def compare_absolute(record_ms: float, summary: Any, tolerance: float) -> Outcome:
    """The winner's latency, as its study states it, against the record's figure (measured where
    the record was made): a regression or an improvement only where every confirmation process
    agrees, within the tolerance where none is beyond it, else inconclusive."""
    winner = summary.winner
    median = winner.latency_ms
    measured = list(winner.process_ms) or [median]
    low, high = min(measured), max(measured)
    which = f"{winner.measurement}; processes {low:.4g}-{high:.4g} ms" if len(measured) > 1 else winner.measurement
    change = 100 * (median / record_ms - 1)
    said = (
        f"trial {summary.best.number}: {median:.4g} ms ({which}) against the recorded {record_ms:.4g} ms (a figure of"
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
    with atomic_path(path) as tmp:
        ET.ElementTree(suite).write(tmp, encoding="utf-8", xml_declaration=True)


@dataclass(frozen=True)
class CheckResult:
    """What a check found: each aspect's outcome and the exit code they make (0 pass, 1 regression,
    5 not decided, 128 + a signal's number where one stopped it), and the check's own study."""

    code: int
    outcomes: tuple[Outcome, ...]
    study_name: str | None

    @property
    def passed(self) -> bool:
        return self.code == 0


def exit_code(outcomes: list[Outcome]) -> int:
    """1 where any aspect regressed, :data:`EXIT_INCONCLUSIVE` where none did but one was not decided, else 0."""
    if any(not o.passed and not o.inconclusive for o in outcomes):
        return EXIT_REGRESSION
    return EXIT_INCONCLUSIVE if any(o.inconclusive for o in outcomes) else 0
