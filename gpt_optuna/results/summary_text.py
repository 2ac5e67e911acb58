"""A study's outcome in words: the verdict first, the headline, the summary, the confirmation's ranking."""

from __future__ import annotations

import math
from collections import Counter
from typing import TYPE_CHECKING

from optuna.trial import TrialState

from gpt_optuna.core.words import counted, in_number
from gpt_optuna.graph.interface import describe_changes
from gpt_optuna.study.confirmation import Confirmation, ConfirmedRow
from gpt_optuna.study.evidence import MORE_ROUNDS, WORTHWHILE
from gpt_optuna.study.summary import first_value
from gpt_optuna.study.trial_record import TrialRecord, source_study

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
    lines += host_lines(summary)
    if summary.confirmation is not None:
        lines.extend(format_confirmed(summary))
    warning = stability_warning(summary)
    if warning:
        lines.append(warning)
    return "\n".join(lines)


def interval(figures: Figures) -> str:
    """`` [95% CI LOW-HIGH]`` of a speedup's ``figures``, where they have an interval."""
    return f" [95% CI {figures.ci[0]:.3f}-{figures.ci[1]:.3f}]" if figures.ci is not None else ""


def headline(summary: StudySummary) -> str:
    """The study's verdict in one line, said first by every reader: whether the winner is really
    faster than the baseline, in which measurement, by how much; and where the user gave their
    own configuration, the same against it, and what to deploy."""
    return _against_defaults(summary) + versus_engines(summary) + versus_yours(summary)


def versus_engines(summary: StudySummary) -> str:
    """The verdict's part about each other engine's defaults, in a study of several engines (empty
    in a study of one): the winner's engine, and the winner against each, e.g. ``1.18x inductor's
    defaults [95% CI 1.100-1.270]``."""
    winner = summary.best
    engine = None if winner is None else summary.engine(winner)
    if winner is None or engine is None or summary.dry_run:
        return ""
    said = []
    for other, trial in summary.engine_defaults:
        figures = summary.versus_engine(other, winner)
        if trial.number == winner.number:
            said.append(f"it is {other}'s defaults")
        elif figures is not None and figures.speedup is not None:
            said.append(f"{figures.speedup:.3f}x {other}'s defaults{interval(figures)} ({figures.measurement})")
        else:
            said.append(f"{other}'s defaults have no latency to compare with")
    return f"; the winner runs on {engine}" + (f": {', '.join(said)}" if said else "")


def versus_yours(summary: StudySummary) -> str:
    """The verdict's part about the user's own configuration (empty without one)."""
    yours, winner = summary.yours, summary.best
    if yours is None or winner is None:
        return ""
    named = f"your configuration ({TrialRecord(yours).your_configuration}, trial {yours.number})"
    if summary.baseline is not None and yours.number == summary.baseline.number:
        return f"; {named} is the engine's defaults: the baseline"
    if yours.state is not TrialState.COMPLETE:
        return f"; {named} did not meet the accuracy criterion: {TrialRecord(yours).infeasible or 'it failed'}"
    if winner.number == yours.number:
        return f"; the winner is {named}: nothing the search found beat it"
    figures = summary.versus_yours(winner)
    if figures is None or figures.speedup is None:
        return f"; {named} has no latency to compare with"
    measured = f"trial {winner.number} is {figures.speedup:.3f}x {named}{interval(figures)}"
    against = f"{figures.latency_ms:.4g} ms against {figures.baseline_ms:.4g} ms, {figures.measurement}"
    decided = summary.decided
    if decided is not None and decided.number == yours.number:
        return f"; {measured} ({against}): not shown faster than what you run; keep your configuration"
    return f"; {measured} ({against})"


def _against_defaults(summary: StudySummary) -> str:
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
    confirmation = summary.confirmation
    processes = confirmation.processes if confirmation is not None else 1
    where = f"confirmed in {processes} processes"
    if verdict == "baseline":
        why = (
            f"the baseline was faster than every finalist beyond their intervals ({where})"
            if winner.measurement == "confirmed"
            else "no feasible candidate was faster than the baseline in the search"
        )
        return f"verdict: keep the default configuration: {why}"
    if verdict == "indicative" and summary.baseline_wins:
        return (
            "verdict: indicative: the baseline measured faster than every finalist, in one process only;"
            " not confirmed: re-measure in several processes (confirm)"
        )
    figures = f"{winner.latency_ms:.4g} ms against the baseline's {winner.baseline_ms:.4g} ms"
    measured = f"measured {winner.speedup:.3f}x the baseline{interval(winner)}"
    if verdict == "not_significant":
        return (
            f"verdict: no significant improvement: the best finalist, trial {winner.number}, {measured}, an"
            f" interval that includes 1.0 and no gain over {WORTHWHILE - 1:.0%} ({figures}, {where}); keep the"
            " default configuration"
        )
    if verdict == "inconclusive":
        assert confirmation is not None
        return (
            f"verdict: inconclusive: the best finalist, trial {winner.number}, {measured} ({figures}), but"
            f" {why_inconclusive(summary, confirmation)}"
        )
    if verdict == "indicative":
        return (
            f"verdict: indicative: trial {winner.number} {measured} in one process only ({figures}); not"
            " confirmed: re-measure it in several processes (confirm)"
        )
    if verdict == "unconfirmed":
        stale = Confirmation.of(summary.stale_confirmation)
        earlier = (
            f"; an earlier confirmation, of {in_number(len(stale.finalists), 'trial')}"
            f" {', '.join(map(str, stale.finalists))}, no longer covers the search's best"
            if stale is not None
            else ""
        )
        return (
            f"verdict: not confirmed: trial {winner.number} measured {winner.speedup:.3f}x the baseline in the"
            f" search ({figures}, one measurement each); the finalists are not re-measured yet (confirm){earlier}"
        )
    return (
        f"verdict: faster: trial {winner.number} is {winner.speedup:.3f}x the baseline{interval(winner)}"
        f" ({figures}, {where})"
    )


UNSTEADY = 0.05
"""Processes whose speedups differ by more than this say the host was unsteady (a confirmation
recorded before the noise of its rounds was kept)."""


def why_inconclusive(summary: StudySummary, confirmation: Confirmation) -> str:
    """Why an inconclusive confirmation could not decide, naming what widened the interval (the
    noise between rounds within the processes, the spread between the processes, or processes too
    few for a small spread), and the re-measurement that narrows it."""
    top, processes = confirmation.top, confirmation.processes
    each = top.process_speedups if top is not None else ()
    between = f"{min(each):.2f}x to {max(each):.2f}x" if each else ""
    keep = "Keep the default configuration, or re-measure"
    cause = confirmation.widened_by(top) if top is not None else None
    noise = spread = ""
    if cause is not None:
        assert top is not None and top.noise is not None
        spread, noise = (f"+-{100 * (math.exp(v) - 1):.0f}%" for v in top.noise)
    if cause == "rounds":
        rounds = confirmation.rounds_each
        return (
            f"its speedup varied from round to round within each process ({noise} per process over {rounds}"
            f" rounds) more than between the {processes} processes ({between}, {spread}): too few rounds to"
            f" decide. {keep} with more rounds (confirm --rounds {MORE_ROUNDS * rounds})"
        )
    more = f"{keep} with more processes (confirm --processes {2 * processes})"
    if not each or max(each) / min(each) - 1 <= UNSTEADY:
        return f"{processes} processes are too few to tell a gain over {WORTHWHILE - 1:.0%} from none. {more}"
    beyond = f", {spread}) more than the noise of their rounds explains ({noise} per process" if noise else ""
    return (
        f"its speedup differed between the {processes} processes ({between}{beyond}): the host was too unstable"
        f" to decide. {more} on a quiet host ({quiet_host(summary)})"
    )


def quiet_host(summary: StudySummary) -> str:
    """What makes this study's measurements steadier, for its device."""
    on_gpu = summary.stability is not None and summary.stability.on_gpu
    if on_gpu:
        return "no other work on the GPU, its clocks locked: nvidia-smi --lock-gpu-clocks"
    return "no other jobs, the tuner's cores to itself: taskset"


def stability_warning(summary: StudySummary) -> str:
    """A warning where search measurements missed their precision target, with what to do."""
    found = summary.stability
    if found is None or not found.unstable:
        return ""
    whose = ", the winner's among them" if found.winner_unstable else ""
    return (
        f"warning: unstable measurements: {found.unstable} of {found.measured} search latencies missed their"
        f" +-{100 * found.target:.3g}% precision target (worst +-{100 * found.worst:.3g}%){whose}: the machine"
        " was busy or its clocks changed. The confirmed figures, timed interleaved, are the ones to trust; for"
        f" steadier numbers measure on a quiet host ({quiet_host(summary)}), or give each measurement more time"
        " ([measure] budget_s)"
    )


def host_lines(summary: StudySummary) -> list[str]:
    """What the look at the host before the search found, and the winner's settings tuned for this host."""
    lines = [f"warning: {text}" for text in summary.host_warnings]
    if summary.host_tuned:
        settings = ", ".join(f"{knob}={value}" for knob, value, _ in summary.host_tuned)
        reasons = "; ".join(dict.fromkeys(why for _, _, why in summary.host_tuned))
        lines.append(
            f"  tuned for this host: {settings} ({reasons}); measure again on the host you deploy to, under its"
            " usual load, before relying on them"
        )
    return lines


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
    return ", ".join(f"{counted(n, 'candidate')} from {study}" for study, n in counts.items())


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
    lines += _yours_line(summary)
    if summary.best is None or best is None:
        return [*lines, "best: no feasible trial yet"]
    if summary.baseline_wins and summary.measurement != "search":
        return [*lines, "best: the baseline itself: it measured faster than every finalist beyond their intervals"]
    if summary.baseline_wins:
        return [*lines, "best: the baseline itself: no feasible candidate was faster in the search"]
    speedup = summary.speedup
    search = first_value(summary.best)
    lines.append(
        f"best (trial {summary.best.number}{_on_engine(summary)}): {best:.4g} {unit} ({which})"
        + (f", {speedup:.3f}x the baseline{interval(summary.winner)}" if speedup is not None else "")
        + (f"; {search:.4g} {unit} in the search" if which != "search" and search is not None else "")
    )
    lines.append(f"  params: {format_params(summary.best.params)}")
    return lines + format_interface(summary)


def _on_engine(summary: StudySummary) -> str:
    """``, engine NAME`` for the winner of a study of several engines."""
    engine = None if summary.best is None else summary.engine(summary.best)
    return "" if engine is None else f", engine {engine}"


def _yours_line(summary: StudySummary) -> list[str]:
    """The user's own configuration's latency, in the measurement that judges the winner."""
    yours = summary.yours
    if yours is None or summary.baseline is not None and yours.number == summary.baseline.number:
        return []
    latency, which = summary.your_latency()
    shown = (
        f"{latency:.4g} {summary.unit} ({which})" if latency is not None else f"no value ({yours.state.name.lower()})"
    )
    return [f"your configuration (trial {yours.number}, {TrialRecord(yours).your_configuration}): {shown}"]


def format_confirmed(summary: StudySummary) -> list[str]:
    """The finalists' interleaved re-measurement, and what it says of the winner."""
    confirmation = summary.confirmation
    assert confirmation is not None and confirmation.baseline is not None
    base, processes = confirmation.baseline, confirmation.processes
    finalists = len(confirmation.ranking)
    together = f", intervals for the {finalists} finalists together" if confirmation.joint and finalists > 1 else ""
    lines = [
        f"confirmed in {counted(confirmation.rounds, 'interleaved round')} in"
        f" {counted(processes, 'fresh process', 'fresh processes')}{together}"
        f" (baseline trial {base.number}: {_ms(base)}):"
    ]
    for row in confirmation.ranking:
        lines.append(f"  trial {row.number}: {_ms(row)}, speedup {row.speedup:.3f}x [95% CI {_ci(row)}]")
    references = [("your configuration", confirmation.yours)] if confirmation.yours is not None else []
    references += [(f"{engine}'s defaults", reference) for engine, reference in confirmation.engines.items()]
    for what, reference in references:
        against = ", ".join(f"trial {r.number} {r.speedup:.3f}x [{_ci(r)}]" for r in reference.versus)
        lines.append(f"  against {what} (trial {reference.number}, {reference.median_ms:.4g} ms): {against}")
    if confirmation.stopped:
        lines.append(f"  the re-measurement ended early ({confirmation.stopped}): these figures are what it measured")
    spread = max(max(_per_process(r)) / min(_per_process(r)) for r in [base, *confirmation.ranking])
    if spread > 1.05:
        on_gpu = summary.stability is not None and summary.stability.on_gpu
        why = (
            "CPU-side launch work runs as fast as its process's CPU"
            if on_gpu
            else "a process runs as fast as the cores it gets"
        )
        lines.append(
            f"  latency differed by up to {100 * (spread - 1):.0f} % between processes ({why}):"
            " the intervals include that"
        )
    lines += [f"  {line}" for line in _CONFIRMED_ENDINGS.get(summary.verdict, ())]
    return lines


_CONFIRMED_ENDINGS = {
    "baseline": ("the baseline is faster than every finalist beyond their intervals: keep the default configuration",),
    "not_significant": (
        "no significant improvement over the baseline: the interval includes 1.0 and no gain over"
        f" {WORTHWHILE - 1:.0%}",
    ),
    "inconclusive": ("inconclusive: the interval includes both 1.0 and gains worth having",),
    "indicative": ("one process only: indicative, not confirmed",),
}
"""The last line of the confirmation's figures, per verdict (a faster one needs none)."""


def _per_process(row: ConfirmedRow) -> tuple[float, ...]:
    return row.process_ms or (row.median_ms,)  # confirmations before there were several processes


def _ci(row: ConfirmedRow) -> str:
    assert row.ci is not None
    return f"{row.ci[0]:.3f}-{row.ci[1]:.3f}"


def _ms(row: ConfirmedRow) -> str:
    """A median, with the per-process medians where there are several."""
    each = _per_process(row)
    return f"{row.median_ms:.4g} ms" + (f" ({' / '.join(f'{v:.4g}' for v in each)})" if len(each) > 1 else "")
