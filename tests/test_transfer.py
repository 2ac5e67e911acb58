"""The warm start's queue: one candidate at a time, and an earlier study whose candidate loses to
this study's baseline gives no more."""

from __future__ import annotations

import time

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from gpt_optuna.search.lanes import TrialBudget
from gpt_optuna.search.transfer import TransferQueue
from gpt_optuna.study.trial_record import WARM_START_ATTR

DISTRIBUTIONS = {"a": CategoricalDistribution(tuple(range(8)))}


def study_with_baseline(ms: float = 10.0) -> optuna.Study:
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage())
    study.add_trial(
        optuna.trial.create_trial(
            params={"a": 0},
            distributions=DISTRIBUTIONS,
            value=ms,
            user_attrs={"baseline": True, "latency": {"median_ms": ms}},
        )
    )
    return study


def waiting(study: optuna.Study) -> list[tuple[int, str]]:
    """The warm-start candidates waiting in the study's queue."""
    return [
        (t.system_attrs["fixed_params"]["a"], t.user_attrs[WARM_START_ATTR])
        for t in study.get_trials(states=(TrialState.WAITING,))
        if WARM_START_ATTR in t.user_attrs
    ]


def run_next(study: optuna.Study, ms: float | None) -> optuna.trial.FrozenTrial:
    """Evaluate the queued trial: a latency, or None for an infeasible candidate."""
    trial = study.ask(DISTRIBUTIONS)
    if ms is None:
        study.tell(trial, state=TrialState.PRUNED)
    else:
        trial.set_user_attr("latency", {"median_ms": ms})
        study.tell(trial, ms)
    return study.get_trials()[-1]


CANDIDATES = [({"a": 1}, "A:3"), ({"a": 2}, "A:7"), ({"a": 3}, "B:1"), ({"a": 4}, "A:9"), ({"a": 5}, "B:2")]


def test_candidates_are_queued_one_at_a_time_while_they_beat_the_baseline() -> None:
    study, notes = study_with_baseline(), []
    queue = TransferQueue(CANDIDATES, note=notes.append)
    queue.update(study)
    assert waiting(study) == [(1, "A:3")]
    queue.update(study)  # one is waiting already: nothing more
    assert waiting(study) == [(1, "A:3")]
    for expected, ms in ((2, 9.0), (3, 8.0), (4, 6.0), (5, 7.0)):
        queue.update(study, run_next(study, ms))
        assert [a for a, _ in waiting(study)] == [expected]
    queue.update(study, run_next(study, 5.0))
    assert waiting(study) == [] and notes == []


def test_a_candidate_that_loses_stops_the_rest_of_its_study() -> None:
    study, notes = study_with_baseline(), []
    queue = TransferQueue(CANDIDATES, note=notes.append)
    queue.update(study)
    queue.update(study, run_next(study, 11.0))  # A:3 is slower than the baseline: A gives no more
    assert waiting(study) == [(3, "B:1")]
    assert notes == ["warm start: A:3 lost to the baseline here; the other 2 of A are not tried"]
    queue.update(study, run_next(study, None))  # B:1 is infeasible: B gives no more either
    assert waiting(study) == []
    assert queue.stopped == {"A": "A:3", "B": "B:1"}


def test_a_candidate_that_wins_gives_what_its_study_held_back_next_and_one_that_loses_does_not() -> None:
    study, notes = study_with_baseline(), []
    reserve = {"A": [({"a": 6}, "A:11"), ({"a": 7}, "A:12")], "B": [({"a": 5}, "B:5")]}
    queue = TransferQueue([({"a": 1}, "A:3"), ({"a": 3}, "B:1")], note=notes.append, reserve=reserve)
    queue.update(study)
    queue.update(study, run_next(study, 9.0))  # A:3 beat the baseline: A's held-back ones come next
    assert waiting(study) == [(6, "A:11")]
    assert notes == ["warm start: A:3 beat the baseline here; 2 more of A follow"]
    queue.update(study, run_next(study, 9.5))
    assert waiting(study) == [(7, "A:12")]
    queue.update(study, run_next(study, 9.5))
    assert waiting(study) == [(3, "B:1")]
    queue.update(study, run_next(study, 10.0))  # B:1 no faster: B's held-back one is never tried
    assert waiting(study) == [] and "B" in queue.stopped and "B" not in queue.reserve
    assert notes[-1] == "warm start: B:1 lost to the baseline here; the other 1 of B is not tried"


def test_a_candidate_that_wins_by_less_than_its_own_study_asks_stops_the_rest_of_its_study() -> None:
    study, notes = study_with_baseline(), []
    reserve = {"A": [({"a": 6}, "A:11")]}
    expected = {"A:3": 1.6, "B:1": 1.6}  # say, 1.8x in a study of the same model: 1 + 0.75 x 0.8
    candidates = [({"a": 1}, "A:3"), ({"a": 4}, "A:9"), ({"a": 3}, "B:1"), ({"a": 5}, "B:2")]
    queue = TransferQueue(candidates, note=notes.append, reserve=reserve, expected=expected)
    queue.update(study)
    queue.update(study, run_next(study, 8.0))  # A:3 gains 1.25x here: it wins, and A gives no more
    assert waiting(study) == [(3, "B:1")] and queue.stopped == {"A": "A:3"} and "A" not in queue.reserve
    assert notes == [
        "warm start: A:3 gained 1.25x here, under the 1.60x its gain in its study asks for; "
        "the other 2 of A are not tried"
    ]
    queue.update(study, run_next(study, 6.0))  # B:1 gains 1.67x: B goes on
    assert waiting(study) == [(5, "B:2")] and "B" not in queue.stopped


def test_what_a_study_of_an_unlike_model_held_back_waits_for_the_candidates_more_trusted() -> None:
    study = study_with_baseline()
    candidates = [({"a": 1}, "U:3"), ({"a": 2}, "S:7"), ({"a": 3}, "T:1")]
    trust = {"U:3": 1.1, "S:7": 1.0, "T:1": 0.4, "U:4": 0.1}  # U:3 is offered by U and S; T's model is less alike
    offered_by = {(("a", 1),): ("U", "S"), (("a", 2),): ("S",), (("a", 3),): ("T",), (("a", 4),): ("U",)}
    queue = TransferQueue(candidates, reserve={"U": [({"a": 4}, "U:4")]}, offered_by=offered_by, trust=trust)
    queue.update(study)
    queue.update(study, run_next(study, 8.0))  # U:3 wins for U and S: U's held-back one waits for S:7 and T:1
    assert waiting(study) == [(2, "S:7")]
    queue.update(study, run_next(study, 7.0))
    assert waiting(study) == [(3, "T:1")]
    queue.update(study, run_next(study, 7.0))
    assert waiting(study) == [(4, "U:4")]


def test_a_loss_stops_every_candidate_of_the_studies_that_offered_it_whoever_found_it() -> None:
    study, notes = study_with_baseline(), []
    candidates = [({"a": 1}, "M1:3"), ({"a": 2}, "M2:5"), ({"a": 3}, "B:1")]  # M1 and M2: one model, named M1
    offered_by = {(("a", 1),): ("M1",), (("a", 2),): ("M1",), (("a", 3),): ("B",)}
    queue = TransferQueue(candidates, note=notes.append, offered_by=offered_by)
    queue.update(study)
    queue.update(study, run_next(study, 12.0))  # M1:3 loses: M2:5, found by the same model's other study, goes too
    assert waiting(study) == [(3, "B:1")]
    assert notes == ["warm start: M1:3 lost to the baseline here; the other 1 of M1 is not tried"]


def test_a_candidate_two_studies_offered_is_given_up_once_both_are_stopped_and_counted_so() -> None:
    study, notes = study_with_baseline(), []
    candidates = [({"a": 1}, "B:1"), ({"a": 2}, "A:1"), ({"a": 3}, "A:2")]  # a=3 offered by A and B
    offered_by = {(("a", 1),): ("B",), (("a", 2),): ("A",), (("a", 3),): ("A", "B")}
    queue = TransferQueue(candidates, note=notes.append, offered_by=offered_by)
    queue.update(study)
    queue.update(study, run_next(study, 11.0))  # B stops; a=3 waits, A still offers it
    assert queue.stopped == {"B": "B:1"} and notes == []
    assert waiting(study) == [(2, "A:1")]
    queue.update(study, run_next(study, 11.0))  # A stops too: a=3 is given up, and the note counts it
    assert waiting(study) == []
    assert notes == ["warm start: A:1 lost to the baseline here; the other 1 of A is not tried"]


def test_what_a_study_held_back_is_given_only_up_to_the_warm_start_limit() -> None:
    from gpt_optuna.search.seeds import WARM_LIMIT

    study = study_with_baseline()
    first = [({"a": n}, f"A:{n}") for n in range(1, WARM_LIMIT)]  # one short of the limit
    queue = TransferQueue(first, reserve={"A": [({"a": 6}, "A:60"), ({"a": 7}, "A:70")]})
    queue.update(study)
    for _ in range(WARM_LIMIT):
        queue.update(study, run_next(study, 9.0))
    tried = [t.user_attrs[WARM_START_ATTR] for t in study.trials if WARM_START_ATTR in t.user_attrs]
    assert len(tried) == WARM_LIMIT and tried[1] == "A:60"  # given next after the first win, once
    assert waiting(study) == []


def test_nothing_is_queued_for_a_search_that_is_over_and_a_resumed_one_goes_on_where_it_left() -> None:
    study = study_with_baseline()
    TransferQueue(CANDIDATES, room=lambda: False).update(study)
    assert waiting(study) == []
    queue = TransferQueue(CANDIDATES)
    queue.update(study)
    run_next(study, 9.0)  # A:3 won, and the run ended before it queued the next
    resumed = TransferQueue(CANDIDATES)
    resumed.update(study)
    assert waiting(study) == [(2, "A:7")]
    run_next(study, 12.0)  # A:7 lost, and again the run ended first
    TransferQueue(CANDIDATES).update(study)
    assert waiting(study) == [(3, "B:1")]


def test_a_candidate_the_study_holds_already_is_not_queued_again() -> None:
    study = study_with_baseline()
    study.add_trial(
        optuna.trial.create_trial(
            params={"a": 1}, distributions=DISTRIBUTIONS, value=8.0, user_attrs={"latency": {"median_ms": 8.0}}
        )
    )
    TransferQueue(CANDIDATES).update(study)
    assert waiting(study) == [(2, "A:7")]


def test_a_resumed_study_counts_only_the_candidates_left_when_it_says_a_study_stopped() -> None:
    study = study_with_baseline()
    TransferQueue(CANDIDATES).update(study)
    run_next(study, 9.0)  # A:3 won
    TransferQueue(CANDIDATES).update(study)
    run_next(study, 12.0)  # A:7 lost, and the run ended before it judged it
    notes: list[str] = []
    TransferQueue(CANDIDATES, note=notes.append).update(study)
    assert notes == ["warm start: A:7 lost to the baseline here; the other 1 of A is not tried"]
    assert waiting(study) == [(3, "B:1")]


def test_the_budget_has_no_room_for_a_candidate_when_the_queued_trials_fill_it() -> None:
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage())
    study.enqueue_trial({"a": 0}, user_attrs={"baseline": True})
    study.enqueue_trial({"a": 1}, user_attrs={"seeded": "every speed feature on"})
    assert not TrialBudget(study, 2, None).has_room()
    assert TrialBudget(study, 3, None).has_room()
    assert not TrialBudget(study, None, time.monotonic() - 1.0).has_room()  # the time is spent
    TransferQueue(CANDIDATES, room=TrialBudget(study, 2, None).has_room).update(study)
    assert waiting(study) == []  # a search of two trials ends with nothing left waiting


def test_what_a_winning_study_held_back_is_kept_until_the_limit_has_room_for_it() -> None:
    study = study_with_baseline()
    first = [({"a": n}, f"B:{n}") for n in range(1, 6)] + [({"a": 6}, "A:1")]  # as many as the limit
    queue = TransferQueue(first, reserve={"A": [({"a": 7}, "A:2")]})
    queue.update(study)
    for ms in (9.0, 11.0):  # B:1 wins, B:2 loses: B:3 to B:5 are not tried
        queue.update(study, run_next(study, ms))
    assert waiting(study) == [(6, "A:1")]
    queue.update(study, run_next(study, 9.0))  # A:1 wins: the limit has room for what A held back
    assert waiting(study) == [(7, "A:2")]
