"""Two gateway processes (``python -m gateway``) serving the same sessions over one store with
``shared_sessions`` (the default on PostgreSQL; on for SQLite here too): the step budget stays
exact when parallel calls of one session are spread over both, step ids stay unique and
increasing, and close and the synthetic stop work whichever gateway gets the call. Both
gateways talk to the one scripted fake upstream of this test process."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from openai import AsyncOpenAI

from store import JobEnvironment, Store
from tests.fake_upstream import DEFAULT_TEXT, FakeUpstream
from tests.gateway.conftest import MESSAGES, eventually
from tests.raw_sql import raw_sql


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class GatewayProcess:
    """One ``python -m gateway`` child process on a loopback port."""

    def __init__(self, config: Path, log: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "--config", str(config), "--port", str(self.port)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=os.environ.copy(),
        )
        self.log = log

    async def ready(self) -> None:
        async def up() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"gateway exited ({self.proc.returncode}): {self.log.read_text()[-2000:]}"
                )
            try:
                async with httpx.AsyncClient() as c:
                    r = await c.get(self.url + "/readyz")
            except httpx.HTTPError:
                return False
            assert r.status_code != 200 or r.json()["shared_sessions"] is True
            return r.status_code == 200

        await eventually(up, timeout=90, interval=0.1)

    def client(self, sid: str) -> AsyncOpenAI:
        return AsyncOpenAI(
            base_url=f"{self.url}/v1/sessions/{sid}", api_key="unused", max_retries=0, timeout=60
        )

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()


StartGateways = Callable[..., Awaitable[list[GatewayProcess]]]


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    async with FakeUpstream(models=("m", "m2")) as up:
        yield up


@pytest.fixture
async def start_gateways(
    store_url: str, upstream: FakeUpstream, tmp_path: Path
) -> AsyncIterator[StartGateways]:
    store = Store(store_url)
    await store.init()  # the tables exist before either gateway starts (each would create them too)
    await store.close()
    started: list[GatewayProcess] = []

    async def start(n: int = 2, **config: Any) -> list[GatewayProcess]:
        route = {"base_url": upstream.base_url, "retry": {"max_attempts": 1}}
        data = {
            "storage_config": {"db_url": store_url},
            "shared_sessions": True,
            "max_steps": 5,
            "log_level": "warning",
            "llm_routes": {"m": route, "m2": dict(route)},
            **config,
        }
        cfg = tmp_path / f"gateway-{len(started)}.yaml"
        cfg.write_text(yaml.safe_dump(data))
        gws = [GatewayProcess(cfg, tmp_path / f"gateway-{len(started) + i}.log") for i in range(n)]
        started.extend(gws)
        await asyncio.gather(*(g.ready() for g in gws))
        return gws

    yield start
    for g in started:
        g.stop()


async def _chat(gw: GatewayProcess, sid: str, model: str = "m") -> tuple[str | None, str | None]:
    """One chat call; (answer text, x-gateway-stop-reason header)."""
    async with gw.client(sid) as c:
        raw = await c.chat.completions.with_raw_response.create(model=model, messages=MESSAGES)  # type: ignore[arg-type]
        return raw.parse().choices[0].message.content, raw.headers.get("x-gateway-stop-reason")


async def _post(gw: GatewayProcess, path: str, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(base_url=gw.url, timeout=60) as c:
        return await c.post(path, json=body)


async def _steps(store_url: str, sid: str) -> list[dict[str, Any]]:
    return await raw_sql(
        store_url,
        "SELECT seq, step_id, llm_model, status, is_trainable, meta_json "
        "FROM session_steps WHERE session_id = ? ORDER BY seq",
        sid,
    )


async def _session(store_url: str, sid: str) -> dict[str, Any]:
    (row,) = await raw_sql(
        store_url,
        "SELECT status, total_steps, in_flight, close_reason, completion_mode "
        "FROM gateway_sessions WHERE session_id = ?",
        sid,
    )
    return row


def _meta(row: dict[str, Any]) -> dict[str, Any]:
    import json

    value = row["meta_json"]
    return json.loads(value) if isinstance(value, str) else value


async def test_parallel_calls_over_two_gateways_make_exactly_the_budget_of_upstream_calls(
    start_gateways: StartGateways, upstream: FakeUpstream, store_url: str
) -> None:
    a, b = await start_gateways()
    n, budget = 24, 5
    upstream.hold()  # the calls that got a step wait upstream: every other call races for one meanwhile
    calls = [asyncio.ensure_future(_chat(gw, "par")) for gw in (a, b) * (n // 2)]
    await upstream.wait_for_requests(budget, timeout=60)
    await eventually(lambda: sum(c.done() for c in calls) == n - budget, timeout=60)
    assert len(upstream.requests) == budget
    upstream.release()
    results = await asyncio.gather(*calls)
    assert sorted(results, key=str) == sorted(
        [(DEFAULT_TEXT, None)] * budget + [("", "max_steps")] * (n - budget), key=str
    )
    assert len(upstream.requests) == budget
    steps = await _steps(store_url, "par")
    assert [(s["seq"], s["step_id"], s["status"]) for s in steps] == [
        (i, i, "ok") for i in range(1, budget + 1)
    ]
    row = await _session(store_url, "par")
    assert (row["status"], row["total_steps"], row["in_flight"]) == ("truncated", budget, 0)


async def test_step_ids_stay_unique_and_increasing_across_gateways(
    start_gateways: StartGateways, store_url: str
) -> None:
    a, b = await start_gateways()
    for gw in (a, b, b, a, a):
        assert await _chat(gw, "seq") == (DEFAULT_TEXT, None)
    for gw in (a, b):  # the session is bound to route m on every gateway
        r = await _post(gw, "/v1/sessions/seq/chat/completions", {"model": "m2", "messages": MESSAGES})
        assert (r.status_code, r.json()["error"]["code"]) == (400, "session_route_mismatch")
    steps = await _steps(store_url, "seq")
    assert [(s["seq"], s["llm_model"], s["step_id"]) for s in steps] == [(i, "m", i) for i in range(1, 6)]
    # the sixth call (budget 5) is stopped by whichever gateway gets it
    assert await _chat(b, "seq") == ("", "max_steps")
    assert await _chat(a, "seq") == ("", "max_steps")


async def test_close_on_one_gateway_waits_for_a_call_in_flight_on_the_other(
    start_gateways: StartGateways, upstream: FakeUpstream, store_url: str
) -> None:
    a, b = await start_gateways()
    upstream.hold()
    call = asyncio.ensure_future(_chat(a, "cl"))
    await upstream.wait_for_requests(1, timeout=60)
    close = asyncio.ensure_future(_post(b, "/v1/sessions/cl/close", {"reason": "agent done"}))

    async def closing() -> bool:
        async with httpx.AsyncClient(base_url=a.url) as c:
            return (await c.get("/v1/sessions/cl")).json()["status"] == "closing"

    await eventually(closing, timeout=60)
    refused = await _post(a, "/v1/sessions/cl/chat/completions", {"model": "m", "messages": MESSAGES})
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "session_closed"
    assert not close.done()  # still waiting for the call on gateway a
    upstream.release()
    assert await call == (DEFAULT_TEXT, None)
    closed = await close
    assert closed.status_code == 200
    assert (closed.json()["status"], closed.json()["total_steps"], closed.json()["truncated"]) == (
        "closed",
        1,
        False,
    )
    (step,) = await _steps(store_url, "cl")  # committed before the close answered
    assert bool(step["is_trainable"]) and "after_close" not in _meta(step)
    row = await _session(store_url, "cl")
    assert (row["status"], row["in_flight"], row["close_reason"]) == ("closed", 0, "agent done")
    for gw in (a, b):
        r = await _post(gw, "/v1/sessions/cl/chat/completions", {"model": "m", "messages": MESSAGES})
        assert r.status_code == 409
    again = await _post(a, "/v1/sessions/cl/close", {"reason": "second"})  # idempotent, first reason kept
    assert (again.json()["status"], again.json()["close_reason"]) == ("closed", "agent done")


async def test_a_call_still_in_flight_after_the_close_grace_is_stored_after_close(
    start_gateways: StartGateways, upstream: FakeUpstream, store_url: str
) -> None:
    a, b = await start_gateways(close_grace_s=0.2)
    upstream.hold()
    call = asyncio.ensure_future(_chat(a, "late"))
    await upstream.wait_for_requests(1, timeout=60)
    closed = await _post(b, "/v1/sessions/late/close", {})
    assert closed.json()["status"] == "closed"
    assert not call.done()
    upstream.release()
    assert await call == (DEFAULT_TEXT, None)
    (step,) = await _steps(store_url, "late")
    assert not step["is_trainable"] and _meta(step)["after_close"] is True
    assert (await _session(store_url, "late"))["in_flight"] == 0


async def test_launcher_budget_and_synthetic_stop_on_either_gateway(
    start_gateways: StartGateways, store_url: str
) -> None:
    store = Store(store_url)
    try:
        await store.add_job_sessions(
            [
                JobEnvironment(
                    session_id="one",
                    job_id="j",
                    env_name="e",
                    case_id="0",
                    llm_model="m",
                    group_id="g",
                    max_steps=1,
                )
            ]
        )
    finally:
        await store.close()
    a, b = await start_gateways()
    assert await _chat(a, "one") == (DEFAULT_TEXT, None)
    assert await _chat(b, "one") == ("", "max_steps")
    assert await _chat(a, "one") == ("", "max_steps")
    closed = await _post(b, "/v1/sessions/one/close", {"completion_mode": "auto"})
    assert (closed.json()["truncated"], closed.json()["completion_mode"]) == (True, "truncated")
    row = await _session(store_url, "one")
    assert (row["status"], row["total_steps"], row["completion_mode"]) == ("closed", 1, "truncated")
