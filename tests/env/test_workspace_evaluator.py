"""env/workspace/rule_evaluator.py: outputs/answer.json against the task's expected values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.env.helpers import eval_request, eval_spec, load_evaluator, trajectory

workspace_eval = load_evaluator("workspace")
SPEC = eval_spec("workspace")
EXPECTED = {
    "total_by_region": {"North": 780.48, "South": 405.65},
    "order_count": 16,
    "top_customer": "Nguyen, Thi",
}


def _grade(tmp_path: Path, answer_text: str | None, expected=EXPECTED, start_result=None):
    if answer_text is not None:
        (tmp_path / "outputs").mkdir()
        (tmp_path / "outputs" / "answer.json").write_text(answer_text)
    row = {"id": "t", "instruction": "...", "expected": expected, "files_dir": "/nowhere"}
    request = eval_request("workspace", row, start_result, workspace=str(tmp_path))
    return workspace_eval.evaluate(request, SPEC, trajectory())


def test_matching_answer_scores_10(tmp_path: Path) -> None:
    answer = {
        "total_by_region": {"North": 780.4800000001, "South": 405.65, "West": 1.0},
        "order_count": 16.0,
        "top_customer": "  Nguyen, Thi\n",
        "extra": [1, 2],
    }
    result = _grade(tmp_path, json.dumps(answer))
    assert result["score"] == 10
    assert result["reason"] == "all 3 expected keys match"
    assert result["artifacts"]["answer"] == answer


def test_first_mismatched_key_is_named(tmp_path: Path) -> None:
    answer = {"total_by_region": {"North": 780.48, "South": 405.0}, "order_count": 15, "top_customer": "x"}
    result = _grade(tmp_path, json.dumps(answer))
    assert result["score"] == 0
    assert result["reason"] == "mismatch at answer.total_by_region.South: expected 405.65, got 405.0"


def test_missing_key_is_a_mismatch(tmp_path: Path) -> None:
    result = _grade(tmp_path, json.dumps({"total_by_region": {"North": 780.48, "South": 405.65}}))
    assert (result["score"], result["reason"]) == (0, "mismatch at answer.order_count: missing")


def test_malformed_answer_file_scores_0(tmp_path: Path) -> None:
    result = _grade(tmp_path, '{"order_count": 16,')
    assert result["score"] == 0
    assert result["reason"].startswith("outputs/answer.json is not valid JSON: ")


def test_missing_answer_file_scores_0_even_without_a_runtime_result(tmp_path: Path) -> None:
    result = _grade(tmp_path, None, start_result=None)
    assert result == {"score": 0, "reason": "outputs/answer.json is missing", "artifacts": {"answer": None}}


def test_answer_that_is_not_an_object_scores_0(tmp_path: Path) -> None:
    result = _grade(tmp_path, "[16]")
    assert (result["score"], result["reason"]) == (0, "outputs/answer.json is not a JSON object")


def test_no_workspace_scores_0() -> None:
    request = eval_request("workspace", {"id": "t", "expected": EXPECTED}, workspace=None)
    result = workspace_eval.evaluate(request, SPEC, trajectory())
    assert (result["score"], result["reason"]) == (0, "no workspace to grade")


@pytest.mark.parametrize(
    ("expected", "actual", "mismatch"),
    [
        (1, 1.0000005, None),
        (1, 1.00001, "answer: expected 1, got 1.00001"),
        (0, 0, None),
        (1, True, "answer: expected 1, got true"),
        (True, 1, "answer: expected true, got 1"),
        (False, False, None),
        (None, None, None),
        (None, 0, "answer: expected null, got 0"),
        ("a", " a ", None),
        ("7", 7, 'answer: expected "7", got 7'),
        ([1, "b"], [1.0, "b "], None),
        ([1, 2], [1, 2, 3], "answer: expected [1, 2], got [1, 2, 3]"),
        ([{"k": 1}], [{"k": 2}], "answer[0].k: expected 1, got 2"),
        ({"a": {"b": 1}}, {"a": 5}, "answer.a: expected an object, got 5"),
    ],
)
def test_first_mismatch_rules(expected, actual, mismatch) -> None:
    assert workspace_eval.first_mismatch(expected, actual) == mismatch
