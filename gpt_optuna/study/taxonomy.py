"""One taxonomy of trial outcomes for every reader: what a trial holds, and why it ended."""

from __future__ import annotations

import re
from collections import Counter

from optuna.trial import FrozenTrial, TrialState

from gpt_optuna.study.trial_record import TrialRecord


def retried_numbers(trials: list[FrozenTrial]) -> set[int]:
    """Trials whose candidate was queued again because they were interrupted (by Ctrl-C, a killed
    tuner or a lost heartbeat): their retries name them in ``retry_history``."""
    return {number for t in trials for number in TrialRecord(t).retry_history}


def is_interrupted(trial: FrozenTrial, retried: set[int]) -> bool:
    """A failed trial that holds no result of its candidate: stopped before its end. A kill can
    land after the result attrs are written and before the trial completes, so ``outcome`` alone
    does not tell; the ``interrupted`` mark or a queued retry does."""
    if trial.state is not TrialState.FAIL:
        return False
    record = TrialRecord(trial)
    return record.outcome is None or record.marked_interrupted or trial.number in retried


def has_own_result(trial: FrozenTrial, retried: set[int]) -> bool:
    """Whether the trial holds its candidate's own result: a value, a verdict or its own failure."""
    return trial.state in (TrialState.COMPLETE, TrialState.PRUNED) or (
        trial.state is TrialState.FAIL and not is_interrupted(trial, retried)
    )


def own_results(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """The trials that hold their candidate's own result: what counts towards ``--n-trials``."""
    retried = retried_numbers(trials)
    return [t for t in trials if has_own_result(t, retried)]


def baseline_trial(trials: list[FrozenTrial]) -> FrozenTrial | None:
    """The baseline: the trial of the default configuration (user attr ``baseline``) that holds its
    own result, the one that measured a latency (even an infeasible one) where there are several."""
    own = [t for t in own_results(trials) if TrialRecord(t).baseline]
    measured = (t for t in own if t.state is TrialState.COMPLETE or TrialRecord(t).latency is not None)
    return next(measured, own[0] if own else None)


def your_trial(trials: list[FrozenTrial]) -> FrozenTrial | None:
    """The trial of the user's own configuration (``--baseline-config``) that holds its own result
    (the baseline, where that configuration is the engine's defaults); None without one."""
    retried = retried_numbers(trials)
    return next((t for t in trials if TrialRecord(t).is_yours and has_own_result(t, retried)), None)


def engine_default_trials(trials: list[FrozenTrial]) -> dict[str, FrozenTrial]:
    """The trials of each other engine's defaults in a study of several engines, by engine, each
    the one that holds its own result."""
    retried = retried_numbers(trials)
    found: dict[str, FrozenTrial] = {}
    for trial in trials:
        engine = TrialRecord(trial).engine_defaults
        if engine is not None and engine not in found and has_own_result(trial, retried):
            found[engine] = trial
    return found


def search_ranking(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """The feasible trials that measured their own candidate (reused results left out), fastest
    first by the search's figures: where the finalists come from."""
    complete = [t for t in trials if t.state is TrialState.COMPLETE and t.values and not TrialRecord(t).reused]
    return sorted(complete, key=lambda t: (t.values[0], t.number))


STATUSES = ("feasible", "infeasible", "failed", "interrupted", "running", "waiting")


def trial_status(trial: FrozenTrial, retried: set[int] | None = None) -> str:
    """One taxonomy for every reader: feasible, infeasible (accuracy), failed (the candidate could
    not be made, built or run: pruned or failed), interrupted, running, waiting. ``retried`` is
    :func:`retried_numbers` of the study (without it, only the trial's own marks count)."""
    if trial.state is TrialState.COMPLETE:
        return "feasible"
    if trial.state is TrialState.PRUNED:
        return "failed" if TrialRecord(trial).failed else "infeasible"
    if trial.state is TrialState.FAIL:
        return "interrupted" if is_interrupted(trial, retried or set()) else "failed"
    return trial.state.name.lower()


def failure_cause(trial: FrozenTrial) -> str:
    """A failed trial's cause as the readers group it: its outcome and first line, paths elided."""
    record = TrialRecord(trial)
    text = (record.failure or "").strip()
    line = re.sub(r"(?:[A-Za-z]:)?(?:/[^\s:'\"]+)+", "<path>", text.splitlines()[0] if text else "")
    return f"{record.outcome or 'failed'}: {line[:160]}"


def failure_causes(trials: list[FrozenTrial]) -> list[tuple[int, str]]:
    """Failed candidates grouped by cause (:func:`failure_cause`), most common first; a trial that
    reused an earlier failure is not counted again."""
    retried = retried_numbers(trials)
    causes = Counter(
        failure_cause(t) for t in trials if trial_status(t, retried) == "failed" and not TrialRecord(t).reused
    )
    return [(count, cause) for cause, count in causes.most_common()]
