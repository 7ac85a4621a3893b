"""One attempt, without a pool or a gateway: ``rollout.jobs.attempt.Attempts`` driven with a fake
executor (what the runtime did) and a fake gateway closer (what the gateway answered)."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rollout.contract.protocol import SimulationStartRequest, SimulationStartResult
from rollout.core.envs import EnvConfig
from rollout.core.plan import session_rows
from rollout.grading.grader import Grader
from rollout.jobs.attempt import Attempts, Retry, Work
from rollout.jobs.options import JobContext, JobOptions
from rollout.jobs.prepare import load_envs
from rollout.sandbox.runtime_local import RuntimeRun
from store import Store

# the agent's answer is the file it leaves; "crash" in it makes the evaluator raise (the agent's bytes)
EVALUATOR = """
from pathlib import Path

def evaluate(request, spec, trajectory):
    answer = Path(request.workspace, "answer.txt")
    text = answer.read_text() if answer.exists() else ""
    if "crash" in text or request.env_params.get("broken"):
        raise RuntimeError("the evaluator fell over")
    return 10 if text == "42" else 0
"""


@dataclass
class FakeGateway:
    """Answers every close with ``answer`` and remembers what was closed."""

    answer: dict[str, Any] = field(default_factory=lambda: {"total_steps": 0})
    closed: list[tuple[str, str]] = field(default_factory=list)

    async def close(self, sid: str, status: str) -> dict[str, Any]:
        self.closed.append((sid, status))
        return dict(self.answer)


@dataclass
class FakeBreaker:
    ends: list[bool] = field(default_factory=list)
    suspected: int = 0

    def record(self, infra: bool) -> None:
        self.ends.append(infra)

    def suspect(self) -> None:
        self.suspected += 1


class FakeExecutor:
    """Plays one scripted runtime run per attempt: writes ``answer`` into the workspace, then
    returns the run (``setup_failed``: the launcher could not start it)."""

    def __init__(self, *runs: tuple[str, RuntimeRun]) -> None:
        self.runs = list(runs)
        self.requests: list[SimulationStartRequest] = []

    async def __call__(
        self,
        cfg: EnvConfig,
        request: SimulationStartRequest,
        workspace: Path,
        extra_env: dict[str, str],
        job_mode: str = "bwrap",
        **kw: Any,
    ) -> RuntimeRun:
        self.requests.append(request)
        answer, run = self.runs.pop(0)
        if answer:
            (workspace / "answer.txt").write_text(answer)
        return run


def ran(status: str = "succeeded", **kw: Any) -> RuntimeRun:
    result = (
        SimulationStartResult(session_id="x", status=status) if status in ("succeeded", "failed") else None
    )
    return RuntimeRun(status=status, result=result, duration_s=0.1, **kw)


@dataclass
class Setup:
    attempts: Attempts
    gateway: FakeGateway
    breaker: FakeBreaker
    store: Store
    work: Work
    broken: list[str]


@asynccontextmanager
async def one_session(
    tmp_path: Path,
    executor: FakeExecutor,
    graded: bool = True,
    params: dict[str, Any] | None = None,
    **opts: Any,
) -> AsyncIterator[Setup]:
    env = tmp_path / "envs" / "answer"
    (env / "data").mkdir(parents=True)
    (env / "data" / "cases.jsonl").write_text(json.dumps({"id": "c1", "q": "6*7?"}) + "\n")
    (env / "rule_evaluator.py").write_text(EVALUATOR)
    (env / "env.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "answer",
                "dataset": {"format": "jsonl", "path": "data/cases.jsonl", "id_field": "id"},
                "runtime": {"command": ["{python}", "-c", "pass"]},
                "params": params or {},
            }
        )
    )
    options = JobOptions.model_validate(
        {
            "agent_root": tmp_path / "envs",
            "gateway_config": tmp_path / "unused.yaml",
            "llm_model": ["m"],
            "enable_evaluation": graded,
            "sandbox": "none",
            "retry_backoff_s": 0.0,
            **opts,
        }
    )
    envs = load_envs(options)
    store = Store(f"sqlite://{tmp_path / 't.db'}")
    await store.init()
    [row] = session_rows("ja", "m", envs, 1, None)
    await store.add_job_sessions([row])
    (tmp_path / "ws").mkdir()
    ctx = JobContext(
        job_id="ja",
        gateway_url="http://127.0.0.1:9/v1/sessions",
        models=("m",),
        workspace_root=tmp_path / "ws",
    )
    gateway, breaker, broken = FakeGateway(), FakeBreaker(), []
    attempts = Attempts(
        store,
        options,
        ctx,
        {cfg.name: cfg for cfg, _ in envs},
        gateway,
        breaker=breaker,
        executor=executor,
        rng=random.Random(0),
        on_grader_broken=lambda env, _: broken.append(env),
    )
    try:
        async with Grader("none", work_dir=tmp_path / "ws") as grader:
            await grader.start([tmp_path / "envs"])
            attempts.grader = grader if graded else None
            yield Setup(attempts, gateway, breaker, store, Work(row, 1, 1, []), broken)
            await attempts.aclose()
    finally:
        await store.close()


async def test_a_solved_attempt_finishes_the_session_with_its_score(tmp_path: Path) -> None:
    ex = FakeExecutor(("42", ran("succeeded")))
    async with one_session(tmp_path, ex) as s:
        record = await s.attempts.run(s.work)
        [row] = await s.store.job_sessions("ja")
    assert not isinstance(record, Retry)
    assert (record.status, record.outcome, record.score, record.eval_status) == (
        "succeeded",
        "succeeded",
        10.0,
        "scored",
    )
    assert s.gateway.closed == [(s.work.row.session_id, "succeeded")]
    assert s.breaker.ends == [False]
    assert ex.requests[0].gateway_base_url == f"http://127.0.0.1:9/v1/sessions/{s.work.row.session_id}"
    assert "answer" not in json.dumps(ex.requests[0].env_params)  # nothing of the grading is handed over
    assert (row.finished, row.reward, row.attempts) == (True, 10.0, 1)
    assert list((tmp_path / "ws").iterdir()) == []  # the workspace is removed


async def test_a_runtime_error_is_the_agents_and_graded_on_its_workspace(tmp_path: Path) -> None:
    ex = FakeExecutor(("41", ran("error", error_text="Traceback: boom", returncode=1)))
    async with one_session(tmp_path, ex) as s:
        record = await s.attempts.run(s.work)
    assert not isinstance(record, Retry)
    assert (record.status, record.outcome, record.score, record.attempts[-1].infra) == (
        "error",
        "runtime_error",
        0.0,
        False,
    )
    assert s.breaker.ends == [False]


async def test_an_infrastructure_failure_is_retried_then_the_retry_finishes(tmp_path: Path) -> None:
    ex = FakeExecutor(
        ("", ran("error", setup_failed=True, error_text="bwrap: cannot mount")), ("42", ran("succeeded"))
    )
    async with one_session(tmp_path, ex, max_retries=1) as s:
        first = await s.attempts.run(s.work)
        assert isinstance(first, Retry) and first.delay_s == 0.0
        assert (s.work.attempt, [a.outcome for a in s.work.attempts]) == (2, ["setup_failed"])
        second = await s.attempts.run(s.work)
    assert not isinstance(second, Retry)
    assert (second.status, second.score, [(a.outcome, a.infra) for a in second.attempts]) == (
        "succeeded",
        10.0,
        [("setup_failed", True), ("succeeded", False)],
    )
    assert [status for _, status in s.gateway.closed] == [
        "error",
        "retry",
        "succeeded",
    ]  # closed again before
    assert s.breaker.ends == [True, False]


async def test_an_infrastructure_failure_without_retries_left_is_never_graded(tmp_path: Path) -> None:
    ex = FakeExecutor(("42", ran("error", setup_failed=True, error_text="bwrap: cannot mount")))
    async with one_session(tmp_path, ex, max_retries=0) as s:
        record = await s.attempts.run(s.work)
        [row] = await s.store.job_sessions("ja")
    assert not isinstance(record, Retry)
    assert (record.status, record.outcome, record.score, record.eval_status) == (
        "error",
        "setup_failed",
        None,
        "infra_error",
    )
    assert (row.finished, row.reward) == (True, None)


async def test_a_retry_whose_session_will_not_close_uses_no_attempt(tmp_path: Path) -> None:
    ex = FakeExecutor()
    async with one_session(tmp_path, ex) as s:
        s.gateway.answer = {"error": "closing the gateway session failed: HTTP 503"}
        s.work.attempt = 2  # an earlier attempt failed on infrastructure
        again = await s.attempts.run(s.work)
    assert isinstance(again, Retry)
    assert (s.work.attempt, s.work.close_failures, s.breaker.suspected, ex.requests) == (2, 1, 1, [])


async def test_a_grader_the_agents_answer_crashes_is_the_agents_zero(tmp_path: Path) -> None:
    ex = FakeExecutor(("crash", ran("succeeded")))
    async with one_session(tmp_path, ex) as s:
        record = await s.attempts.run(s.work)
        [row] = await s.store.job_sessions("ja")
    assert not isinstance(record, Retry)
    assert (record.score, record.eval_status, s.broken) == (0.0, "error", [])
    assert row.eval_detail is not None and row.eval_detail["control"]["status"] == "scored"


async def test_a_grader_that_fails_without_the_agent_is_broken_and_excluded(tmp_path: Path) -> None:
    ex = FakeExecutor(("42", ran("succeeded")))
    async with one_session(tmp_path, ex, params={"broken": True}) as s:
        record = await s.attempts.run(s.work)
    assert not isinstance(record, Retry)
    assert (record.score, record.eval_status, s.broken) == (None, "grader_broken", ["answer"])


async def test_an_ungraded_job_finishes_without_a_grade(tmp_path: Path) -> None:
    ex = FakeExecutor(("42", ran("succeeded")))
    async with one_session(tmp_path, ex, graded=False) as s:
        record = await s.attempts.run(s.work)
    assert not isinstance(record, Retry)
    assert (record.status, record.score, record.eval_status) == ("succeeded", None, None)
