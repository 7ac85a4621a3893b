"""Tests for rollout.grading.scoring: the score rule (``normalize_score``) on raw values. The same
cases run through a real evaluator in test_evaluation.py."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import pytest

from rollout.grading.scoring import normalize_score
from tests.rollout.evaluator_helpers import SCORE_RULE_CASES


@pytest.mark.parametrize("expr, status, score, raw", SCORE_RULE_CASES, ids=[c[0] for c in SCORE_RULE_CASES])
def test_score_rule_values_normalize_score(expr: str, status: str, score: float, raw: str | None) -> None:
    namespace: dict[str, object] = {"Decimal": Decimal}
    if "numpy" in expr:
        namespace["numpy"] = pytest.importorskip("numpy")
    value = eval(expr, namespace)  # noqa: S307 - test data
    check = normalize_score(value)
    assert check.status == status
    if status == "scored":
        assert check.score == score and type(check.score) is float
    else:
        assert check.score is None  # the raw check has no score; run_evaluation commits 0.0
    assert check.raw_repr == repr(value)


class _FloatLike:
    """A numpy-like scalar: not a numbers.Real, but has __float__."""

    def __float__(self) -> float:
        return 3.5


@pytest.mark.parametrize(
    "value, status, score",
    [
        (0, "scored", 0.0),
        (10, "scored", 10.0),
        (7.25, "scored", 7.25),
        (-0.0, "scored", 0.0),
        (10**400, "scored", 10.0),  # too large for a float, still a finite number
        (-(10**400), "scored", 0.0),
        (Fraction(7, 2), "scored", 3.5),
        (Decimal("1e400"), "scored", 10.0),
        (Decimal("-2.5"), "scored", 0.0),
        (_FloatLike(), "scored", 3.5),
        (Decimal("NaN"), "invalid_reward", None),
        (Decimal("sNaN"), "invalid_reward", None),
        (Decimal("Infinity"), "invalid_reward", None),
        (False, "invalid_reward", None),
        (b"7", "invalid_reward", None),
        (1 + 2j, "invalid_reward", None),
        ([10], "invalid_reward", None),
        (object(), "invalid_reward", None),
    ],
)
def test_normalize_more_values(value: object, status: str, score: float | None) -> None:
    check = normalize_score(value)
    assert check.status == status
    assert check.score == score


def test_normalize_numpy_extras() -> None:
    np = pytest.importorskip("numpy")
    assert normalize_score(np.int64(5)).score == 5.0
    assert normalize_score(np.float64("nan")).status == "invalid_reward"
    assert normalize_score(np.float16("inf")).status == "invalid_reward"
    assert normalize_score(np.bool_(True)).status == "invalid_reward"
    assert normalize_score(np.array([1.0, 2.0])).status == "invalid_reward"
    assert normalize_score(np.complex64(1 + 1j)).status == "invalid_reward"


@pytest.mark.parametrize(
    "value, status, score",
    [
        ({"score": 7}, "scored", 7.0),
        ({"normalized_score_10": 8.5}, "scored", 8.5),
        ({"reward": 3}, "scored", 3.0),
        ({"reward": 30}, "scored", 10.0),
        (
            {"score": 4, "normalized_score_10": 6, "reward": 9},
            "scored",
            6.0,
        ),  # key order: normalized_score_10 first
        ({"normalized_score_10": 6, "reward": 9}, "scored", 6.0),
        ({"score": None, "reward": 9}, "invalid_reward", None),  # first present key decides
        ({"score": float("nan")}, "invalid_reward", None),
        ({"score": "7"}, "invalid_reward", None),
        ({"score": {"score": 7}}, "invalid_reward", None),
        ({"reason": "no score here"}, "invalid_reward", None),
        ({}, "invalid_reward", None),
    ],
)
def test_normalize_dicts(value: dict, status: str, score: float | None) -> None:
    check = normalize_score(value)
    assert check.status == status
    assert check.score == score
    assert check.raw_repr == repr(value)


def test_normalize_dict_keeps_reason_and_artifacts() -> None:
    check = normalize_score({"score": 7, "reason": "partial", "artifacts": {"matched": [1, 2]}})
    assert (check.status, check.score, check.reason, check.artifacts) == (
        "scored",
        7.0,
        "partial",
        {"matched": [1, 2]},
    )
