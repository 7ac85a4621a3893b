"""Gateway contract for bounded upstream retries (route ``retry``): 429/5xx
and connect errors are retried on the same route while nothing reached the client, honouring
``Retry-After`` with a cap; once the attempts are used up the upstream answer is relayed intact;
a 400 is never retried; a stream that already sent bytes is never retried; one logical call is
one step (and one unit of budget) whatever the number of attempts."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import openai
import pytest

from tests.fake_upstream import DEFAULT_TEXT, DONE, FakeUpstream, Reply, chat_chunk
from tests.gateway.conftest import MESSAGES, Gateway, StartGateway, sse_payloads

UP_PATH = "/v1/chat/completions"
RATE_LIMITED = {"error": {"message": "rate limited", "type": "rate_limit_error", "param": None, "code": None}}
BUSY = {"error": {"message": "overloaded", "type": "server_error", "param": None, "code": None}}
FAST = {"backoff_s": 0.01, "max_backoff_s": 0.02}  # retry fields that keep backoff waits short


def _retry_route(**retry: Any) -> dict[str, Any]:
    return {"retry": {**FAST, **retry}}


async def _chat(gw: Gateway, sid: str, stream: bool) -> str:
    """One chat call with the openai SDK (max_retries=0); the answer's text."""
    client = gw.client(sid)
    if not stream:
        out = await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        return out.choices[0].message.content or ""
    parts = []
    async for ch in await client.chat.completions.create(model="m", messages=MESSAGES, stream=True):  # type: ignore[arg-type]
        parts += [c.delta.content or "" for c in ch.choices]
    return "".join(parts)


# ------------------------------------------------------ 429/5xx retried before the first byte
@pytest.mark.parametrize("stream", [False, True])
async def test_429_twice_then_200_is_retried_honouring_retry_after(
    start_gateway: StartGateway, upstream: FakeUpstream, stream: bool
) -> None:
    gw = await start_gateway()  # default policy: 3 attempts, Retry-After honoured up to 30 s
    limited = Reply.json(RATE_LIMITED, status=429, headers={"Retry-After": "1"})
    upstream.script(UP_PATH, [limited, limited])  # then the default answer
    t0 = time.monotonic()
    assert await _chat(gw, "s1", stream) == DEFAULT_TEXT
    assert time.monotonic() - t0 >= 1.9  # Retry-After: 1, twice
    assert len(upstream.requests) == 3
    [step] = await gw.steps("s1")
    assert (step.seq, step.status, step.status_code, step.is_stream) == (1, "ok", 200, stream)
    assert step.response["choices"][0]["message"]["content"] == DEFAULT_TEXT
    attempts = step.meta_json["attempts"]
    assert [(a["status"], a["retry_after_s"], a["wait_s"], a["error"]) for a in attempts] == [
        (429, 1.0, 1.0, None),
        (429, 1.0, 1.0, None),
        (200, None, None, None),
    ]
    assert await gw.metric("gateway_upstream_retries_total", route="m", reason="status_429") == 2
    r = await gw.http().get("/v1/sessions/s1")
    assert r.json()["total_steps"] == 1


async def test_retry_after_is_capped(start_gateway: StartGateway, upstream: FakeUpstream) -> None:
    gw = await start_gateway(routes={"m": _retry_route(max_retry_after_s=0.1)})
    limited = Reply.json(RATE_LIMITED, status=429, headers={"Retry-After": "30"})
    upstream.script(UP_PATH, [limited, limited])
    assert await asyncio.wait_for(_chat(gw, "s1", True), 20) == DEFAULT_TEXT  # not 2 x 30 s
    [step] = await gw.steps("s1")
    assert [(a["retry_after_s"], a["wait_s"]) for a in step.meta_json["attempts"]] == [
        (30.0, 0.1),
        (30.0, 0.1),
        (None, None),
    ]


@pytest.mark.parametrize("stream", [False, True])
async def test_503_forever_relays_the_last_503_intact_after_max_attempts(
    start_gateway: StartGateway, upstream: FakeUpstream, stream: bool
) -> None:
    gw = await start_gateway(routes={"m": _retry_route(max_retry_after_s=0.05)})
    upstream.script(UP_PATH, [Reply.json(BUSY, status=503, headers={"Retry-After": "1"}) for _ in range(5)])
    with pytest.raises(openai.InternalServerError) as ei:
        await _chat(gw, "s1", stream)
    assert ei.value.status_code == 503  # the upstream's status, not a 500
    assert ei.value.response.headers["retry-after"] == "1"
    assert ei.value.response.json() == BUSY
    assert len(upstream.requests) == 3
    [step] = await gw.steps("s1")
    assert (step.status, step.status_code, step.response) == ("error", 503, BUSY)
    assert [(a["status"], a["wait_s"]) for a in step.meta_json["attempts"]] == [
        (503, 0.05),
        (503, 0.05),
        (503, None),
    ]
    assert await gw.metric("gateway_upstream_retries_total", route="m", reason="status_503") == 2
    assert (
        await gw.metric("gateway_requests_total", endpoint="chat.completions", route="m", status="503") == 1
    )


async def test_400_is_passed_through_without_retry(gw: Gateway, upstream: FakeUpstream) -> None:
    err = {"error": {"message": "bad request", "type": "invalid_request_error", "param": None, "code": None}}
    upstream.script(UP_PATH, [Reply.json(err, status=400)])
    with pytest.raises(openai.BadRequestError) as ei:
        await _chat(gw, "s1", False)
    assert ei.value.response.json() == err
    assert len(upstream.requests) == 1
    [step] = await gw.steps("s1")
    assert (step.status, step.status_code) == ("error", 400)
    assert "attempts" not in step.meta_json


async def test_max_attempts_1_disables_retries(start_gateway: StartGateway, upstream: FakeUpstream) -> None:
    gw = await start_gateway(routes={"m": _retry_route(max_attempts=1)})
    upstream.script(UP_PATH, [Reply.json(BUSY, status=503, headers={"Retry-After": "0"})])
    with pytest.raises(openai.InternalServerError) as ei:
        await _chat(gw, "s1", False)
    assert ei.value.status_code == 503
    assert len(upstream.requests) == 1
    [step] = await gw.steps("s1")
    assert "attempts" not in step.meta_json
    assert await gw.metric("gateway_upstream_retries_total", route="m", reason="status_503") == 0


async def test_connect_error_is_retried_then_502(start_gateway: StartGateway, refused_port: int) -> None:
    gw = await start_gateway(
        routes={"m": {"base_url": f"http://127.0.0.1:{refused_port}/v1", **_retry_route()}}
    )
    with pytest.raises(openai.InternalServerError) as ei:
        await _chat(gw, "s1", True)
    assert ei.value.status_code == 502
    assert ei.value.response.json()["error"]["code"] == "upstream_unreachable"
    [step] = await gw.steps("s1")
    assert (step.status, step.status_code, step.meta_json["phase"]) == ("error", 502, "connect")
    attempts = step.meta_json["attempts"]
    assert len(attempts) == 3 and all(a["status"] is None and "unreachable" in a["error"] for a in attempts)
    assert await gw.metric("gateway_upstream_retries_total", route="m", reason="connect_error") == 2


async def test_retried_call_uses_one_budget_step(start_gateway: StartGateway, upstream: FakeUpstream) -> None:
    gw = await start_gateway(max_steps=2, routes={"m": _retry_route()})
    upstream.script(UP_PATH, [Reply.json(BUSY, status=503), Reply.json(BUSY, status=502)])
    assert await _chat(gw, "s1", False) == DEFAULT_TEXT  # 3 attempts, one step
    assert await _chat(gw, "s1", False) == DEFAULT_TEXT  # the budget still has room
    raw = await gw.client("s1").chat.completions.with_raw_response.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert raw.headers["x-gateway-stop-reason"] == "max_steps"
    assert len(upstream.requests) == 4
    steps = await gw.steps("s1")
    assert [(s.seq, s.status, len(s.meta_json.get("attempts", []))) for s in steps] == [
        (1, "ok", 3),
        (2, "ok", 0),
    ]


async def test_client_leaving_during_backoff_cancels_at_once(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway()
    upstream.script(UP_PATH, [Reply.json(RATE_LIMITED, status=429, headers={"Retry-After": "20"})])

    async def call() -> None:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            await http.post("/v1/sessions/s1/chat/completions", json={"model": "m", "messages": MESSAGES})

    task = asyncio.ensure_future(call())
    await upstream.wait_for_requests(1)
    await asyncio.sleep(0.2)  # the gateway is now waiting 20 s before its retry
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    [step] = await gw.wait_steps("s1", 1, timeout=2.0)
    assert (step.status, step.meta_json["phase"]) == ("client_disconnected", "backoff")
    assert [(a["status"], a["wait_s"]) for a in step.meta_json["attempts"]] == [(429, 20.0)]
    # the only attempt was a 429: the model never got the call, so it uses no budget
    assert (step.meta_json["budget_refunded"], step.is_trainable) == (True, False)
    st = (await gw.http().get("/v1/sessions/s1")).json()
    assert (st["total_steps"], st["refunded_steps"]) == (1, 1)
    await asyncio.sleep(0.2)
    assert len(upstream.requests) == 1
    assert gw.app_state.upstream.in_flight["m"] == 0


# -------------------------------------------- a stream that broke after bytes is never retried
async def test_stream_broken_after_bytes_is_never_retried(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(routes={"m": _retry_route()})

    def tool_chunk(args: str, **kw: Any) -> bytes:
        return chat_chunk(
            tool_calls=[
                {
                    "index": 0,
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "write", "arguments": args},
                }
            ],
            **kw,
        )

    fragment = '{"path":"/data/out'
    upstream.script(
        UP_PATH,
        [
            Reply.sse([tool_chunk(fragment, role="assistant")], close_abruptly=True),
            Reply.sse(
                [
                    tool_chunk('{"path":"/data/output.csv"}', role="assistant"),
                    chat_chunk(finish_reason="tool_calls"),
                    DONE,
                ]
            ),
        ],
    )
    got: list[str] = []
    with pytest.raises(openai.APIError):
        async for ch in await gw.client("s1").chat.completions.create(
            model="m", messages=MESSAGES, stream=True
        ):  # type: ignore[arg-type]
            got += [
                tc.function.arguments or ""
                for c in ch.choices
                for tc in c.delta.tool_calls or []
                if tc.function is not None
            ]
    assert got == [fragment]  # exactly what was forwarded, no second attempt glued on
    assert len(upstream.requests) == 1
    [step] = await gw.steps("s1")
    assert (step.status, step.is_truncated, step.status_code) == ("truncated", True, 200)
    [call] = step.response["choices"][0]["message"]["tool_calls"]
    assert call["function"]["arguments"] == fragment
    assert "attempts" not in step.meta_json
    assert await gw.metric("gateway_upstream_retries_total", route="m", reason="status_200") == 0


async def test_raw_bytes_of_a_broken_stream_hold_one_attempt(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(routes={"m": _retry_route()})
    first = chat_chunk("Hel", role="assistant")
    upstream.script(UP_PATH, [Reply.sse([first], close_abruptly=True)])
    r = await gw.http().post(
        "/v1/sessions/s1/chat/completions", json={"model": "m", "messages": MESSAGES, "stream": True}
    )
    assert r.status_code == 200 and r.content.startswith(first)
    payloads = sse_payloads(r.content)
    assert len(payloads) == 2 and "error" in json.loads(payloads[-1])  # the fragment, then the error event
    assert len(upstream.requests) == 1
