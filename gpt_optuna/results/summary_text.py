"""A study's outcome in words: the verdict first, the headline, the summary, the confirmation's ranking."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from gpt_optuna.graph.interface import describe_changes
from gpt_optuna.study.record import source_study
from gpt_optuna.study.summary import first_value

if TYPE_CHECKING:
    from gpt_optuna.study.summary import Figures, StudySummary


def format_params(params: dict[str, object]) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items()) or "(defaults)"


def format_summary(summary: StudySummary) -> str:
    """The lines status, confirm and tune print about a study: the verdict first."""
    counts = summary.counts
    lines = [
        headline(summary),
        f"study {summary.name}: {counts['feasible']} complete, {counts['infeasible']} infeasible, "
        f"{counts['failed']} failed, "
        + (f"{counts['interrupted']} interrupted, " if counts["interrupted"] else "")
        + f"{counts['running']} running, {counts['waiting']} waiting"
        + (f" ({summary.reused} reused earlier results)" if summary.reused else ""),
    ]
    if summary.orphaned:
        numbers = ", ".join(map(str, summary.orphaned))
        lines.append(
            f"  running with no tuner alive on this host: trial {numbers} (its tuner was killed or stopped by a"
            " failure); the next run of the search fails and retries it"
        )
    if summary.warm_started:
        lines.append(f"warm start: {warm_summary(list(summary.warm_started))}")
    if summary.failures:
        lines.append("failures by cause:")
        lines += [f"  {count} x {cause}" for count, cause in summary.failures]
    lines += format_verdict(summary)
    if summary.confirmed:
        lines.extend(format_confirmed(summary.confirmed))
    warning = stability_warning(summary)
    if warning:
        lines.append(warning)
    return "\n".join(lines)


def _interval(figures: Figures) -> str:
    return f" [95% CI {figures.ci[0]:.3f}-{figures.ci[1]:.3f}]" if figures.ci is not None else ""


def headline(summary: StudySummary) -> str:
    """The study's verdict in one line, said first by every reader: whether the winner is really
    faster than the baseline, in which measurement, by how much."""
    winner, verdict = summary.winner, summary.verdict
    if verdict == "dry_run":
        return "dry run: builds only, no latency measured" + (
            f"; the fastest build was trial {winner.number}" if winner is not None else ""
        )
    if verdict == "none":
        return "verdict: no feasible candidate yet: none has met the accuracy criterion"
    assert winner is not None
    if winner.speedup is None:  # the baseline has no latency: it failed
        return (
            f"verdict: trial {winner.number} is the fastest feasible candidate ({winner.latency_ms:.4g} ms);"
            " the baseline has no latency to compare it with"
        )
    if verdict == "baseline":
        why = (
            "the baseline was significantly faster than every finalist (confirmed)"
            if winner.measurement == "confirmed"
            else "no feasible candidate was faster than the baseline in the search"
        )
        return f"verdict: keep the default configuration: {why}"
    figures = f"{winner.latency_ms:.4g} ms against the baseline's {winner.baseline_ms:.4g} ms"
    if verdict == "not_significant":
        return (
            f"verdict: no significant improvement: the best finalist, trial {winner.number}, measured"
            f" {winner.speedup:.3f}x the baseline{_interval(winner)}, an interval that includes 1.0 ({figures},"
            " confirmed); keep the default configuration"
        )
    if verdict == "unconfirmed":
        return (
            f"verdict: not confirmed: trial {winner.number} measured {winner.speedup:.3f}x the baseline in the"
            f" search ({figures}, one measurement each); the finalists are not re-measured yet (confirm)"
        )
    return (
        f"verdict: faster: trial {winner.number} is {winner.speedup:.3f}x the baseline{_interval(winner)}"
        f" ({figures}, confirmed)"
    )


def stability_warning(summary: StudySummary) -> str:
    """A warning where search measurements missed their precision target, with what to do."""
    found = summary.stability
    if found is None or not found.unstable:
        return ""
    whose = ", the winner's among them" if found.winner_unstable else ""
    steadier = (
        "lock the GPU clocks (nvidia-smi --lock-gpu-clocks)"
        if found.on_gpu
        else "keep the tuner's cores to itself (taskset, no other jobs)"
    )
    return (
        f"warning: unstable measurements: {found.unstable} of {found.measured} search latencies missed their"
        f" +-{100 * found.target:.3g}% precision target (worst +-{100 * found.worst:.3g}%){whose}: the machine"
        " was busy or its clocks changed. The confirmed figures, timed interleaved, are the ones to trust; for steadier"
        f" numbers stop other work on the machine, {steadier}, or give each measurement more time"
        " ([measure] budget_s)"
    )


def format_interface(summary: StudySummary) -> list[str]:
    """Where the study allowed I/O dtype changes (``--allow-io-change``): what the winner takes and returns."""
    if not summary.allow_io_change or summary.best is None:
        return []
    changes = summary.io_changes
    if not changes:
        return ["  interface: the model's own input and output dtypes (the study allowed changes: --allow-io-change)"]
    return [f"  interface: changed by --allow-io-change: {describe_changes(changes)}"]


def warm_summary(sources: list[str]) -> str:
    """How many warm-start candidates came from which study (``STUDY:TRIAL`` each)."""
    counts = Counter(source_study(source) for source in sources)
    return ", ".join(f"{n} candidate{'s' if n > 1 else ''} from {study}" for study, n in counts.items())


def format_verdict(summary: StudySummary) -> list[str]:
    """The baseline and the winner, both in the one measurement that judges them (the confirmation
    where there is one, else the search), and their ratio."""
    which, unit = summary.measurement, summary.unit
    base, best = summary.baseline_value, summary.best_value
    if summary.baseline is None:
        lines = ["baseline: not run yet"]
    elif base is None:
        lines = [f"baseline (trial {summary.baseline.number}): no value ({summary.baseline.state.name.lower()})"]
    else:
        lines = [f"baseline (trial {summary.baseline.number}): {base:.4g} {unit} ({which})"]
    if summary.best is None or best is None:
        return [*lines, "best: no feasible trial yet"]
    if summary.baseline_wins and summary.measurement == "confirmed":
        return [*lines, "best: the baseline itself: it was significantly faster than every finalist"]
    if summary.baseline_wins:
        return [*lines, "best: the baseline itself: no feasible candidate was faster in the search"]
    speedup = summary.speedup
    search = first_value(summary.best)
    lines.append(
        f"best (trial {summary.best.number}): {best:.4g} {unit} ({which})"
        + (f", {speedup:.3f}x the baseline{_interval(summary.winner)}" if speedup is not None else "")
        + (f"; {search:.4g} {unit} in the search" if which == "confirmed" and search is not None else "")
    )
    lines.append(f"  params: {format_params(summary.best.params)}")
    return lines + format_interface(summary)


def format_confirmed(confirmed: dict[str, Any]) -> list[str]:
    """The finalists' interleaved re-measurement, and whether the winner is a real improvement."""
    base = confirmed["baseline"]
    processes = confirmed.get("processes", 1)  # studies confirmed before there were several
    lines = [
        f"confirmed in {confirmed['rounds']} interleaved rounds in {processes} fresh process"
        f"{'es' if processes > 1 else ''} (baseline trial {base['number']}: {_ms(base)}):"
    ]
    for row in sorted(confirmed["ranking"], key=lambda r: -r["speedup"]):
        lines.append(
            f"  trial {row['number']}: {_ms(row)}, speedup {row['speedup']:.3f}x "
            f"[95% CI {row['ci_low']:.3f}-{row['ci_high']:.3f}]"
        )
    spread = max(max(_per_process(r)) / min(_per_process(r)) for r in [base, *confirmed["ranking"]])
    if spread > 1.05:
        lines.append(
            f"  latency differed by up to {100 * (spread - 1):.0f} % between processes (CPU-side launch work"
            " runs as fast as its process's CPU): the intervals include that"
        )
    top = max(confirmed["ranking"], key=lambda r: r["speedup"])
    if top["ci_high"] < 1.0:
        lines.append("  the baseline is significantly faster than every finalist: keep the default configuration")
    elif not top["significant"]:
        lines.append("  no significant improvement over the baseline: the interval includes 1.0")
    return lines


def _per_process(row: dict[str, Any]) -> list[float]:
    return row.get("process_ms", [row["median_ms"]])


def _ms(row: dict[str, Any]) -> str:
    """A median, with the per-process medians where there are several."""
    each = _per_process(row)
    return f"{row['median_ms']:.4g} ms" + (f" ({' / '.join(f'{v:.4g}' for v in each)})" if len(each) > 1 else "")
