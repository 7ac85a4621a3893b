"""Gateway contract under faults: client disconnects, upstream timeouts, per-route
``max_concurrency``, large bodies (20 MB accepted, over the limit 413), routes that cannot
stream (``supports_stream: false``), and unexpected errors still in OpenAI's shape."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest

from tests.fake_upstream import (
    DEFAULT_TEXT,
    DEFAULT_USAGE,
    DONE,
    FakeUpstream,
    Reply,
    chat_chunk,
    chat_completion,
)
from tests.gateway.conftest import MESSAGES, NO_RETRY, Gateway, StartGateway, eventually, sse_json

UP_PATH = "/v1/chat/completions"


def endless_stream(n: int = 400, every_s: float = 0.05, usage: dict[str, int] | None = None) -> Reply:
    """An upstream that streams token ``t{i}`` every ``every_s`` seconds (20 s by default)."""
    chunks = [
        chat_chunk(f"t{i}", role="assistant" if i == 0 else None, usage=usage if i == 0 else None)
        for i in range(n)
    ]
    return Reply.sse([*chunks, chat_chunk(finish_reason="stop"), DONE], delay_s=every_s)


async def read_events_then_hang_up(gw: Gateway, sid: str, n_events: int) -> bytes:
    """Raw client: stream a chat call, read ``n_events`` SSE events, then close the socket."""
    got = b""
    async with httpx.AsyncClient(base_url=gw.url, timeout=10) as http:
        body = {"model": "m", "messages": MESSAGES, "stream": True}
        async with http.stream("POST", f"/v1/sessions/{sid}/chat/completions", json=body) as r:
            assert r.status_code == 200
            async for piece in r.aiter_raw():
                got += piece
                if got.count(b"\n\n") >= n_events:
                    break
    return got


def content_of(step: Any) -> str:
    return step.response["choices"][0]["message"]["content"]


# -------------------------------------------------------------------------- client disconnects
async def test_client_disconnect_closes_upstream_and_records_partial(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    usage = {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10}
    upstream.script(UP_PATH, [endless_stream(usage=usage)])
    client = gw.client("s1")
    stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
    seen = ""
    async for c in stream:
        seen += c.choices[0].delta.content or ""
        if seen == "t0t1t2":
            break
    await stream.close()
    await upstream.wait_for_disconnect(1, timeout=15.0)  # the gateway hung up on the upstream at once
    assert upstream.requests[0].disconnected
    [step] = await gw.wait_steps("s1", 1)
    assert (step.status, step.status_code, step.is_stream, step.finish_reason) == (
        "client_disconnected",
        200,
        True,
        None,
    )
    assert content_of(step).startswith("t0t1t2")
    assert (step.prompt_tokens, step.completion_tokens, step.total_tokens) == (9, 1, 10)  # usage known so far
    await eventually(lambda: gw.app_state.upstream.in_flight["m"] == 0)
    assert upstream.in_flight == 0


async def _settled_task_count() -> int:
    await asyncio.sleep(0)
    return len(asyncio.all_tasks())


async def test_repeated_concurrent_disconnects_leak_nothing(gw: Gateway, upstream: FakeUpstream) -> None:
    n = 30
    # warm-up round so pools and lazily created tasks exist before the baseline is taken
    upstream.script(UP_PATH, [endless_stream()])
    await read_events_then_hang_up(gw, "warm", 3)
    await upstream.wait_for_disconnect(1, timeout=15.0)
    await gw.wait_steps("warm", 1)
    await eventually(lambda: upstream.connections_opened == upstream.connections_closed)
    baseline_tasks = len(asyncio.all_tasks())

    for round_ in range(2):
        upstream.script(UP_PATH, [endless_stream() for _ in range(n)])
        before = upstream.disconnects
        got = await asyncio.gather(*(read_events_then_hang_up(gw, f"r{round_}-{i}", 3) for i in range(n)))
        assert all(g.count(b"data: ") >= 3 for g in got)
        await upstream.wait_for_disconnect(before + n, timeout=2.0)
        for i in range(n):
            [step] = await gw.wait_steps(f"r{round_}-{i}", 1)
            assert step.status == "client_disconnected"
            assert content_of(step).startswith("t0t1t2")
        await eventually(lambda: upstream.connections_opened == upstream.connections_closed)
        await eventually(lambda: gw.app_state.upstream.in_flight["m"] == 0 and upstream.in_flight == 0)
        await eventually(lambda: len(asyncio.all_tasks()) <= baseline_tasks, timeout=5)
    assert (
        await gw.metric("gateway_requests_total", endpoint="chat.completions", route="m", status="499")
        == 2 * n + 1
    )


async def test_disconnect_before_upstream_headers_releases_the_route(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(routes={"m": {"max_concurrency": 1}})
    upstream.script(
        UP_PATH,
        [Reply.sse([chat_chunk("late", role="assistant", finish_reason="stop"), DONE], delay_headers_s=0.3)],
    )

    async def call() -> None:
        async with httpx.AsyncClient(base_url=gw.url, timeout=10) as http:
            await http.post(
                "/v1/sessions/s1/chat/completions", json={"model": "m", "messages": MESSAGES, "stream": True}
            )

    task = asyncio.ensure_future(call())
    await upstream.wait_for_requests(1)
    task.cancel()  # the client hangs up while the gateway waits for the upstream's headers
    with pytest.raises(asyncio.CancelledError):
        await task
    # the route's only slot must come back: the next call is served
    async with asyncio.timeout(5):
        out = await gw.client("s2").chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert out.choices[0].message.content == DEFAULT_TEXT
    [step] = await gw.wait_steps("s1", 1)
    assert step.status == "client_disconnected"
    await eventually(lambda: upstream.connections_opened == upstream.connections_closed + 1)  # s2's, pooled
    assert gw.app_state.upstream.in_flight["m"] == 0


# a client disconnect without a stream: the client gives up while the gateway waits for the upstream's answer
# (openai SDK timeout, or the launcher killing the runtime). Cases: no headers yet; headers sent
# but the body stalls; a stream asked from a route that cannot stream (the gateway waits for a
# whole answer); a stream whose upstream has not sent its headers yet.
SLOW_ANSWERS = {
    "no-headers": (
        False,
        {},
        lambda: Reply.json(chat_completion("late"), delay_headers_s=30),
        None,
        "first-byte",
    ),
    "body-stalls": (False, {}, lambda: Reply.json(chat_completion("late"), delay_s=30), 200, "body"),
    "synthesized-stream": (
        True,
        {"supports_stream": False},
        lambda: Reply.json(chat_completion("late"), delay_headers_s=30),
        None,
        "first-byte",
    ),
    "stream-no-headers": (
        True,
        {},
        lambda: Reply.sse(
            [chat_chunk("late", role="assistant", finish_reason="stop"), DONE], delay_headers_s=30
        ),
        None,
        "first-byte",
    ),
}


@pytest.mark.parametrize("case", list(SLOW_ANSWERS))
async def test_client_leaving_before_the_answer_cancels_the_upstream_call(
    start_gateway: StartGateway, upstream: FakeUpstream, case: str
) -> None:
    stream, route, slow, status_code, phase = SLOW_ANSWERS[case]
    # retry_join_window_s 0: the SDK's call is cancelled, not kept for a retry (test_retry_join.py)
    gw = await start_gateway(
        max_steps=1, retry_join_window_s=0, routes={"m": {"max_concurrency": 1, **route}}
    )
    upstream.script(UP_PATH, [slow()])
    impatient = gw.client("s1", timeout=1.0)
    with pytest.raises(openai.APITimeoutError):
        res = await impatient.chat.completions.create(model="m", messages=MESSAGES, stream=stream)  # type: ignore[call-overload]
        if stream:
            async for _ in res:
                pass
    # the gateway hangs up on the upstream when the client leaves (not when the upstream answers,
    # 30 s later); the waits are generous for a loaded machine, the bounds far from 30 s
    await upstream.wait_for_disconnect(1, timeout=15.0)
    assert upstream.requests[0].disconnected
    [step] = await gw.wait_steps("s1", 1, timeout=15.0)
    assert (step.status, step.status_code, step.is_stream) == ("client_disconnected", status_code, stream)
    assert step.meta_json["phase"] == phase
    assert step.response["error"]["code"] == "client_disconnected"
    assert step.is_trainable is True and "after_close" not in step.meta_json
    assert 900 < (step.latency_ms or 0) < 15000
    # the route's only slot is free again: the next call is served (not after the upstream's 30 s)
    async with asyncio.timeout(15):
        out = await gw.client("s2").chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert out.choices[0].message.content == DEFAULT_TEXT
    assert gw.app_state.upstream.in_flight["m"] == 0
    # the model was called: the step counts against the budget (max_steps 1)
    raw = await gw.client("s1").chat.completions.with_raw_response.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert raw.headers["x-gateway-stop-reason"] == "max_steps"
    assert len(upstream.requests) == 2
    assert (
        await gw.metric("gateway_requests_total", endpoint="chat.completions", route="m", status="499") == 1
    )
    assert gw.app_state.sessions.in_flight("s1") == 0


async def test_passthrough_client_leaving_cancels_the_upstream_call(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    upstream.script(UP_PATH, [Reply.json(chat_completion("late"), delay_headers_s=30)])
    with pytest.raises(openai.APITimeoutError):
        await gw.client(timeout=0.5).chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    await upstream.wait_for_disconnect(1, timeout=15.0)
    await eventually(lambda: gw.app_state.upstream.in_flight["m"] == 0)
    assert gw.sql("SELECT count(*) AS n FROM session_steps")[0]["n"] == 0


# ---------------------------------------------------------------------------- upstream timeouts
@pytest.mark.parametrize("stream", [False, True])
async def test_no_headers_within_read_timeout_is_504_timeout(
    start_gateway: StartGateway, upstream: FakeUpstream, stream: bool
) -> None:
    gw = await start_gateway(routes={"m": {"read_timeout_s": 0.3}})
    upstream.script(UP_PATH, [Reply(never_respond=True)])
    with pytest.raises(openai.InternalServerError) as ei:
        res = await gw.client("s1").chat.completions.create(model="m", messages=MESSAGES, stream=stream)  # type: ignore[call-overload]
        if stream:
            async for _ in res:
                pass
    assert ei.value.status_code == 504
    err = ei.value.response.json()["error"]
    assert (err["type"], err["code"]) == ("timeout_error", "upstream_timeout")
    [step] = await gw.steps("s1")
    assert (step.status, step.status_code) == ("timeout", 504)
    assert step.meta_json["phase"] == "first-byte"
    await upstream.wait_for_disconnect(1, timeout=15.0)


async def test_stall_after_headers_before_first_event(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(routes={"m": {"read_timeout_s": 0.3}})
    upstream.script(UP_PATH, [Reply.sse([chat_chunk("late", role="assistant"), DONE], delay_s=[2.0, 0])])
    r = await gw.http().post(
        "/v1/sessions/s1/chat/completions", json={"model": "m", "messages": MESSAGES, "stream": True}
    )
    assert r.status_code == 200  # the answer had started (headers relayed) ...
    [event] = sse_json(r.content)  # ... and ends with an error event, not [DONE]
    assert event["error"]["code"] == "upstream_timeout" and b"[DONE]" not in r.content
    [step] = await gw.steps("s1")
    assert (step.status, step.meta_json["phase"], step.ttft_ms) == ("timeout", "first-byte", None)


async def test_idle_stall_mid_stream(start_gateway: StartGateway, upstream: FakeUpstream) -> None:
    gw = await start_gateway(routes={"m": {"read_timeout_s": 0.3}})
    upstream.script(
        UP_PATH,
        [Reply.sse([chat_chunk("part", role="assistant"), chat_chunk("never"), DONE], delay_s=[0, 2.0, 0])],
    )
    with pytest.raises(openai.APIError, match="timed out"):
        async for _ in await gw.client("s1").chat.completions.create(
            model="m", messages=MESSAGES, stream=True
        ):  # type: ignore[arg-type]
            pass
    [step] = await gw.steps("s1")
    assert (step.status, step.meta_json["phase"], content_of(step)) == ("timeout", "idle", "part")


async def test_non_stream_body_stall_is_a_timeout(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(routes={"m": {"read_timeout_s": 0.3}})
    upstream.script(UP_PATH, [Reply.json(chat_completion(), delay_s=2.0)])
    with pytest.raises(openai.InternalServerError) as ei:
        await gw.client("s1").chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert ei.value.status_code == 504
    assert ei.value.response.json()["error"]["code"] == "upstream_timeout"
    [step] = await gw.steps("s1")
    assert (step.status, step.status_code, step.meta_json["phase"]) == ("timeout", 504, "body")


async def test_read_timeout_does_not_cap_a_progressing_stream(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(routes={"m": {"read_timeout_s": 0.3}})
    chunks = [chat_chunk(f"w{i}", role="assistant" if i == 0 else None) for i in range(6)]
    upstream.script(UP_PATH, [Reply.sse([*chunks, chat_chunk(finish_reason="stop"), DONE], delay_s=0.15)])
    text = ""
    async for c in await gw.client("s1").chat.completions.create(model="m", messages=MESSAGES, stream=True):  # type: ignore[arg-type]
        text += (c.choices[0].delta.content or "") if c.choices else ""
    assert text == "w0w1w2w3w4w5"
    [step] = await gw.steps("s1")
    assert step.status == "ok" and step.latency_ms is not None and step.latency_ms > 900


# ------------------------------------------------------------------------------ max_concurrency
@pytest.mark.parametrize("stream", [False, True])
async def test_max_concurrency_caps_upstream_calls_in_flight(
    start_gateway: StartGateway, upstream: FakeUpstream, stream: bool
) -> None:
    gw = await start_gateway(routes={"m": {"max_concurrency": 2}, "free": {}})
    for _ in range(6):
        if stream:
            upstream.script(
                UP_PATH,
                [
                    Reply.sse(
                        [
                            chat_chunk("x", role="assistant"),
                            chat_chunk("y"),
                            chat_chunk(finish_reason="stop"),
                            DONE,
                        ],
                        delay_s=0.05,
                    )
                ],
            )
        else:
            upstream.script(UP_PATH, [Reply.json(chat_completion("xy"), delay_headers_s=0.15)])

    async def one(i: int) -> str:
        client = gw.client(f"s{i}")
        if stream:
            text = ""
            async for c in await client.chat.completions.create(model="m", messages=MESSAGES, stream=True):  # type: ignore[arg-type]
                text += (c.choices[0].delta.content or "") if c.choices else ""
            return text
        out = await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        return out.choices[0].message.content or ""

    assert await asyncio.gather(*(one(i) for i in range(6))) == ["xy"] * 6
    assert len(upstream.requests) == 6
    assert upstream.max_in_flight == 2
    assert gw.app_state.upstream.in_flight == {"m": 0, "free": 0}


async def test_max_concurrency_is_per_route(start_gateway: StartGateway, upstream: FakeUpstream) -> None:
    gw = await start_gateway(routes={"m": {"max_concurrency": 1}, "free": {}})
    upstream.script(UP_PATH, [Reply.json(chat_completion("slow"), delay_headers_s=0.5)])
    slow = asyncio.ensure_future(gw.client("a").chat.completions.create(model="m", messages=MESSAGES))  # type: ignore[arg-type]
    await upstream.wait_for_requests(1)
    out = await gw.client("b").chat.completions.create(model="free", messages=MESSAGES)  # type: ignore[arg-type]
    assert out.choices[0].message.content == DEFAULT_TEXT
    assert not slow.done()  # the other route was not held up by m's limit
    assert (await slow).choices[0].message.content == "slow"
    assert upstream.max_in_flight == 2


# -------------------------------------------------------------------------------- large bodies
async def test_20mb_request_body_is_accepted(gw: Gateway, upstream: FakeUpstream) -> None:
    image = "data:image/png;base64," + "A" * 19_000_000
    history = [{"role": "user", "content": "x" * 1000}] * 500
    messages = [
        *history,
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": image}},
            ],
        },
    ]
    out = await gw.client("s1").chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
    assert out.choices[0].message.content == DEFAULT_TEXT
    assert len(upstream.requests[0].body) > 19_500_000
    [step] = await gw.steps("s1")
    assert step.status == "ok"
    assert len(step.messages) == 501
    assert step.messages[-1]["content"][1]["image_url"]["url"] == image


async def test_request_over_the_body_limit_is_413(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(max_request_bytes=1_000_000)
    with pytest.raises(openai.APIStatusError) as ei:
        await gw.client("s1").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x" * 2_000_000}]
        )  # type: ignore[arg-type]
    assert ei.value.status_code == 413
    err = ei.value.response.json()["error"]
    assert (err["type"], err["code"]) == ("invalid_request_error", "request_too_large")

    async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: the limit holds while reading
        yield b'{"model": "m", "messages": [{"role": "user", "content": "'
        for _ in range(20):
            yield b"y" * 100_000
        yield b'"}]}'

    r = await gw.http().post(
        "/v1/sessions/s1/chat/completions", content=chunked(), headers={"content-type": "application/json"}
    )
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    # just under the limit is fine
    out = await gw.client("s1").chat.completions.create(
        model="m", messages=[{"role": "user", "content": "z" * 900_000}]
    )  # type: ignore[arg-type]
    assert out.choices[0].message.content == DEFAULT_TEXT
    assert len(upstream.requests) == 1
    assert [s.status for s in await gw.steps("s1")] == ["ok"]


# ------------------------------------------------------------------------------ supports_stream
@pytest.mark.parametrize("client_usage", [False, True])
async def test_route_without_streaming_gets_a_synthesized_stream(
    start_gateway: StartGateway, upstream: FakeUpstream, client_usage: bool
) -> None:
    gw = await start_gateway(routes={"m": {"supports_stream": False}})
    body: dict[str, Any] = {"model": "m", "messages": MESSAGES, "stream": True}
    if client_usage:
        body["stream_options"] = {"include_usage": True}
    r = await gw.http().post("/v1/sessions/s1/chat/completions", json=body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert r.content.endswith(b"data: [DONE]\n\n")
    sent = upstream.requests[0].json
    assert sent == {"model": "m", "messages": MESSAGES}  # asked without streaming
    chunks = sse_json(r.content)
    assert (
        "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == DEFAULT_TEXT
    )
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    usage_chunks = [c for c in chunks if not c["choices"]]
    assert usage_chunks == ([{**usage_chunks[0], "usage": DEFAULT_USAGE}] if client_usage else [])
    [step] = await gw.steps("s1")
    assert (step.is_stream, step.status, step.finish_reason, step.total_tokens) == (True, "ok", "stop", 8)
    assert step.request == sent
    assert step.response == chat_completion(DEFAULT_TEXT, model="m")
    assert step.meta_json == {"route": "m", "stream_synthesized": True}


async def test_synthesized_stream_carries_tool_calls_and_reasoning_to_the_sdk(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(routes={"m": {"supports_stream": False}})
    calls = [
        {"id": "call_1", "type": "function", "function": {"name": "a", "arguments": '{"x": 1}'}},
        {"id": "call_2", "type": "function", "function": {"name": "b", "arguments": "{}"}},
    ]
    upstream.script(
        UP_PATH,
        [Reply.json(chat_completion(None, tool_calls=calls, reasoning="think", finish_reason="tool_calls"))],
    )
    got: dict[int, dict[str, str]] = {}
    finish = None
    reasoning = ""
    async for c in await gw.client("s1").chat.completions.create(model="m", messages=MESSAGES, stream=True):  # type: ignore[arg-type]
        for ch in c.choices:
            finish = ch.finish_reason or finish
            reasoning += (ch.delta.model_extra or {}).get("reasoning_content") or ""
            for tc in ch.delta.tool_calls or []:
                e = got.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                e["id"] += tc.id or ""
                e["name"] += (tc.function.name or "") if tc.function else ""
                e["arguments"] += (tc.function.arguments or "") if tc.function else ""
    assert finish == "tool_calls" and reasoning == "think"
    assert [(v["id"], v["name"], v["arguments"]) for _, v in sorted(got.items())] == [
        ("call_1", "a", '{"x": 1}'),
        ("call_2", "b", "{}"),
    ]


async def test_upstream_answering_json_to_a_stream_request_is_streamed(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    upstream.script(UP_PATH, [Reply.json(chat_completion("plain"))])  # an upstream that ignores "stream"
    text = ""
    async for c in await gw.client("s1").chat.completions.create(model="m", messages=MESSAGES, stream=True):  # type: ignore[arg-type]
        text += (c.choices[0].delta.content or "") if c.choices else ""
    assert text == "plain"
    [step] = await gw.steps("s1")
    assert (step.status, step.is_stream, step.response) == ("ok", True, chat_completion("plain"))
    assert step.meta_json["stream_synthesized"] is True


async def test_route_without_streaming_relays_upstream_errors(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(routes={"m": {"supports_stream": False, **NO_RETRY}})
    err = {"error": {"message": "slow down", "type": "rate_limit_error", "param": None, "code": None}}
    upstream.script(UP_PATH, [Reply.json(err, status=429, headers={"Retry-After": "2"})])
    with pytest.raises(openai.RateLimitError) as ei:
        async for _ in await gw.client("s1").chat.completions.create(
            model="m", messages=MESSAGES, stream=True
        ):  # type: ignore[arg-type]
            pass
    assert ei.value.response.headers["retry-after"] == "2" and ei.value.response.json() == err
    [step] = await gw.steps("s1")
    assert (step.status, step.status_code, step.is_stream) == ("error", 429, True)


# ------------------------------------------------------------------------------ unexpected errors
async def test_unexpected_error_is_500_in_openai_shape(
    gw: Gateway, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*_a: object, **_k: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(gw.app_state.sessions, "reserve", broken)
    r = await gw.http().post("/v1/sessions/s1/chat/completions", json={"model": "m", "messages": MESSAGES})
    assert r.status_code == 500
    body = r.json()
    assert body["error"]["type"] == "api_error" and body["error"]["code"] == "internal_error"
    assert "RuntimeError" in body["error"]["message"]
    assert json.loads(r.content) == body


async def test_unexpected_error_mid_stream_ends_with_an_error_event(
    gw: Gateway, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    from wire.assembly import ChatStreamAssembler

    real_feed = ChatStreamAssembler.feed_chunk

    def feed(self: Any, obj: Any) -> None:
        if self.chunk_count == 1:
            raise KeyError("assembler bug")
        real_feed(self, obj)

    monkeypatch.setattr(ChatStreamAssembler, "feed_chunk", feed)
    r = await gw.http().post(
        "/v1/sessions/s1/chat/completions", json={"model": "m", "messages": MESSAGES, "stream": True}
    )
    events = sse_json(r.content)
    assert b"[DONE]" not in r.content
    assert events[-1]["error"]["code"] == "internal_error" and "KeyError" in events[-1]["error"]["message"]
    [step] = await gw.steps("s1")
    assert step.status == "error" and step.meta_json["error"]["code"] == "internal_error"
    assert gw.app_state.upstream.in_flight["m"] == 0
