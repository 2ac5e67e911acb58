import optuna
import pytest

from gpt_optuna.core.errors import UserError
from gpt_optuna.core.space import Condition, Knob, Space


def space() -> Space:
    return Space(
        [
            Knob("mode", ("seq", "par"), "seq"),
            Knob("threads", (0, 1, 2), 0),
            Knob("inter", (0, 1, 2), 0, condition=Condition("mode", ("par",))),
        ]
    )


def test_default_includes_only_active_knobs() -> None:
    assert space().default() == {"mode": "seq", "threads": 0}


def test_conditional_knob_is_suggested_only_when_its_parent_allows() -> None:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    seen_inter = {True: 0, False: 0}
    for _ in range(40):
        trial = study.ask()
        params = space().suggest(trial)
        assert ("inter" in params) == (params["mode"] == "par")
        assert trial.params == params
        seen_inter["inter" in params] += 1
        study.tell(trial, 1.0)
    assert seen_inter[True] and seen_inter[False]


def test_every_candidate_covers_the_search_with_inactive_knobs_left_out() -> None:
    candidates = space().with_overrides({"threads": [1, 2]}).every_candidate()
    assert len(candidates) == 2 * 1 + 2 * 3  # seq: threads; par: threads x inter
    assert {"mode": "seq", "threads": 1} in candidates and {"mode": "par", "threads": 2, "inter": 1} in candidates
    assert all(c["threads"] in (1, 2) for c in candidates)  # the default kept for the baseline alone is not searched
    assert len({tuple(sorted(c.items())) for c in candidates}) == len(candidates)


def test_overrides_restrict_the_search_and_leave_the_baseline_at_the_engine_defaults() -> None:
    s = space().with_overrides({"mode": "par", "threads": [2, 1], "inter": [0, 2]})
    knobs = {k.name: k for k in s.knobs}
    assert knobs["mode"].search_choices == ("par",) and knobs["mode"].default == "seq"
    assert knobs["threads"].search_choices == (2, 1) and knobs["threads"].choices == (0, 2, 1)
    assert knobs["inter"].searched is None and knobs["inter"].choices == (0, 2)
    assert s.default() == {"mode": "seq", "threads": 0}  # the baseline: the engine's own configuration
    assert knobs["threads"].describe()["searched"] == [2, 1]


def test_the_search_never_proposes_a_value_kept_for_the_baseline_alone() -> None:
    from gpt_optuna.graph.transforms import is_transform_knob
    from gpt_optuna.search.sampling import FreshSampler

    s = space().with_overrides({"threads": [1, 2]})
    study = optuna.create_study(sampler=FreshSampler(optuna.samplers.TPESampler(seed=0), s, is_transform_knob, 0))
    study.enqueue_trial(s.default())
    study.optimize(lambda t: float(s.suggest(t)["threads"]), n_trials=8)
    trials = study.get_trials()
    assert trials[0].params["threads"] == 0
    assert all(t.params["threads"] in (1, 2) for t in trials[1:])


def test_override_of_unknown_knob_is_a_user_error() -> None:
    with pytest.raises(UserError, match="unknown knob 'nope'"):
        space().with_overrides({"nope": 1})


def test_invalid_spaces_are_refused() -> None:
    with pytest.raises(ValueError, match="not among its choices"):
        Knob("k", (1, 2), 3)
    with pytest.raises(ValueError, match="not defined before"):
        Space([Knob("a", (1,), 1, condition=Condition("b", (1,))), Knob("b", (1,), 1)])
    with pytest.raises(ValueError, match="duplicate"):
        Space([Knob("a", (1,), 1), Knob("a", (1,), 1)])


def test_default_drops_a_knob_from_the_search() -> None:
    knobs = {k.name: k for k in space().with_overrides({"threads": "default"}).knobs}
    assert knobs["threads"].choices == (0,)


def test_space_values_are_checked_against_the_knob_before_anything_runs() -> None:
    space = Space(
        [
            Knob("route.tactics", ("auto",), "auto", open_ended=True),
            Knob("provider", ("GPU",), "GPU", selects_engine=True),
            Knob("cpu_threads", (0, 2), 0, condition=Condition("provider", ("CPU",))),  # CPU: usable, not searched
            Knob("level", ("a", "b"), "a"),
            Knob("threads", (0, 1, 2), 0),
            Knob("switch", (True, False), True),
            Knob("ratio", (0.5, 1.0), 0.5),
        ]
    )
    overrides = {"route.tactics": ["10", "20"], "threads": [3, 4], "ratio": [2], "level": "b", "provider": "CPU"}
    allowed = space.with_overrides(overrides)
    assert allowed.knobs[4].choices == (0, 3, 4)  # numbers beyond those offered, names of an open-ended knob
    assert Space.from_record(allowed.to_record()).knobs[0].open_ended
    for overrides, message in [
        ({"level": "c"}, 'level = "c": not a value it offers here \\("a", "b"\\)'),
        ({"provider": "NPU"}, 'provider = "NPU": not a value it offers here \\("GPU", "CPU"\\)'),
        ({"threads": "lots"}, 'threads = "lots": give a number'),
        ({"threads": [1, True]}, "threads = true: give a number"),
        ({"switch": 3}, "switch = 3: give true or false"),
    ]:
        with pytest.raises(UserError, match=message):
            space.with_overrides(overrides)
