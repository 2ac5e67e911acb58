import numpy as np
import pytest

from gpt_optuna.core.errors import UserError
from gpt_optuna.protocol.accuracy import parse_criterion


def ref() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "logits": rng.standard_normal((4, 10)).astype(np.float32),
        "feat": rng.standard_normal((4, 3)).astype(np.float32),
    }


def test_identical_outputs_pass_every_metric() -> None:
    r = ref()
    verdict = parse_criterion(
        "cosine>=0.9999 and max_abs<=0 and rel_l2<=0 and topk(1)>=1 and outside(atol=0,rtol=0)<=0"
    ).evaluate(r, r)
    assert verdict.feasible, verdict.reason
    assert verdict.metrics["max_abs"] == 0.0
    assert verdict.metrics["top1"] == 1.0
    assert verdict.constraint <= 0


def test_metric_values_are_worst_case_over_outputs() -> None:
    r = ref()
    out = {k: v.copy() for k, v in r.items()}
    out["feat"][0, 0] += 0.5
    out["logits"] += 0.01
    verdict = parse_criterion("max_abs<=0.1").evaluate(out, r)
    assert not verdict.feasible
    assert verdict.metrics["max_abs"] == pytest.approx(0.5, rel=1e-5)
    assert verdict.metrics["mean_abs"] == pytest.approx(0.5 / 12, rel=1e-4)
    assert "max_abs=0.5" in verdict.reason
    assert verdict.constraint == pytest.approx((0.5 - 0.1) / 0.1, rel=1e-4)


def test_cosine_and_rel_l2_match_their_definitions() -> None:
    r = {"y": np.array([1.0, 2.0, 3.0], np.float32)}
    o = {"y": np.array([1.0, 2.0, 4.0], np.float32)}
    m = parse_criterion("cosine>=0").evaluate(o, r).metrics
    assert m["cosine"] == pytest.approx(np.dot([1, 2, 4], [1, 2, 3]) / (np.sqrt(21) * np.sqrt(14)))
    assert m["rel_l2"] == pytest.approx(1 / np.sqrt(14))


def test_outside_fraction_uses_atol_and_rtol() -> None:
    r = {"y": np.array([1.0, 100.0, 0.0, 0.0], np.float32)}
    o = {"y": np.array([1.05, 100.5, 0.0, 0.2], np.float32)}
    m = parse_criterion("outside(atol=0.1, rtol=0.01)<=1").evaluate(o, r).metrics
    assert m["outside(atol=0.1, rtol=0.01)"] == pytest.approx(0.25)  # only 0.2 vs 0 is outside


def test_topk_agreement_counts_rows_whose_reference_class_is_in_topk() -> None:
    r = {"p": np.array([[0.1, 0.7, 0.2], [0.6, 0.3, 0.1]], np.float32)}
    o = {"p": np.array([[0.5, 0.4, 0.1], [0.6, 0.3, 0.1]], np.float32)}
    c = parse_criterion("topk(1)>=1 and topk(2)>=1")
    v = c.evaluate(o, r)
    assert v.metrics["top1"] == 0.5
    assert v.metrics["top2"] == 1.0
    assert not v.feasible and "top1" in v.reason


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nonfinite_output_is_always_infeasible(bad: float) -> None:
    r = ref()
    out = {k: v.copy() for k, v in r.items()}
    out["logits"][1, 2] = bad
    verdict = parse_criterion("max_abs<=1e9").evaluate(out, r)
    assert not verdict.feasible
    assert ("NaN" if np.isnan(bad) else "Inf") in verdict.reason
    assert verdict.constraint > 0


def test_wrong_shape_is_infeasible() -> None:
    r = {"y": np.zeros((2, 3), np.float32)}
    verdict = parse_criterion("max_abs<=1").evaluate({"y": np.zeros((3, 2), np.float32)}, r)
    assert not verdict.feasible and "shape" in verdict.reason


def test_error_is_lower_is_better_for_the_first_clause() -> None:
    r = {"y": np.array([1.0, 0.0], np.float32)}
    o = {"y": np.array([1.0, 1.0], np.float32)}
    for text, expected in (("cosine>=0.5", 1 - 1 / np.sqrt(2)), ("max_abs<=2 and cosine>=0", 1.0)):
        criterion = parse_criterion(text)
        assert criterion.error(criterion.evaluate(o, r).metrics) == pytest.approx(expected)


def test_canonical_text_round_trips() -> None:
    c = parse_criterion("  cosine >= 0.9999   and max_abs<=1e-2 ")
    assert c.text == "cosine>=0.9999 and max_abs<=0.01"
    assert parse_criterion(c.text) == c


@pytest.mark.parametrize(
    "text",
    [
        "topk(1)>=1",
        "mean(topk(5))>=0.99",
        "outside(atol=1e-7, rtol=0.0001)<=0.001",
        "cosine>=0.99999995",  # more digits than a short format keeps
        "mean(rel_l2)<0.01 and max_abs<=1e-300",
        "agree>=1 and box_px<=1.5",
    ],
)
def test_every_criterion_reads_back_from_the_text_a_study_records(text: str) -> None:
    criterion = parse_criterion(text, user_metrics=True)
    assert parse_criterion(criterion.text, user_metrics=True) == criterion


def test_a_metric_that_comes_out_nan_is_infeasible_not_an_error() -> None:
    ref = {"y": np.ones((2, 4), np.float32)}
    verdict = parse_criterion("agree>=0.5 and cosine>=0.9", user_metrics=True).evaluate(
        ref, ref, lambda: {"agree": float("nan")}
    )
    assert not verdict.feasible and verdict.reason == "agree is NaN"
    assert "agree" not in verdict.metrics and verdict.metrics["cosine"] == pytest.approx(1.0)
    assert np.isfinite(verdict.constraint) and verdict.constraint > 0
    with pytest.raises(UserError, match="returns agree=nan for the model's own outputs"):
        parse_criterion("agree>=0.5", user_metrics=True).check_user_metrics({"agree": float("nan")})


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "empty"),
        ("cosine", "malformed"),
        ("cosine=>0.9", "malformed"),
        ("cosin>=0.9", "unknown accuracy metric 'cosin'"),
        ("topk(x)>=0.9", "topk needs"),
        ("topk(0)>=0.9", "topk needs"),
        ("outside(tol=1)<=0.1", "atol= and rtol="),
        ("cosine(3)>=0.9", "takes no arguments"),
        ("cosine>=0.9 or max_abs<=1", "malformed"),
    ],
)
def test_malformed_expressions_are_user_errors(text: str, message: str) -> None:
    with pytest.raises(UserError, match=message.replace("(", r"\(")):
        parse_criterion(text)


def test_topk_on_outputs_without_classes_is_refused_up_front() -> None:
    with pytest.raises(UserError, match="applies to none"):
        parse_criterion("topk(5)>=0.9").check_applicable({"y": np.zeros((2, 3), np.float32)})
