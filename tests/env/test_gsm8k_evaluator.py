"""env/gsm8k/rule_evaluator.py: answer extraction and numeric grading, on shipped and real GSM8K rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollout.contract.protocol import SimulationStartResult
from tests.env.helpers import ENV_ROOT, eval_request, eval_spec, load_evaluator, trajectory

gsm8k = load_evaluator("gsm8k")
SPEC = eval_spec("gsm8k")
ROW = {"question": "How many?", "answer": "Nine eggs left.\n9 * 2 = <<9*2=18>>18\n#### 18"}


def _evaluate(row, *contents, start_result=None):
    return gsm8k.evaluate(eval_request("gsm8k", row, start_result), SPEC, trajectory(*contents))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Step 1...\n#### 18", "18"),
        ("#### 1,450,000", "1450000"),
        ("The answer is $1,250.", "1250"),
        ("She owes -$5 in the end", "-5"),
        ("#### -10", "-10"),
        ("It is 3.5.", "3.5"),
        ("#### $18.00", "18.00"),
        ("first 7, then #### 12 and later 99", "12"),
        ("#### 4 ... wait, #### 5", "5"),
        ("I think 17 apples, no, 19 apples", "19"),
        ("#### (no number here) but 21 before? no: 21", "21"),
        ("#### ", None),
        ("no digits at all", None),
        ("", None),
        (None, None),
        ("1,2,3", "3"),
        ("ratio .5 of it", ".5"),
    ],
)
def test_extract_answer(text, expected) -> None:
    assert gsm8k.extract_answer(text) == expected


def test_reference_answer_and_malformed_rows() -> None:
    assert gsm8k.reference_answer("a\n#### 2,125") == "2125"
    with pytest.raises(ValueError, match="no '#### <number>' line"):
        gsm8k.reference_answer("The answer is 18")
    with pytest.raises(ValueError, match="no number after '####'"):
        gsm8k.reference_answer("#### eighteen")


def test_correct_answer_scores_10() -> None:
    result = _evaluate(ROW, "Let me think.", "9 * 2 = 18\n#### 18")
    assert result["score"] == 10
    assert result["reason"] == "expected 18, got 18"
    assert result["artifacts"] == {"expected": "18", "got": "18", "source": "final_response"}


def test_equal_number_in_another_format_scores_10() -> None:
    assert _evaluate(ROW, "She makes $18.00 a day.")["score"] == 10


def test_wrong_answer_scores_0_with_reason() -> None:
    result = _evaluate(ROW, "#### 17")
    assert result["score"] == 0
    assert result["reason"] == "expected 18, got 17"


def test_answer_without_a_number_scores_0() -> None:
    result = _evaluate(ROW, "I do not know.")
    assert result["score"] == 0
    assert result["reason"] == "expected 18, got no number (1 steps)"


def test_empty_trajectory_and_no_runtime_result_score_0() -> None:
    result = _evaluate(ROW)
    assert result == {
        "score": 0,
        "reason": "expected 18, got no number (0 steps)",
        "artifacts": {"expected": "18", "got": None, "source": None},
    }


def test_the_runtimes_claimed_answer_is_never_graded() -> None:
    # the result line is the agent's words: a right answer claimed there without the model saying it scores 0
    start = SimulationStartResult(
        session_id="sess-1",
        status="succeeded",
        metrics={"extracted_answer": "18", "completion_text": "#### 18"},
    )
    result = _evaluate(ROW, start_result=start)
    assert result == {
        "score": 0,
        "reason": "expected 18, got no number (0 steps)",
        "artifacts": {"expected": "18", "got": None, "source": None},
    }


@pytest.mark.parametrize(
    ("a", "b", "equal"),
    [
        ("18", "18.00", True),
        ("1450000", "1450001", False),
        ("10.35", "10.35000001", True),
        ("10.35", "10.36", False),
        ("-10", "10", False),
        (".5", "0.5", True),
    ],
)
def test_numbers_equal(a, b, equal) -> None:
    assert gsm8k.numbers_equal(a, b) is equal


def test_malformed_case_raises_value_error() -> None:
    with pytest.raises(ValueError, match="malformed gsm8k case"):
        _evaluate({"question": "q", "answer": "18"}, "#### 18")


def test_shipped_cases_are_gsm8k_rows_graded_by_their_own_solution() -> None:
    lines = (ENV_ROOT / "gsm8k" / "data" / "cases.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert len(rows) == 6
    assert all(set(row) == {"question", "answer"} for row in rows)
    answers = [gsm8k.reference_answer(row["answer"]) for row in rows]
    assert answers == ["33", "255", "450", "125000", "125", "10.35"]
    for row in rows:
        assert _evaluate(row, row["answer"])["score"] == 10


def test_real_gsm8k_rows(public_data: Path) -> None:
    real = public_data / "gsm8k" / "test.jsonl"
    rows = [json.loads(line) for line in real.read_text().splitlines() if line.strip()]
    assert len(rows) == 1319
    for row in rows:
        expected = gsm8k.reference_answer(row["answer"])
        # The reference solution itself, as a model would write it, scores 10; off by one scores 0.
        assert _evaluate(row, row["answer"])["score"] == 10, row["answer"]
        off_by_one = str(float(expected) + 1) if "." in expected else str(int(expected) + 1)
        wrong = _evaluate(row, f"#### {off_by_one}")
        assert (wrong["score"], wrong["reason"]) == (0, f"expected {expected}, got {off_by_one}")
    first = _evaluate(rows[0], "She sells 9 eggs and makes $18 every day.")
    assert (first["score"], first["reason"]) == (10, "expected 18, got 18")
