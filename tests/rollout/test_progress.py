"""Tests for rollout.results.progress: what the launcher's progress display counts and prints, from
records built here and an elapsed time passed in (no clock)."""

from __future__ import annotations

import pytest

from rollout.results.progress import ProgressState, record_problems
from rollout.results.report import AttemptRecord, SessionRecord


def rec(env: str, idx: int, score: float | None, eval_status: str | None = "scored", status: str = "succeeded",
        outcome: str | None = None, retried: bool = False) -> SessionRecord:
    return SessionRecord(session_id=f"{env}-{idx}", job_id="j", env_name=env, case_id=f"c{idx}",
                         group_id=f"g{idx}", model="m", sample_index=0, status=status,  # type: ignore[arg-type]
                         score=score, eval_status=eval_status, outcome=outcome, retried=retried,
                         attempts=[AttemptRecord(attempt=1, status=status, outcome=outcome or status,
                                                 steps_session_id=f"{env}-{idx}")])


def test_counts_per_env_running_mean_and_problems() -> None:
    state = ProgressState(totals={"gsm8k": 6, "workspace": 5})
    assert state.describe(0.0) == ("gsm8k 0/6 mean - | workspace 0/5 mean - | mean - | problems none | "
                                   "- sessions/min")
    for r in [
        rec("gsm8k", 0, 10.0),
        rec("gsm8k", 1, 5.0, retried=True),
        rec("gsm8k", 2, 0.0, eval_status="error"),  # an evaluator error: no score in the mean
        rec("workspace", 0, 4.0, status="failed"),  # failed is a normal result, not a problem
        rec("workspace", 1, None, eval_status=None, status="timeout"),
        rec("workspace", 2, None, eval_status=None, status="error", outcome="gateway_unreachable"),
    ]:
        state.update(r)
    assert (state.n_done, state.n_total) == (6, 11)
    assert state.mean_score("gsm8k") == pytest.approx(7.5)
    assert state.mean_score("workspace") == pytest.approx(4.0)
    assert state.mean_score() == pytest.approx((10 + 5 + 4) / 3)
    assert state.describe(120.0) == (
        "gsm8k 3/6 mean 7.50 | workspace 3/5 mean 4.00 | mean 6.33 | "
        "problems ev_err 1, rt_err 1, rt_t/o 1, retried 1, infra 1 | 3.0 sessions/min")


def test_record_problems_and_an_env_that_was_not_planned() -> None:
    assert record_problems(rec("a", 0, 3.0)) == []
    assert record_problems(rec("a", 0, None, eval_status="timeout", retried=True)) == ["ev_t/o", "retried"]
    # the same problems as the summary table's: a truncated session, an invalid reward
    assert record_problems(rec("a", 0, 0.0, status="truncated")) == ["trunc"]
    assert record_problems(rec("a", 0, None, eval_status="invalid_reward")) == ["inval"]
    state = ProgressState(totals={"a": 1})
    state.update(rec("b", 0, 2.0))
    assert state.describe(30.0) == "a 0/1 mean - | b 1/1 mean 2.00 | mean 2.00 | problems none | 2.0 sessions/min"
