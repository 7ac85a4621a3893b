"""Our outage is never the agent's 0: the gateway's store fails to record the agent's model calls
(a full disk), the agent gets 500 ``could not record this call`` and reports a failure; the
gateway's own count of unrecorded calls in its close answer makes the attempt an infrastructure
failure (``store_unavailable``): retried, never graded (docs/outcomes.md). A real gateway in this
process (its store made to fail), the scheduler, runtime subprocesses."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import yaml

from rollout.core.plan import session_rows
from rollout.jobs.options import JobContext, JobOptions
from rollout.jobs.pool import Pool
from rollout.jobs.prepare import load_envs
from rollout.results.report import SessionRecord
from store import Store
from tests.fake_upstream import DEFAULT_TEXT, FakeUpstream
from tests.gateway.test_telemetry_modes import fill_the_disk

REPO = Path(__file__).resolve().parents[2]

RUNTIME = """
from env.runtime_kit import chat_completion, openai_client, run_runtime
from rollout.contract.protocol import SimulationStartResult

def main(req):
    completion, _ = chat_completion(openai_client(req, max_retries=0), model=req.model,
                                    messages=[{"role": "user", "content": "hi"}])
    return SimulationStartResult(session_id=req.session_id, status="succeeded",
                                 metrics={"text": completion.choices[0].message.content})

run_runtime(main)
"""

EVALUATOR = f"""
def evaluate(request, spec, trajectory):
    return 10 if trajectory.final_response == {DEFAULT_TEXT!r} else 0
"""


def make_env(root: Path, n: int) -> None:
    env_dir = root / "full"
    (env_dir / "data").mkdir(parents=True)
    (env_dir / "runtime.py").write_text(RUNTIME)
    (env_dir / "rule_evaluator.py").write_text(EVALUATOR)
    (env_dir / "data" / "cases.jsonl").write_text(
        "".join(json.dumps({"id": f"c{i}"}) + "\n" for i in range(n))
    )
    (env_dir / "env.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "full",
                "dataset": {"format": "jsonl", "path": "data/cases.jsonl", "id_field": "id"},
                "runtime": {
                    "command": ["{python}", "{env_dir}/runtime.py"],
                    "timeout_s": 60,
                    "env": {"PYTHONPATH": str(REPO)},
                },
                "max_steps": 4,
            }
        )
    )


@asynccontextmanager
async def job_on_a_full_disk(tmp_path: Path, n: int, full_for: int) -> AsyncIterator[list[SessionRecord]]:
    """Run ``n`` sessions (one call each, up to one retry) on a gateway whose store fails the
    first ``full_for`` commits of a step; yields the records."""
    from gateway.settings import GatewaySettings
    from tests.gateway.conftest import serve

    make_env(tmp_path / "envs", n)
    db = tmp_path / "t.db"
    async with FakeUpstream() as up:
        gw = await serve(
            GatewaySettings.model_validate(
                {
                    "storage_config": {"db_url": f"sqlite://{db}"},
                    "llm_routes": {"fake": {"base_url": up.base_url}},
                }
            )
        )
        store = Store(f"sqlite://{db}")
        try:
            await store.init()
            fill_the_disk(gw, times=full_for)
            opts = JobOptions.model_validate(
                {
                    "agent_root": tmp_path / "envs",
                    "gateway_config": tmp_path / "x.yaml",
                    "llm_model": "fake",
                    "sandbox": "none",
                }
            )
            envs = load_envs(opts)
            rows = session_rows("jf", "fake", envs, 1, None)
            await store.add_job_sessions(rows)
            opts = opts.model_copy(
                update={"pool_size": 2, "enable_evaluation": True, "retry_backoff_s": 0.01, "max_retries": 1}
            )
            ctx = JobContext(job_id="jf", gateway_url=f"{gw.url}/v1/sessions", models=("fake",))
            yield await asyncio.wait_for(Pool(store, opts, ctx, {c.name: c for c, _ in envs}).run(rows), 120)
        finally:
            await store.close()
            await gw.stop()


def q(db: Path, sql: str) -> list[tuple[Any, ...]]:
    con = sqlite3.connect(db)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


async def test_calls_the_gateway_could_not_record_are_an_outage_never_the_agents_0(tmp_path: Path) -> None:
    async with job_on_a_full_disk(tmp_path, n=2, full_for=1_000_000) as records:
        pass
    assert len(records) == 2
    for r in records:
        assert (r.status, r.outcome, r.score, r.eval_status) == (
            "error",
            "store_unavailable",
            None,
            "infra_error",
        )
        assert r.reason == "not graded: infrastructure failure (store_unavailable) in attempt 2"
        assert [(a.outcome, a.infra) for a in r.attempts] == [("store_unavailable", True)] * 2
        for a in (
            r.attempts
        ):  # the runtime's words (a 500 it calls an upstream outage) follow the gateway's record
            assert (a.reason or "").startswith(
                "the gateway could not record 1 model call(s) of the session (its store failed); "
                "InternalServerError: Error code: 500"
            ), a.reason
    assert (
        q(tmp_path / "t.db", "SELECT reward, eval_status, outcome FROM job_environments")
        == [(None, "infra_error", "store_unavailable")] * 2
    )


async def test_the_retry_after_the_disk_is_freed_is_graded(tmp_path: Path) -> None:
    async with job_on_a_full_disk(tmp_path, n=1, full_for=1) as records:
        pass
    [r] = records
    assert (r.status, r.outcome, r.score, r.eval_status) == ("succeeded", "succeeded", 10.0, "scored")
    assert [(a.outcome, a.infra) for a in r.attempts] == [("store_unavailable", True), ("succeeded", False)]
    assert q(tmp_path / "t.db", "SELECT reward, outcome, attempts FROM job_environments") == [
        (10.0, "succeeded", 2)
    ]
