"""``launcher.py serve``: a trainer submits batches to one long-running process and reads their
groups back from its feed; the gateway is started once and serves every batch."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import sys
from pathlib import Path
from typing import Any

import httpx
import yaml

from rollout.servers.feed.client import FeedClient
from store import SessionStep
from tests.fake_upstream import FakeRequest, FakeUpstream, Reply, chat_completion
from tests.feed.helpers import ENV, REPO, make_env


def read_groups(url: str, job_id: str) -> list[dict[str, Any]]:
    with FeedClient(url) as c:
        return [g.model_dump() for g in c.groups(job_id, wait_s=5, view="scores")]


async def test_batches_run_one_after_another_on_one_gateway(tmp_path: Path) -> None:
    make_env(tmp_path / "envs")
    db = tmp_path / "trajs.db"
    async with FakeUpstream() as up:
        cfg = tmp_path / "gw.yaml"
        cfg.write_text(
            yaml.safe_dump(
                {
                    "storage_config": {"db_url": f"sqlite://{db}"},
                    "llm_routes": {"fake": {"base_url": up.base_url}},
                }
            )
        )
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(REPO / "launcher.py"),
            "serve",
            "--agent-root",
            str(tmp_path / "envs"),
            "--gateway-config",
            str(cfg),
            "--llm-model",
            "fake",
            "--db-path",
            f"sqlite://{db}",
            "--port",
            "0",
            "--pool-size",
            "2",
            "--poll-interval-s",
            "0.05",
            cwd=str(tmp_path),
            env=ENV,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            assert proc.stdout is not None
            line = (await asyncio.wait_for(proc.stdout.readline(), 180)).decode()
            assert line.startswith("serve on http://127.0.0.1:"), line
            url = line.split()[2].rstrip("/")
            async with httpx.AsyncClient(base_url=url, timeout=60) as http:
                gateway = (await http.get("/v1/serve")).json()["gateway_url"]
                r = await http.post(
                    "/v1/batches",
                    json={"envs": ["toy"], "samples": 2, "cases": {"toy": ["b", "a"]}, "job_id": "first"},
                )
                assert r.status_code == 202, r.text
                assert {k: r.json()[k] for k in ("job_id", "sessions", "groups", "feed")} == {
                    "job_id": "first",
                    "sessions": 4,
                    "groups": 2,
                    "feed": "/v1/jobs/first/groups",
                }
                first = await asyncio.to_thread(read_groups, url, "first")
                assert sorted(g["case_id"] for g in first) == ["a", "b"]
                for g in first:
                    assert [s["score"] for s in g["samples"]] == [10.0, 0.0]

                r = await http.post("/v1/batches", json={"envs": ["toy"], "samples": 3, "limit": 1})
                assert r.status_code == 202, r.text
                second_id = r.json()["job_id"]
                (g2,) = await asyncio.to_thread(read_groups, url, second_id)
                assert g2["case_id"] == "a" and [s["score"] for s in g2["samples"]] == [10.0, 0.0, 0.0]

                # bad batches are refused with the reason, and run nothing
                for body, status, text in (
                    ({"envs": ["nope"]}, 400, "no such env"),
                    ({"envs": ["toy"], "cases": {"toy": ["zz"]}}, 400, "has no case ['zz']"),
                    ({"envs": ["toy"], "job_id": "first"}, 409, "already exists"),
                    (
                        {"envs": ["toy"], "sample": 2},
                        400,
                        "invalid /v1/batches body: unknown field 'sample' (known: ",
                    ),
                    (
                        {"envs": ["toy"], "samples": 0},
                        400,
                        "invalid /v1/batches body: field 'samples': Input "
                        "should be greater than or equal to 1 (got 0)",
                    ),
                    (
                        {"envs": ["toy"], "samples": 10**11},
                        400,
                        "field 'samples': Input should be less than or equal to 10000 (got 100000000000)",
                    ),
                    ({"envs": ["toy"], "model": "nope"}, 400, "no route 'nope'"),
                ):
                    r = await http.post("/v1/batches", json=body)
                    assert r.status_code == status and text in r.json()["error"]["message"], (body, r.text)

                # a policy version is set on the gateway before the batch runs, and stamped on its steps
                r = await http.post(
                    "/v1/batches",
                    json={"envs": ["toy"], "limit": 1, "samples": 2, "job_id": "pv", "policy_version": 5},
                )
                if "policy_version" in SessionStep.__table__.c:  # type: ignore[attr-defined]
                    assert r.status_code == 202, r.text
                    (g3,) = await asyncio.to_thread(read_groups, url, "pv")
                    assert [s["policy_versions"] for s in g3["samples"]] == [[5], [5]]
                    # a later batch without one runs at the version the gateway was left at, and says so
                    r = await http.post(
                        "/v1/batches", json={"envs": ["toy"], "limit": 1, "job_id": "pv-kept"}
                    )
                    assert r.status_code == 202 and r.json()["policy_version"] is None, r.text
                    (g4,) = await asyncio.to_thread(read_groups, url, "pv-kept")
                    assert [s["policy_versions"] for s in g4["samples"]] == [[5]]
                    assert (await http.get("/v1/batches/pv-kept")).json()["policy_version"] == 5
                else:  # a gateway without policy versions: refused, never run unversioned
                    assert r.status_code == 400 and "has no policy versions" in r.json()["error"]["message"]

                listed = {b["job_id"]: b["state"] for b in (await http.get("/v1/batches")).json()["batches"]}
                assert listed["first"] == listed[second_id] == "done"
                assert (await http.get("/v1/serve")).json()[
                    "gateway_url"
                ] == gateway  # the same gateway throughout
                assert (await http.get("/v1/batches/none")).status_code == 404
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(proc.wait(), 120)
    assert code == 0


async def test_sigterm_cancels_the_batch_in_flight_and_leaves_it_for_resume(tmp_path: Path) -> None:
    make_env(tmp_path / "envs")
    db = tmp_path / "trajs.db"
    hold = asyncio.Event()

    async def held(req: FakeRequest) -> Reply:
        await hold.wait()
        return Reply.json(chat_completion("late"))

    async with FakeUpstream() as up:
        up.script("/v1/chat/completions", [held] * 4)
        cfg = tmp_path / "gw.yaml"
        cfg.write_text(
            yaml.safe_dump(
                {
                    "storage_config": {"db_url": f"sqlite://{db}"},
                    "llm_routes": {"fake": {"base_url": up.base_url}},
                }
            )
        )
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(REPO / "launcher.py"),
            "serve",
            "--agent-root",
            str(tmp_path / "envs"),
            "--gateway-config",
            str(cfg),
            "--llm-model",
            "fake",
            "--db-path",
            f"sqlite://{db}",
            "--port",
            "0",
            "--pool-size",
            "2",
            cwd=str(tmp_path),
            env=ENV,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            assert proc.stdout is not None
            url = (await asyncio.wait_for(proc.stdout.readline(), 180)).decode().split()[2].rstrip("/")
            async with httpx.AsyncClient(base_url=url, timeout=60) as http:
                r = await http.post(
                    "/v1/batches", json={"envs": ["toy"], "samples": 2, "limit": 1, "job_id": "b"}
                )
                assert r.status_code == 202, r.text
            await up.wait_for_requests(2, timeout=180)  # both sessions are waiting for the model
            proc.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(proc.wait(), 180)
        finally:
            hold.set()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert code == 0
    con = sqlite3.connect(db)
    try:
        assert con.execute("SELECT status, finished FROM job_environments WHERE job_id = 'b'").fetchall() == [
            ("cancelled", 0),
            ("cancelled", 0),
        ]
        assert con.execute("SELECT count(*) FROM feed_groups WHERE job_id = 'b'").fetchone() == (0,)
    finally:
        con.close()


async def test_a_batch_refuses_a_missing_evaluator_exactly_as_a_job_does(tmp_path: Path) -> None:
    """``serve`` accepts a batch on the launcher's own path (``rollout.jobs.prepare.select_envs``):
    an env with no evaluator is refused with the job's message, and nothing is planned."""
    import pytest

    from gateway.settings import GatewaySettings
    from rollout.core.setup import SetupError
    from rollout.jobs.options import JobOptions
    from rollout.jobs.run import run_job
    from rollout.servers.batches import BatchError, BatchRequest, BatchService
    from store import Store
    from tests.gateway.conftest import serve

    make_env(tmp_path / "envs")
    (tmp_path / "envs" / "toy" / "rule_evaluator.py").unlink()
    db = tmp_path / "t.db"
    opts = JobOptions(
        agent_root=tmp_path / "envs",
        gateway_config=tmp_path / "unused.yaml",
        llm_model=["fake"],
        db_path=f"sqlite://{db}",
        enable_evaluation=True,
        sandbox="none",
    )
    with pytest.raises(SetupError) as job:
        await run_job(opts)
    assert "--enable-evaluation: no evaluator: env 'toy' needs" in str(job.value)
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
            service = BatchService(store, opts, f"{gw.url}/v1/sessions", None, "fake")
            with pytest.raises(BatchError) as batch:
                await service.submit(BatchRequest(envs=["toy"], job_id="b1"))
            assert await store.job_sessions("b1") == []
        finally:
            await store.close()
            await gw.stop()
    assert (str(batch.value), batch.value.status) == (str(job.value), 400)
