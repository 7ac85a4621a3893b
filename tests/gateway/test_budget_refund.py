"""Gateway contract for budget refunds: a call whose final outcome shows it never reached the
model (a connect failure, an upstream 429) is recorded as its own step with
``meta_json.budget_refunded = true`` and ``is_trainable = false`` and uses no budget
(``gateway_sessions.refunded_steps``); an upstream 500 is not refunded."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai
import pytest

from tests.fake_upstream import DEFAULT_TEXT, FakeUpstream, Reply, chat_completion
from tests.gateway.conftest import MESSAGES, NO_RETRY, Gateway, StartGateway

UP_PATH = "/v1/chat/completions"
RATE_LIMITED = {"error": {"message": "rate limited", "type": "rate_limit_error", "param": None, "code": None}}
BUSY = {"error": {"message": "overloaded", "type": "server_error", "param": None, "code": None}}


@pytest.fixture
def db_url(store_url: str) -> str:
    """This module runs on both backends (SQLite, and PostgreSQL with shared sessions)."""
    return store_url


async def _chat(gw: Gateway, model: str = "m", sid: str = "s1") -> openai.types.chat.ChatCompletion:
    raw = await gw.client(sid).chat.completions.with_raw_response.create(model=model, messages=MESSAGES)  # type: ignore[arg-type]
    assert "x-gateway-stop-reason" not in raw.headers
    return raw.parse()


async def _stopped(gw: Gateway, sid: str = "s1") -> bool:
    """True when the next call of ``sid`` gets the synthetic stop (the budget is used)."""
    raw = await gw.client(sid).chat.completions.with_raw_response.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    return raw.headers.get("x-gateway-stop-reason") == "max_steps"


async def _status(gw: Gateway, sid: str = "s1") -> dict[str, Any]:
    r = await gw.http().get(f"/v1/sessions/{sid}")
    assert r.status_code == 200
    return r.json()  # type: ignore[no-any-return]


def _row(gw: Gateway, sid: str = "s1") -> dict[str, Any]:
    [row] = gw.sql(
        "SELECT status, total_steps, refunded_steps, step_counts FROM gateway_sessions WHERE session_id=?",
        sid,
    )
    return dict(row)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("status", [429, 503])
async def test_429_or_503_is_refunded_and_the_next_call_gets_the_unit(
    start_gateway: StartGateway, upstream: FakeUpstream, stream: bool, status: int
) -> None:
    gw = await start_gateway(max_steps=1, routes={"m": NO_RETRY})
    upstream.script(UP_PATH, [Reply.json(RATE_LIMITED, status=status, headers={"Retry-After": "1"})])
    with pytest.raises(openai.RateLimitError if status == 429 else openai.InternalServerError):
        await gw.client("s1").chat.completions.create(model="m", messages=MESSAGES, stream=stream)  # type: ignore[call-overload]
    out = await _chat(gw)
    assert out.choices[0].message.content == DEFAULT_TEXT  # a real answer, not a synthetic stop
    assert await _stopped(gw)  # now the one unit is used
    assert len(upstream.requests) == 2

    first, second = await gw.steps("s1")
    assert (first.seq, first.step_id, first.status, first.status_code) == (1, 1, "error", status)
    assert first.meta_json["budget_refunded"] is True and first.is_trainable is False
    assert (second.seq, second.step_id, second.status) == (2, 2, "ok")
    assert "budget_refunded" not in second.meta_json and second.is_trainable is True
    st = await _status(gw)
    assert (st["status"], st["total_steps"], st["refunded_steps"], st["max_steps"]) == ("truncated", 2, 1, 1)
    row = _row(gw)
    assert (row["total_steps"], row["refunded_steps"], json.loads(row["step_counts"])) == (2, 1, {"m": 2})


async def test_connect_failure_is_refunded(
    start_gateway: StartGateway, upstream: FakeUpstream, refused_port: int
) -> None:
    dead = f"http://127.0.0.1:{refused_port}/v1"
    gw = await start_gateway(max_steps=1, routes={"m": {}, "dead": {"base_url": dead, **NO_RETRY}})
    for _ in range(2):  # budget 1: the second call is forwarded too, the first one used no budget
        with pytest.raises(openai.InternalServerError) as ei:
            await _chat(gw, model="dead")
        assert ei.value.status_code == 502
    first, second = await gw.steps("s1")
    assert (first.seq, first.llm_model, first.status, first.status_code) == (1, "dead", "error", 502)
    assert first.meta_json["phase"] == "connect" and first.meta_json["budget_refunded"] is True
    assert first.is_trainable is False
    assert (second.seq, second.llm_model, second.status, second.meta_json["budget_refunded"]) == (
        2,
        "dead",
        "error",
        True,
    )
    st = await _status(gw)
    assert (st["status"], st["total_steps"], st["refunded_steps"]) == ("active", 2, 2)
    out = await _chat(gw, model="m", sid="s2")
    assert out.choices[0].message.content == DEFAULT_TEXT
    assert await _stopped(gw, "s2")


async def test_connect_failure_after_route_retries_is_refunded_once(
    start_gateway: StartGateway, refused_port: int
) -> None:
    dead = f"http://127.0.0.1:{refused_port}/v1"
    gw = await start_gateway(
        max_steps=1, routes={"m": {"base_url": dead, "retry": {"backoff_s": 0.01, "max_backoff_s": 0.02}}}
    )
    for _ in range(2):
        with pytest.raises(openai.InternalServerError):
            await _chat(gw)
    steps = await gw.steps("s1")
    assert [
        (s.seq, s.status, len(s.meta_json["attempts"]), s.meta_json["budget_refunded"]) for s in steps
    ] == [(1, "error", 3, True), (2, "error", 3, True)]
    st = await _status(gw)
    assert (st["status"], st["total_steps"], st["refunded_steps"]) == ("active", 2, 2)


@pytest.mark.parametrize("status", [500, 502, 504])
async def test_5xx_is_not_refunded(start_gateway: StartGateway, upstream: FakeUpstream, status: int) -> None:
    gw = await start_gateway(max_steps=1, routes={"m": NO_RETRY})
    upstream.script(UP_PATH, [Reply.json(BUSY, status=status)])
    with pytest.raises(openai.InternalServerError):
        await _chat(gw)
    assert await _stopped(gw)  # the 5xx reached the model: its unit is used
    assert len(upstream.requests) == 1
    [step] = await gw.steps("s1")
    assert (step.status, step.status_code, step.is_trainable) == ("error", status, True)
    assert "budget_refunded" not in step.meta_json
    st = await _status(gw)
    assert (st["total_steps"], st["refunded_steps"]) == (1, 0)


async def test_openai_sdk_retry_of_a_relayed_429(start_gateway: StartGateway, upstream: FakeUpstream) -> None:
    gw = await start_gateway(max_steps=1, routes={"m": NO_RETRY})
    upstream.script(UP_PATH, [Reply.json(RATE_LIMITED, status=429, headers={"Retry-After": "0"})])
    out = await gw.client("s1", max_retries=1).chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert out.choices[0].message.content == DEFAULT_TEXT
    assert len(upstream.requests) == 2
    first, second = await gw.steps("s1")
    assert (first.seq, first.status_code, first.meta_json["budget_refunded"], first.is_trainable) == (
        1,
        429,
        True,
        False,
    )
    assert (second.seq, second.status, second.is_trainable) == (2, "ok", True)
    st = await _status(gw)
    assert st["total_steps"] - st["refunded_steps"] == 1  # the budget used
    assert await _stopped(gw)


async def test_parallel_calls_with_a_refund(start_gateway: StartGateway, upstream: FakeUpstream) -> None:
    budget, n = 2, 6
    gw = await start_gateway(max_steps=budget, routes={"m": NO_RETRY})
    upstream.script(
        UP_PATH,
        [
            Reply.json(RATE_LIMITED, status=429, delay_headers_s=0.2),
            Reply.json(chat_completion(), delay_headers_s=0.2),
        ],
    )
    client = gw.client("s1")

    async def one() -> str:
        try:
            out = await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        except openai.RateLimitError:
            return "429"
        return out.choices[0].message.content or "stop"

    results = await asyncio.gather(*(one() for _ in range(n)))
    # the calls in flight hold the budget: exactly `budget` upstream calls, the others stop
    assert sorted(results) == sorted(["429", DEFAULT_TEXT] + ["stop"] * (n - budget))
    assert len(upstream.requests) == budget
    # the 429 was refunded: one more call gets the unit back, then the budget is used
    assert (await _chat(gw)).choices[0].message.content == DEFAULT_TEXT
    assert await _stopped(gw)
    assert len(upstream.requests) == budget + 1
    steps = await gw.steps("s1")
    assert [s.seq for s in steps] == [1, 2, 3]
    assert sorted(bool(s.meta_json.get("budget_refunded")) for s in steps) == [False, False, True]
    st = await _status(gw)
    assert (st["total_steps"], st["refunded_steps"]) == (3, 1)


async def test_refund_survives_a_restart(
    start_gateway: StartGateway, upstream: FakeUpstream, db_url: str
) -> None:
    gw = await start_gateway(max_steps=1, routes={"m": NO_RETRY})
    upstream.script(UP_PATH, [Reply.json(RATE_LIMITED, status=429)])
    with pytest.raises(openai.RateLimitError):
        await _chat(gw)
    await gw.stop()
    gw2 = await start_gateway(db_url=db_url, max_steps=1, routes={"m": NO_RETRY})
    assert (await _status(gw2))["refunded_steps"] == 1
    assert (await _chat(gw2)).choices[0].message.content == DEFAULT_TEXT
    assert await _stopped(gw2)
    assert [s.seq for s in await gw2.steps("s1")] == [1, 2]
    assert _row(gw2)["refunded_steps"] == 1
