"""Attempts end to end: the real gateway (started by the launcher, or as a subprocess the test
kills and restarts), the fake upstream as the model, real runtime subprocesses whose faults are
injected deterministically from their case row and the attempt number in the start request."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from rollout.jobs.breaker import BreakerEvent
from rollout.jobs.options import JobContext, JobOptions
from rollout.jobs.processes import free_port
from rollout.jobs.run import JobResult, run_job
from rollout.results.report import render_table, summarize
from tests.fake_upstream import DEFAULT_TEXT, FakeRequest, FakeUpstream, Reply

REPO = Path(__file__).resolve().parents[2]

RUNTIME = """
import os, sys, time
from pathlib import Path
import openai
from env.runtime_kit import chat_completion, openai_client, run_runtime
from rollout.contract.protocol import SimulationStartResult

def main(req):
    row, attempt = req.env_params["dataset"], req.metadata["attempt"]
    fault = row.get("fault") if attempt == 1 else None
    down = row.get("down_until")  # the model server answers 503 until this file exists
    if fault == "crash":
        os._exit(3)  # dies before printing a result and before any model call
    client = openai_client(req, max_retries=0)
    if fault == "gateway":  # claims the gateway cannot be reached: its client points elsewhere
        client = openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="x", max_retries=0)
    text = None
    for i in range(row.get("calls", 1)):
        if i == 1 and row.get("wait_for") and attempt == 1:
            while not Path(row["wait_for"]).exists():
                time.sleep(0.05)
        q = "FAIL-503" if fault == "upstream" or (down and not Path(down).exists()) else row["q"]
        try:
            completion, _ = chat_completion(client, model=req.model, messages=[{"role": "user", "content": q}])
        except openai.APIConnectionError as e:
            if row.get("silent"):  # swallows the error: reports a plain failure, claims nothing
                return SimulationStartResult(session_id=req.session_id, status="failed", error_text=str(e))
            raise
        text = completion.choices[0].message.content
    if row.get("crash_after_call"):
        os._exit(4)
    if row.get("garbage"):  # an unparsable last line, exit 0
        sys.__stdout__.write("this is not a result\\n")
        sys.__stdout__.flush()
        os._exit(0)
    if row.get("claim"):  # a hostile runtime: fakes an outage after the model answered
        return SimulationStartResult(session_id=req.session_id, status="failed", error_class=row["claim"],
                                     error_text="InternalServerError: Error code: 503")
    status = "failed" if row.get("agent_fails") else "succeeded"
    return SimulationStartResult(session_id=req.session_id, status=status, metrics={"text": text})

run_runtime(main)
"""

EVALUATOR = """
def evaluate(request, spec, trajectory):
    return 10 if trajectory.final_response == "hello from fake" else 2
"""


def signal_file(tmp: Path, name: str) -> Path:
    """A file the test creates to change what later runtimes do: in the env's ``signals/`` folder,
    which the sandbox shows the runtime (read-only, live), unlike the rest of the host."""
    return tmp / "envs" / "flaky" / "signals" / name


def make_env(root: Path, cases: list[dict[str, Any]], timeout_s: float = 60) -> Path:
    env_dir = root / "flaky"
    (env_dir / "data").mkdir(parents=True, exist_ok=True)
    (env_dir / "signals").mkdir(exist_ok=True)
    (env_dir / "runtime.py").write_text(RUNTIME)
    (env_dir / "rule_evaluator.py").write_text(EVALUATOR)
    (env_dir / "data" / "cases.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cases))
    (env_dir / "env.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "flaky",
                "dataset": {"format": "jsonl", "path": "data/cases.jsonl", "id_field": "id"},
                "runtime": {"command": ["{python}", "{env_dir}/runtime.py"], "timeout_s": timeout_s},
                "max_steps": 4,
            }
        )
    )
    return env_dir


def gateway_config(path: Path, upstream: FakeUpstream, db: Path) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "storage_config": {"db_url": f"sqlite://{db}"},
                "llm_routes": {"fake": {"base_url": upstream.base_url, "retry": {"max_attempts": 1}}},
            }
        )
    )
    return path


def options(tmp: Path, cfg: Path, db: Path, **kw: Any) -> JobOptions:
    return JobOptions.model_validate(
        {
            "agent_root": tmp / "envs",
            "gateway_config": cfg,
            "llm_model": "fake",
            "db_path": f"sqlite://{db}",
            "enable_evaluation": True,
            "out": tmp / "out.jsonl",
            "retry_backoff_s": 0.05,
            **kw,
        }
    )


def q(db: Path, sql: str) -> list[tuple[Any, ...]]:
    con = sqlite3.connect(db)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def fail_503(req: FakeRequest) -> Reply | None:
    if b"FAIL-503" in req.body:
        return Reply.json({"error": {"message": "overloaded", "type": "server_error"}}, status=503)
    return None


async def test_only_evidence_the_agent_cannot_write_makes_an_attempt_an_infrastructure_failure(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A real outage (the model server answers 503: the gateway's record shows it) is retried and
    kept; what a runtime says (an ``error_class`` it claims, a crash, an unparsable result line,
    with or without answered model calls) is the agent's outcome: graded once, never retried,
    never a NULL reward."""
    cases: list[dict[str, Any]] = [{"id": f"ok{i}", "q": "hi"} for i in range(5)]
    cases += [
        {"id": "crash", "q": "hi", "fault": "crash"},  # runtime dies before any call
        {"id": "gateway", "q": "hi", "fault": "gateway"},  # claims the gateway is unreachable
        {"id": "upstream", "q": "hi", "fault": "upstream"},  # the model server answers 503
        {"id": "agent_fails", "q": "hi", "agent_fails": True},  # the agent's failure: final
        {"id": "crash_after", "q": "hi", "crash_after_call": True},  # broke after an answer: final
        # hostile runtimes: an outage claimed after the model answered 200, on every attempt
        {"id": "claims_upstream", "q": "hi", "claim": "upstream_unavailable"},
        {"id": "claims_gateway", "q": "hi", "claim": "gateway_unreachable"},
        # no valid result line, without and with a model call
        {"id": "garbage_no_call", "q": "hi", "calls": 0, "garbage": True},
        {"id": "garbage_after_call", "q": "hi", "garbage": True},
    ]
    make_env(tmp_path / "envs", cases)
    db = tmp_path / "t.db"
    async with FakeUpstream() as up:
        up.add_rule(fail_503)
        cfg = gateway_config(tmp_path / "gw.yaml", up, db)
        result = await run_job(options(tmp_path, cfg, db, pool_size=3, job_id="j30"))
        calls = [r for r in up.requests if r.path.endswith("/chat/completions")]

    by_case = {r.case_id: r for r in result.records}
    assert len(by_case) == len(cases) and result.stopped is None
    r = by_case["upstream"]
    assert (r.status, r.outcome, r.score, r.eval_status, r.retried) == (
        "succeeded",
        "succeeded",
        10.0,
        "scored",
        True,
    )
    first, second = r.attempts
    assert (first.outcome, first.infra, second.outcome, second.infra) == (
        "upstream_unavailable",
        True,
        "succeeded",
        False,
    )
    assert first.reason == (
        "the gateway's last call to the upstream failed (HTTP 503); "
        "InternalServerError: Error code: 503 - overloaded"
    )
    assert first.retry_in_s is not None and 0.025 <= first.retry_in_s <= 0.05
    assert first.steps_session_id == f"{r.session_id}~a1" and second.steps_session_id == r.session_id
    # task outcomes: one attempt each, graded (reward written), never retried
    expected = {
        "crash": ("error", "runtime_error", 2.0),
        "gateway": ("failed", "failed", 2.0),
        "agent_fails": ("failed", "failed", 10.0),
        "crash_after": ("error", "runtime_error", 10.0),
        "claims_upstream": ("failed", "failed", 10.0),
        "claims_gateway": ("failed", "failed", 10.0),
        "garbage_no_call": ("error", "runtime_error", 2.0),
        "garbage_after_call": ("error", "runtime_error", 10.0),
    }
    for cid, (status, outcome, score) in expected.items():
        r = by_case[cid]
        assert (r.status, r.outcome, r.score, r.eval_status, len(r.attempts), r.attempts[0].infra) == (
            status,
            outcome,
            score,
            "scored",
            1,
            False,
        ), cid
    assert q(db, "SELECT count(*) FROM job_environments WHERE reward IS NULL") == [(0,)]
    # a claimed outage stays visible in the attempt's reason and the session's error
    for cid, claim, seen in (
        ("claims_upstream", "upstream_unavailable", "its last call: HTTP 200"),
        ("claims_gateway", "gateway_unreachable", "its last call: HTTP 200"),
        ("gateway", "gateway_unreachable", "no model call"),
    ):
        r = by_case[cid]
        denied = (
            f"the runtime claimed {claim}, which the launcher's and the gateway's records do not show ({seen}); "
            "graded as the agent's outcome"
        )
        assert (r.attempts[0].reason or "").endswith(denied) and denied in (r.error or ""), cid
    assert "APIConnectionError" in (by_case["gateway"].attempts[0].reason or "")
    assert (by_case["crash"].attempts[0].reason or "").startswith(
        "the runtime exited with code 3: its output is not a result"
    )
    for cid in ("garbage_no_call", "garbage_after_call"):
        assert (by_case[cid].attempts[0].reason or "").startswith(
            "last stdout line is not JSON: 'this is not a result' (exit code 0)"
        ), cid
    assert all(len(by_case[f"ok{i}"].attempts) == 1 and by_case[f"ok{i}"].score == 10.0 for i in range(5))
    # the upstream attempt's failed step is archived under its attempt id, not trainable; the
    # trajectory of the session is the successful attempt's only
    up_sid = by_case["upstream"].session_id
    assert q(
        db, f"SELECT status, status_code, is_trainable FROM session_steps WHERE session_id = '{up_sid}~a1'"
    ) == [("error", 503, 0)]
    assert q(
        db, f"SELECT status, is_trainable, step_id FROM session_steps WHERE session_id = '{up_sid}'"
    ) == [("ok", 1, 1)]
    # a call per session but crash, gateway and garbage_no_call, plus the attempt answered 503
    assert len(calls) == len(cases) - 3 + 1
    assert q(db, "SELECT count(*), sum(infra) FROM session_attempts WHERE job_id = 'j30'") == [
        (len(cases) + 1, 1)
    ]
    # never more attempts at once than --pool-size (retries wait in the queue, not in a worker)
    spans = q(db, "SELECT started_at, finished_at FROM session_attempts WHERE job_id = 'j30'")
    assert max(sum(1 for s, f in spans if s <= t < f) for t, _ in spans) <= 3
    assert q(db, "SELECT case_id FROM job_environments WHERE attempts = 2") == [("upstream",)]
    # the table and the JSONL show what was retried
    [row] = summarize(result.records)
    assert (row.retried, row.infra, row.scored, row.sessions) == (1, 0, len(cases), len(cases))
    table = render_table([row]).splitlines()
    assert table[3] == "  problems: rt_err 4, retried 1"  # folded under the row; infra 0 is not shown
    lines = [json.loads(x) for x in result.out.read_text().splitlines()]
    up_line = next(x for x in lines if x["case_id"] == "upstream")
    assert up_line["retried"] is True
    assert [a["outcome"] for a in up_line["attempts"]] == ["upstream_unavailable", "succeeded"]
    # each infrastructure failure is on the terminal with its reason, not only in the JSONL
    told = [
        m
        for r in caplog.records
        if r.name == "rollout.jobs.attempt"
        and r.levelname == "WARNING"
        and " attempt 1: " in (m := r.getMessage())
    ]
    r = by_case["upstream"]
    reason = (r.attempts[0].reason or "").strip().splitlines()[-1][:300]
    assert len(told) == 1 and told[0].startswith(
        f"session {r.session_id} attempt 1: upstream_unavailable: {reason}; retry in 0.0"
    ), told


async def test_exhausted_retries_are_not_graded_and_resume_redoes_them(tmp_path: Path) -> None:
    marker = signal_file(tmp_path, "fixed")
    cases = [
        {"id": "a", "q": "hi"},
        {"id": "b", "q": "hi", "down_until": str(marker)},
        {"id": "c", "q": "hi"},
    ]
    make_env(tmp_path / "envs", cases)
    db = tmp_path / "t.db"
    async with FakeUpstream() as up:
        up.add_rule(fail_503)
        cfg = gateway_config(tmp_path / "gw.yaml", up, db)
        result = await run_job(options(tmp_path, cfg, db, job_id="jx", max_retries=1))
        by_case = {r.case_id: r for r in result.records}
        b = by_case["b"]
        assert (b.status, b.outcome, b.score, b.eval_status) == (
            "error",
            "upstream_unavailable",
            None,
            "infra_error",
        )
        assert b.reason == "not graded: infrastructure failure (upstream_unavailable) in attempt 2"
        assert [a.outcome for a in b.attempts] == ["upstream_unavailable", "upstream_unavailable"]
        [row] = summarize(result.records)
        assert (row.infra, row.scored, row.mean_score, row.pass_at_1) == (1, 2, 10.0, 1.0)  # masked, not a 0
        assert q(db, "SELECT reward, eval_status FROM job_environments WHERE case_id = 'b'") == [
            (None, "infra_error")
        ]
        # an interrupted session too (the launcher was killed during its attempt)
        con = sqlite3.connect(db)
        con.execute("UPDATE job_environments SET finished = 0, status = 'running' WHERE case_id = 'c'")
        con.commit()
        con.close()
        c_sid = by_case["c"].session_id
        n_calls = len(up.requests)
        marker.write_text("ok")
        result = await run_job(options(tmp_path, cfg, db, job_id="jx", resume=True, max_retries=1))
        assert len(up.requests) == n_calls + 2  # b and c ran again, a did not
    by_case = {r.case_id: r for r in result.records}
    b, c = by_case["b"], by_case["c"]
    assert (b.status, b.outcome, b.score, b.retried) == ("succeeded", "succeeded", 10.0, True)
    assert [a.attempt for a in b.attempts] == [1, 2, 3]  # attempt numbers go on from those used
    assert [a.outcome for a in c.attempts] == ["succeeded", "succeeded"]  # the first row was kept
    assert c.score == 10.0 and len(by_case["a"].attempts) == 1
    assert q(db, "SELECT case_id, attempts FROM job_environments ORDER BY case_id") == [
        ("a", 1),
        ("b", 3),
        ("c", 2),
    ]
    # c's first attempt's step is archived under its attempt id, not trainable
    assert q(db, f"SELECT is_trainable FROM session_steps WHERE session_id = '{c_sid}~a1'") == [(0,)]
    assert q(db, f"SELECT is_trainable, reward FROM session_steps WHERE session_id = '{c_sid}'") == [
        (1, 10.0)
    ]


def start_gateway_process(cfg: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as fh:
        return subprocess.Popen(
            [sys.executable, "-m", "gateway", "--config", str(cfg), "--port", str(port)],
            cwd=str(REPO),
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


async def wait_ready(port: int, deadline_s: float = 60) -> None:
    deadline = time.monotonic() + deadline_s
    async with httpx.AsyncClient(timeout=2) as http:
        while time.monotonic() < deadline:
            try:
                if (await http.get(f"http://127.0.0.1:{port}/readyz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)
    raise AssertionError("the gateway did not start")


async def test_gateway_killed_and_restarted_mid_job(tmp_path: Path) -> None:
    """The gateway dies while three sessions are between two calls, and comes back on the same
    port and database: the breaker opens (no session is started into the dead gateway), closes
    when the gateway answers, the failed attempts are retried, and every session succeeds."""
    go = signal_file(tmp_path, "go")
    cases = [{"id": f"s{i}", "q": "hi", "calls": 2, "wait_for": str(go)} for i in range(6)]
    make_env(tmp_path / "envs", cases)
    db = tmp_path / "t.db"
    port = free_port()
    events: list[BreakerEvent] = []
    opened, closed = asyncio.Event(), asyncio.Event()

    def on_breaker(ev: BreakerEvent) -> None:
        events.append(ev)
        (opened if ev.state == "open" else closed).set()

    async with FakeUpstream() as up:
        cfg = gateway_config(tmp_path / "gw.yaml", up, db)
        gw = start_gateway_process(cfg, port, tmp_path / "gw.log")
        try:
            await wait_ready(port)
            opts = options(
                tmp_path,
                cfg,
                db,
                job_id="jk",
                pool_size=3,
                max_retries=2,
                gateway_base_url=f"http://127.0.0.1:{port}/v1/sessions",
                breaker={
                    "window": 6,
                    "min_failures": 3,
                    "probe_s": 0.1,
                    "max_probe_s": 0.5,
                    "max_wait_s": 120,
                },
            )
            job: asyncio.Task[JobResult] = asyncio.create_task(run_job(opts, on_breaker=on_breaker))
            deadline = time.monotonic() + 120
            while not (db.exists() and q(db, "SELECT count(*) FROM session_steps") == [(3,)]):
                assert time.monotonic() < deadline and not job.done(), (
                    "three sessions never made their first call"
                )
                await asyncio.sleep(0.05)
            os.killpg(gw.pid, signal.SIGKILL)
            gw.wait()
            go.write_text("go")  # the three sessions now call a dead gateway
            await asyncio.wait_for(opened.wait(), 120)
            assert not closed.is_set()
            started_while_open = q(db, "SELECT count(*) FROM job_environments WHERE attempts > 0")
            gw = start_gateway_process(cfg, port, tmp_path / "gw.log")
            result = await asyncio.wait_for(job, 240)
        finally:
            if gw.poll() is None:
                os.killpg(gw.pid, signal.SIGTERM)
                gw.wait()
    assert started_while_open == [(3,)]  # nothing was scheduled into the dead gateway
    assert [e.state for e in events] == ["open", "closed"] and result.breaker_events == events
    assert result.stopped is None
    assert sorted((r.status, r.score) for r in result.records) == [("succeeded", 10.0)] * 6
    assert all(r.eval_status == "scored" and r.outcome == "succeeded" for r in result.records)
    retried = [r for r in result.records if r.retried]
    assert len(retried) == 3
    for r in retried:
        assert [a.outcome for a in r.attempts] == ["gateway_unreachable", "succeeded"]
        # the first attempt's answered call is kept, archived, not trainable
        assert q(
            db, f"SELECT status, is_trainable FROM session_steps WHERE session_id = '{r.session_id}~a1'"
        ) == [("ok", 0)]
        assert q(db, f"SELECT count(*) FROM session_steps WHERE session_id = '{r.session_id}'") == [(2,)]
    # no infrastructure failure was scored
    assert q(
        db, "SELECT count(*) FROM job_environments WHERE reward IS NOT NULL AND outcome != 'succeeded'"
    ) == [(0,)]
    assert DEFAULT_TEXT in result.records[0].trajectory[-1]["content"]


async def test_breaker_gives_up_then_resume_finishes_the_job(tmp_path: Path) -> None:
    """A gateway that stays down: the breaker stops the job with a clear reason, nothing is graded
    as the agent's failure, and ``--resume`` on a gateway that is back finishes every session."""
    go = signal_file(tmp_path, "go")
    cases = [{"id": f"s{i}", "q": "hi", "calls": 2, "wait_for": str(go)} for i in range(4)]
    make_env(tmp_path / "envs", cases)
    db = tmp_path / "t.db"
    port = free_port()
    async with FakeUpstream() as up:
        cfg = gateway_config(tmp_path / "gw.yaml", up, db)
        gw = start_gateway_process(cfg, port, tmp_path / "gw.log")
        try:
            await wait_ready(port)
            common: dict[str, Any] = {
                "job_id": "js",
                "pool_size": 2,
                "gateway_base_url": f"http://127.0.0.1:{port}/v1/sessions",
                "breaker": {"probe_s": 0.05, "max_probe_s": 0.1, "max_wait_s": 0.5},
            }
            job = asyncio.create_task(run_job(options(tmp_path, cfg, db, **common)))
            deadline = time.monotonic() + 120
            while not (db.exists() and q(db, "SELECT count(*) FROM session_steps") == [(2,)]):
                assert time.monotonic() < deadline and not job.done(), (
                    "two sessions never made their first call"
                )
                await asyncio.sleep(0.05)
            os.killpg(gw.pid, signal.SIGKILL)
            gw.wait()
            go.write_text("go")
            result = await asyncio.wait_for(job, 120)
            assert result.stopped is not None and "did not answer" in result.stopped
            assert [e.state for e in result.breaker_events] == ["open", "stopped"]
            assert result.records == []  # nothing finished: nothing graded
            assert q(db, "SELECT finished, reward FROM job_environments") == [(0, None)] * 4
            assert (
                sorted(q(db, "SELECT status FROM job_environments"))
                == [("pending",)] * 2 + [("retrying",)] * 2
            )
            gw = start_gateway_process(cfg, port, tmp_path / "gw.log")
            await wait_ready(port)
            result = await asyncio.wait_for(run_job(options(tmp_path, cfg, db, resume=True, **common)), 240)
        finally:
            if gw.poll() is None:
                os.killpg(gw.pid, signal.SIGTERM)
                gw.wait()
    assert result.stopped is None
    assert (
        sorted((r.status, r.score, len(r.attempts)) for r in result.records)
        == [("succeeded", 10.0, 1)] * 2 + [("succeeded", 10.0, 2)] * 2
    )


@contextlib.asynccontextmanager
async def planned_on_a_gateway(tmp_path: Path, job_id: str, **gateway: Any) -> AsyncIterator[Planned]:
    """The rows of a job of the env under ``tmp_path/envs`` planned in a store that a real
    gateway (settings ``gateway`` added) records to, for a Pool run in this process."""
    from gateway.settings import GatewaySettings
    from rollout.core.plan import session_rows
    from rollout.jobs.prepare import load_envs
    from store import Store
    from tests.gateway.conftest import serve

    db = tmp_path / "t.db"
    async with FakeUpstream() as up:
        gw = await serve(
            GatewaySettings.model_validate(
                {
                    "storage_config": {"db_url": f"sqlite://{db}"},
                    "llm_routes": {"fake": {"base_url": up.base_url}},
                    **gateway,
                }
            )
        )
        store = Store(f"sqlite://{db}")
        try:
            await store.init()
            opts = options(tmp_path, tmp_path / "unused.yaml", db)
            envs = load_envs(opts)
            rows = session_rows(job_id, "fake", envs, 1, None)
            await store.add_job_sessions(rows)
            yield Planned(store, rows, {c.name: c for c, _ in envs}, opts, f"{gw.url}/v1/sessions", db)
        finally:
            await store.close()
            await gw.stop()


@dataclass
class Planned:
    store: Any
    rows: list[Any]
    envs: dict[str, Any]
    opts: JobOptions
    gateway_url: str
    db: Path

    def with_opts(self, **update: Any) -> JobOptions:
        """The job's options, graded, with ``update``."""
        return JobOptions.model_validate({**self.opts.model_dump(), "enable_evaluation": True, **update})

    def context(self, job_id: str, **more: Any) -> JobContext:
        """The context of a job on this gateway's ``fake`` route."""
        return JobContext(job_id=job_id, gateway_url=self.gateway_url, models=("fake",), **more)


async def test_a_retry_whose_session_cannot_be_closed_is_given_up(tmp_path: Path) -> None:
    """The gateway answers its probe but refuses to close the session (here: the launcher lacks
    the key of a gateway with auth on): the retry is tried a bounded number of times, then the
    session ends as an infrastructure failure, not graded, instead of looping for ever."""
    from rollout.jobs.pool import Pool

    make_env(tmp_path / "envs", [{"id": "x", "q": "hi", "fault": "crash"}])
    async with planned_on_a_gateway(tmp_path, "jg", auth={"api_keys": ["sk-gw"]}) as p:
        pool = Pool(p.store, p.with_opts(pool_size=1, retry_backoff_s=0.01), p.context("jg"), p.envs)
        [record] = await asyncio.wait_for(pool.run(p.rows), 120)
    assert (record.status, record.outcome, record.score, record.eval_status) == (
        "error",
        "gateway_unreachable",
        None,
        "infra_error",
    )
    assert (
        record.error is not None
        and "the retry could not start (6 tries)" in record.error
        and "401" in record.error
    )
    assert [a.outcome for a in record.attempts] == ["gateway_unreachable"]  # no second attempt ever ran
    assert q(p.db, "SELECT attempts, finished, reward FROM job_environments") == [(1, 1, None)]


async def test_a_gateway_the_bridge_cannot_reach_is_an_outage_even_when_the_runtime_claims_nothing(
    tmp_path: Path,
) -> None:
    """The launcher's own view decides: the runtime's calls go to a gateway address nothing
    listens on (the session close reaches the real gateway), the runtime swallows the error and
    reports a plain failure; the gateway bridge's failed connections make it ``gateway_unreachable``:
    retried, then not graded."""
    from rollout.jobs.pool import Pool
    from tests.rollout.sandbox_helpers import require_bwrap

    require_bwrap()
    make_env(tmp_path / "envs", [{"id": "x", "q": "hi", "silent": True}])
    async with planned_on_a_gateway(tmp_path, "ju") as p:
        pool = Pool(
            p.store,
            p.with_opts(pool_size=1, retry_backoff_s=0.01, max_retries=1),
            p.context("ju", advertise_url=f"http://127.0.0.1:{free_port()}/v1/sessions"),
            p.envs,
        )
        [record] = await asyncio.wait_for(pool.run(p.rows), 120)
    assert (record.status, record.outcome, record.score, record.eval_status) == (
        "error",
        "gateway_unreachable",
        None,
        "infra_error",
    )
    assert [(a.outcome, a.infra) for a in record.attempts] == [("gateway_unreachable", True)] * 2
    for a in record.attempts:
        assert (a.reason or "").startswith(
            "the gateway bridge could not reach the gateway (1 failed connection(s), "
            "the last: ConnectionRefusedError: "
        ), a.reason
    assert q(p.db, "SELECT reward, eval_status FROM job_environments") == [(None, "infra_error")]


async def test_a_launcher_bug_outside_a_session_fails_the_job_instead_of_hanging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that dies of a bug outside any session's own handling (here: raised where an
    attempt is taken up) ends the job with that error while the other workers still wait for
    work, instead of leaving them waiting for the dead worker's session for ever."""
    from rollout.jobs.attempt import Attempts
    from rollout.jobs.pool import Pool

    make_env(tmp_path / "envs", [{"id": f"c{i}", "q": "hi"} for i in range(4)])
    async with planned_on_a_gateway(tmp_path, "jb") as p:
        doomed = p.rows[1].session_id
        run = Attempts.run

        async def refuse_one(self: Attempts, work: Any) -> Any:
            if work.row.session_id == doomed:
                raise RuntimeError("injected launcher bug")
            return await run(self, work)

        monkeypatch.setattr(Attempts, "run", refuse_one)
        sched = Pool(p.store, p.with_opts(pool_size=2), p.context("jb"), p.envs)
        with pytest.raises(RuntimeError, match="injected launcher bug"):
            await asyncio.wait_for(sched.run(p.rows), 120)
    assert all(t.done() for t in sched._workers)  # none left behind
