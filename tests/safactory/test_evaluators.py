"""Evaluators in Safactory's documented shapes: score key order, export order, keyword calls,
steps read as mappings. Run through ``run_evaluation`` (the launcher-thread path) and the grader
child's function (the sandbox path) alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollout.contract.protocol import SimulationStartResult, Trajectory, TrajectoryStep
from rollout.grading import child
from rollout.grading.evaluation import run_evaluation
from rollout.grading.grader import Grader
from rollout.grading.scoring import normalize_score
from tests.rollout.evaluator_helpers import make_request, make_spec, write_evaluator

KEYWORD_ONLY = """
def evaluate_rule(*, request, spec, trajectory):
    metrics = getattr(request.start_result, "metrics", {}) or {}
    return {"session_id": request.session_id, "eval_id": spec.eval_id, "status": "succeeded",
            "raw_score": metrics["bench_score"], "normalized_score_10": metrics["bench_score"] * 10,
            "reason": "ok", "artifacts": {"metrics": metrics}}
"""
CLASS_AND_HELPER = """
def evaluate(value):
    return 0.0

class RuleEvaluator:
    def evaluate(self, request, spec, trajectory):
        return {"normalized_score_10": 9.1, "score": 0.91}
"""
STEPS = """
def evaluate(request, spec, trajectory):
    last = trajectory.steps[-1]
    assert last["response"] is last.response and last["content"] == last.content
    assert last["response"]["choices"][0]["message"]["content"] == trajectory.final_response
    assert (last["llm_model"], last["session_id"], last["step_id"]) == ("route-a", "s-1", 0)
    return float(len(trajectory.steps)) + (5.0 if last["messages"][0]["role"] == "user" else 0.0)
"""


def _request(bench_score: float = 0.91):  # type: ignore[no-untyped-def]
    return make_request().model_copy(
        update={
            "start_result": SimulationStartResult(
                session_id="s-1", status="succeeded", metrics={"bench_score": bench_score}
            )
        }
    )


def _trajectory() -> Trajectory:
    response = {"choices": [{"message": {"role": "assistant", "content": "42"}}]}
    step = TrajectoryStep(
        seq=0,
        step_id=0,
        model="route-a",
        endpoint="chat.completions",
        status="ok",
        content="42",
        messages=[{"role": "user", "content": "q"}],
        response=response,
    )
    return Trajectory(session_id="s-1", steps=[step], final_response="42")


def _in_child(path: Path, request, trajectory: Trajectory) -> dict:  # type: ignore[no-untyped-def]
    """The grader child's evaluation of one session (what it writes on its result pipe)."""
    job = {
        "evaluator": str(path),
        "request": json.loads(request.model_dump_json()),
        "spec": json.loads(make_spec(path).model_dump_json()),
        "trajectory": json.loads(trajectory.model_dump_json()),
    }
    return child._evaluate(job)


@pytest.mark.parametrize(
    "body, score",
    [(KEYWORD_ONLY, 9.1), (CLASS_AND_HELPER, 9.1), (STEPS, 6.0)],
    ids=["keyword-only evaluate_rule", "RuleEvaluator over evaluate", "steps as mappings"],
)
async def test_documented_forms_score_right_in_the_thread_and_in_the_child(
    tmp_path: Path, body: str, score: float
) -> None:
    path = write_evaluator(tmp_path, "mybench", body)
    done = await run_evaluation(path, _request(), make_spec(path), _trajectory())
    assert (done.status, done.score) == ("scored", pytest.approx(score))
    out = _in_child(path, _request(), _trajectory())
    assert (out["status"], out["score"]) == ("scored", pytest.approx(score))


@pytest.mark.parametrize(
    "value, score",
    [
        ({"normalized_score_10": 9.1, "score": 0.91}, 9.1),  # not 0.91: normalized_score_10 first
        ({"score": 7.0, "reward": 0.7}, 7.0),
        ({"reward": 0.7}, 0.7),  # reward is on the same 0..10 scale: never multiplied
        ({"normalized_score_10": 12, "score": 1}, 10.0),
    ],
)
def test_score_keys_in_safactorys_order(value: dict, score: float) -> None:
    check = normalize_score(value)
    assert (check.status, check.score) == ("scored", score)
    assert check.keys == tuple(k for k in ("normalized_score_10", "score", "reward") if k in value)


@pytest.mark.parametrize("isolation", ["bwrap", "none"])
async def test_more_than_one_score_key_is_warned_once_per_env(
    tmp_path: Path, isolation: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_evaluator(tmp_path / "root", "mybench", CLASS_AND_HELPER)
    async with Grader(isolation, work_dir=tmp_path) as grader:  # type: ignore[arg-type]
        await grader.start([path.parent.parent])
        with caplog.at_level("WARNING", logger="rollout.grading.grader"):
            scores = [
                (
                    await grader.evaluate(
                        path, make_request(session_id=f"s{i}"), make_spec(path), _trajectory(), None
                    )
                ).score
                for i in range(3)
            ]
    assert scores == [9.1, 9.1, 9.1]
    assert [r.getMessage() for r in caplog.records] == [
        "env demo: the evaluator's result carries normalized_score_10, score; 'normalized_score_10' is used "
        "(the order is normalized_score_10 > score > reward)"
    ]
