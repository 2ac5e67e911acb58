"""The trial budget across processes: a study ends with its target of results however its
workers race for the last slot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from gpt_optuna.search.lanes import TrialBudget, run_lanes
from gpt_optuna.search.objective import Lane


class CountingObjective:
    """Stands in for the evaluation: records which trials it was asked to evaluate."""

    space_exhausted = False

    def __init__(self) -> None:
        self.called: list[int] = []
        self.interrupted: list[int] = []

    def __call__(self, trial: optuna.Trial, lane: Lane) -> float:
        self.called.append(trial.number)
        return 1.0


def race_for_the_last_slot(tmp_path: Path, queued: dict[str, Any] | None) -> tuple[optuna.Study, CountingObjective]:
    """This process claims the study's one slot; another process (its own storage connection)
    starts its trial before this process's trial exists, and finishes it after."""
    url = f"sqlite:///{tmp_path / 'race.db'}"
    study = optuna.create_study(study_name="race", storage=url)
    if queued is not None:
        study.enqueue_trial(queued, user_attrs={"baseline": True})
    other = optuna.load_study(study_name="race", storage=optuna.storages.RDBStorage(url))
    budget = TrialBudget(study, 1, None)
    started: list[optuna.Trial] = []
    claim = budget.claim

    def claim_then_lose_the_race() -> bool:
        granted = claim()
        if granted and not started:
            started.append(optuna.Trial(other, other._storage.create_new_trial(other._study_id)))  # drawn, not queued
            assert not TrialBudget(other, 1, None).beyond_target(started[0])  # the first to start keeps it
        return granted

    def the_other_finishes(_: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if started and trial.number != started[0].number:
            other.tell(started[0], 2.0)

    budget.claim = claim_then_lose_the_race  # type: ignore[method-assign]
    objective = CountingObjective()
    lane = Lane(index=0, worker=None, gpu=None, device="cpu")  # type: ignore[arg-type]
    run_lanes(optuna.samplers.RandomSampler(seed=0), [lane], objective, budget, the_other_finishes)  # type: ignore[arg-type]
    return optuna.load_study(study_name="race", storage=url), objective


def test_a_trial_that_starts_after_another_process_took_the_last_slot_is_given_up_unevaluated(tmp_path: Path) -> None:
    study, objective = race_for_the_last_slot(tmp_path, queued=None)
    trials = study.get_trials()
    assert objective.called == []
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.FAIL]
    assert trials[1].user_attrs["interrupted"] == "not run: other workers took the study's 1 trials"
    assert trials[1].params == {}  # nothing was drawn for it, so nothing is retried


def test_a_queued_trial_given_up_so_goes_back_to_the_queue_as_it_was(tmp_path: Path) -> None:
    study, objective = race_for_the_last_slot(tmp_path, queued={"a": 3})
    trials = study.get_trials()
    assert objective.called == []
    given_up = next(t for t in trials if t.state is TrialState.FAIL)
    assert "interrupted" in given_up.user_attrs
    waiting = [t for t in trials if t.state is TrialState.WAITING]
    assert len(waiting) == 1
    assert waiting[0].system_attrs["fixed_params"] == {"a": 3}
    assert waiting[0].user_attrs == {"baseline": True}
