"""Gateway contract for Anthropic Messages (``.../v1/messages``) with the real ``anthropic`` SDK
(``base_url`` = the session URL): forwarding to an ``api: anthropic`` route's
``<base_url>/v1/messages`` with ``x-api-key``/``anthropic-version``, the exact bytes the client
gets, the step recorded (text, thinking with its signature, tool_use input from
``input_json_delta`` pieces, usage from ``message_start`` + ``message_delta``, stop reason),
synthetic stops at ``max_steps``, errors in Anthropic's shape, truncated streams, and one step
budget shared by the three protocols of a session."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import pytest
from anthropic.types import Message

from rollout.grading.trajectory import to_trajectory
from tests.fake_upstream import (
    DEFAULT_TEXT,
    FakeUpstream,
    Reply,
    anthropic_message,
    default_messages_stream,
    sse_event,
)
from tests.gateway.conftest import (
    CLIENT_KEY,
    MESSAGES,
    NO_RETRY,
    ROUTE_KEY,
    Gateway,
    StartGateway,
    StreamReader,
    anthropic_routes,
    events_of,
    eventually,
)

UP_PATH = "/v1/messages"
SESSION_PATH = "/v1/sessions/s1/v1/messages"
SIGNATURE = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"
TOOL = {
    "name": "get_weather",
    "description": "Weather of a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}

# thinking (with its signature), text, then a tool_use whose input arrives as JSON pieces
THINK_TEXT_TOOL = [
    sse_event(e)
    for e in [
        {
            "type": "message_start",
            "message": {
                "id": "msg_t",
                "type": "message",
                "role": "assistant",
                "model": "a",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": 25, "output_tokens": 1, "cache_read_input_tokens": 4},
            },
        },
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "thinking", "thinking": "", "signature": ""},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "thinking_delta", "thinking": "The user wants "},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "thinking_delta", "thinking": "the weather."},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "signature_delta", "signature": SIGNATURE},
        },
        {"type": "content_block_stop", "index": 0},
        {"type": "ping"},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Checking "}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "now."}},
        {"type": "content_block_stop", "index": 1},
        {
            "type": "content_block_start",
            "index": 2,
            "content_block": {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}},
        },
        {
            "type": "content_block_delta",
            "index": 2,
            "delta": {"type": "input_json_delta", "partial_json": ""},
        },
        {
            "type": "content_block_delta",
            "index": 2,
            "delta": {"type": "input_json_delta", "partial_json": '{"city": "Pa'},
        },
        {
            "type": "content_block_delta",
            "index": 2,
            "delta": {"type": "input_json_delta", "partial_json": 'ris"}'},
        },
        {"type": "content_block_stop", "index": 2},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use", "stop_sequence": None},
            "usage": {"output_tokens": 42},
        },
        {"type": "message_stop"},
    ]
]
THINK_TEXT_TOOL_MESSAGE = {
    "id": "msg_t",
    "type": "message",
    "role": "assistant",
    "model": "a",
    "content": [
        {"type": "thinking", "thinking": "The user wants the weather.", "signature": SIGNATURE},
        {"type": "text", "text": "Checking now."},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {"input_tokens": 25, "output_tokens": 42, "cache_read_input_tokens": 4},
}


@pytest.fixture
async def agw(start_gateway: StartGateway, upstream: FakeUpstream) -> Gateway:
    """A gateway with the openai route ``m`` and the anthropic route ``a``."""
    return await start_gateway(routes=anthropic_routes(upstream))


def assert_anthropic_error(body: Any, type_: str) -> str:
    """``body`` is exactly Anthropic's error shape with error type ``type_``; returns the message."""
    assert body["type"] == "error" and set(body) == {"type", "error"}, body
    assert set(body["error"]) == {"type", "message"} and body["error"]["type"] == type_, body
    assert isinstance(body["error"]["message"], str)
    return str(body["error"]["message"])


# ------------------------------------------------------------------------------ non-streamed
async def test_non_stream_text_is_recorded_exactly(agw: Gateway, upstream: FakeUpstream) -> None:
    client = agw.anthropic("s1")
    out = await client.messages.create(
        model="a",
        max_tokens=64,
        system="be brief",
        messages=MESSAGES,  # type: ignore[arg-type]
        extra_body={"temperature": 0.5},
    )
    assert out.content[0].type == "text" and out.content[0].text == DEFAULT_TEXT
    assert (out.stop_reason, out.usage.input_tokens, out.usage.output_tokens) == ("end_turn", 5, 3)

    [sent] = upstream.requests
    assert sent.path == UP_PATH  # <origin base_url> + /v1/messages
    assert sent.json == {
        "model": "a",
        "max_tokens": 64,
        "system": "be brief",
        "messages": MESSAGES,
        "temperature": 0.5,
    }
    assert sent.headers["x-api-key"] == ROUTE_KEY
    assert sent.headers["anthropic-version"] == client.default_headers["anthropic-version"]
    assert "authorization" not in sent.headers and CLIENT_KEY not in json.dumps(sent.headers)

    [step] = await agw.steps("s1")
    assert (step.endpoint, step.llm_model, step.is_stream, step.status, step.status_code) == (
        "messages",
        "a",
        False,
        "ok",
        200,
    )
    assert step.messages == [{"role": "system", "content": "be brief"}, *MESSAGES]
    assert step.request == sent.json
    assert step.response == anthropic_message(DEFAULT_TEXT, model="a")
    assert (step.prompt_tokens, step.completion_tokens, step.total_tokens, step.finish_reason) == (
        5,
        3,
        8,
        "end_turn",
    )
    assert step.meta_json == {"route": "a"}
    dump = agw.db_dump()
    assert ROUTE_KEY not in dump and CLIENT_KEY not in dump and "anthropic-version" not in dump


async def test_non_stream_thinking_and_tool_use(agw: Gateway, upstream: FakeUpstream) -> None:
    upstream.script(UP_PATH, [Reply.json(THINK_TEXT_TOOL_MESSAGE)])
    client = agw.anthropic("s1")
    history: list[Any] = [
        *MESSAGES,
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "toolu_0", "name": "get_weather", "input": {"city": "Rome"}}
            ],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_0", "content": "sunny"}]},
    ]
    out = await client.messages.create(
        model="a",
        max_tokens=1024,
        messages=history,
        tools=[TOOL],  # type: ignore[list-item]
        thinking={"type": "enabled", "budget_tokens": 512},
    )
    thinking, text, tool = out.content
    assert thinking.type == "thinking" and thinking.signature == SIGNATURE
    assert tool.type == "tool_use" and tool.input == {"city": "Paris"}
    assert upstream.requests[0].json["messages"] == history
    [step] = await agw.steps("s1")
    assert step.response == THINK_TEXT_TOOL_MESSAGE
    assert (step.prompt_tokens, step.completion_tokens, step.total_tokens, step.finish_reason) == (
        25,
        42,
        67,
        "tool_use",
    )


# ------------------------------------------------------------------------------ streamed
async def test_stream_thinking_text_and_tool_use_bytes_and_record(
    agw: Gateway, upstream: FakeUpstream
) -> None:
    upstream.script(UP_PATH, [Reply.sse(THINK_TEXT_TOOL)])
    r = await agw.http().post(
        SESSION_PATH,
        json={"model": "a", "max_tokens": 1024, "messages": MESSAGES, "tools": [TOOL], "stream": True},
    )
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert r.content == b"".join(THINK_TEXT_TOOL)  # every event, ping included, byte for byte
    assert upstream.requests[0].json["stream"] is True
    assert upstream.requests[0].headers["anthropic-version"] == "2023-06-01"  # the default

    [step] = await agw.steps("s1")
    assert (step.is_stream, step.status, step.finish_reason) == (True, "ok", "tool_use")
    assert step.response == THINK_TEXT_TOOL_MESSAGE
    # input_tokens from message_start, output_tokens final from message_delta, total = sum
    assert (step.prompt_tokens, step.completion_tokens, step.total_tokens) == (25, 42, 67)
    assert step.meta_json == {"route": "a", "chunks": len(THINK_TEXT_TOOL)}


async def test_stream_through_the_anthropic_sdk(agw: Gateway, upstream: FakeUpstream) -> None:
    upstream.script(UP_PATH, [Reply.sse(THINK_TEXT_TOOL), Reply.sse(THINK_TEXT_TOOL)])
    client = agw.anthropic("s1")
    async with client.messages.stream(
        model="a",
        max_tokens=1024,
        messages=MESSAGES,  # type: ignore[arg-type]
        tools=[TOOL],
    ) as stream:  # type: ignore[list-item]
        texts = [t async for t in stream.text_stream]
        final = await stream.get_final_message()
    assert "".join(texts) == "Checking now."
    assert final.model_dump(exclude_none=True, include={"id", "content", "stop_reason", "usage"}) == {
        "id": "msg_t",
        "stop_reason": "tool_use",
        "content": [
            {"type": "thinking", "thinking": "The user wants the weather.", "signature": SIGNATURE},
            {"type": "text", "text": "Checking now."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
        ],
        "usage": {"input_tokens": 25, "output_tokens": 42, "cache_read_input_tokens": 4},
    }

    raw = await client.messages.create(model="a", max_tokens=1024, messages=MESSAGES, stream=True)  # type: ignore[arg-type]
    types = [e.type async for e in raw]
    assert types == [
        json.loads(c.split(b"data: ", 1)[1])["type"] for c in THINK_TEXT_TOOL if b"ping" not in c
    ]
    steps = await agw.steps("s1")
    assert [s.response for s in steps] == [THINK_TEXT_TOOL_MESSAGE] * 2


async def test_default_stream_and_headers_passed_through(agw: Gateway, upstream: FakeUpstream) -> None:
    r = await agw.http().post(
        SESSION_PATH,
        json={"model": "a", "max_tokens": 10, "messages": MESSAGES, "stream": True},
        headers={
            "anthropic-version": "2024-01-01",
            "anthropic-beta": "tools-2024-05-16",
            "x-api-key": CLIENT_KEY,
            "authorization": f"Bearer {CLIENT_KEY}",
        },
    )
    assert r.content == b"".join(default_messages_stream("a"))
    sent = upstream.requests[0].headers
    assert (sent["anthropic-version"], sent["anthropic-beta"], sent["x-api-key"]) == (
        "2024-01-01",
        "tools-2024-05-16",
        ROUTE_KEY,
    )
    assert "authorization" not in sent
    [step] = await agw.steps("s1")
    assert step.response == {**anthropic_message(DEFAULT_TEXT, model="a")}
    assert (step.prompt_tokens, step.completion_tokens, step.total_tokens) == (5, 3, 8)
    assert CLIENT_KEY not in agw.db_dump() and ROUTE_KEY not in agw.db_dump()


async def test_truncated_stream_ends_with_an_error_event(agw: Gateway, upstream: FakeUpstream) -> None:
    cut = THINK_TEXT_TOOL[:9]  # up to the first text delta: no message_delta, no message_stop
    upstream.script(UP_PATH, [Reply.sse(cut), Reply.sse(cut)])
    r = await agw.http().post(
        SESSION_PATH, json={"model": "a", "max_tokens": 10, "messages": MESSAGES, "stream": True}
    )
    assert r.content.startswith(b"".join(cut))
    name, err = events_of(r.content)[-1]
    assert name == "error"
    assert "message_stop" in assert_anthropic_error(err, "api_error")
    [step] = await agw.steps("s1")
    assert (step.status, step.is_truncated, step.finish_reason) == ("truncated", True, None)
    assert step.response["content"] == [
        {"type": "thinking", "thinking": "The user wants the weather.", "signature": SIGNATURE},
        {"type": "text", "text": "Checking "},
    ]
    assert (step.prompt_tokens, step.completion_tokens, step.total_tokens) == (25, 1, 26)  # known so far

    client = agw.anthropic("s1")
    with pytest.raises(anthropic.APIStatusError) as ei:
        async with client.messages.stream(model="a", max_tokens=10, messages=MESSAGES) as stream:  # type: ignore[arg-type]
            await stream.get_final_message()
    assert "upstream_stream_truncated" not in str(ei.value) and "message_stop" in str(ei.value)


async def test_error_event_inside_a_200_stream(agw: Gateway, upstream: FakeUpstream) -> None:
    chunks = [
        THINK_TEXT_TOOL[0],
        sse_event({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    ]
    upstream.script(UP_PATH, [Reply.sse(chunks)])
    r = await agw.http().post(
        SESSION_PATH, json={"model": "a", "max_tokens": 10, "messages": MESSAGES, "stream": True}
    )
    assert r.content == b"".join(chunks)  # relayed as sent, nothing added
    [step] = await agw.steps("s1")
    assert step.status == "error" and step.meta_json["error"] == {
        "type": "overloaded_error",
        "message": "Overloaded",
    }


async def test_client_disconnect_mid_stream_records_the_partial_message(
    agw: Gateway, upstream: FakeUpstream
) -> None:
    start = sse_event(
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    )
    endless = [THINK_TEXT_TOOL[0], start] + [
        sse_event(
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": f"t{i}"}}
        )
        for i in range(2000)
    ]
    upstream.script(UP_PATH, [Reply.sse(endless, delay_s=0.02)])
    client = agw.anthropic("s1")
    async with client.messages.stream(model="a", max_tokens=10, messages=MESSAGES) as stream:  # type: ignore[arg-type]
        seen = ""
        async for text in stream.text_stream:
            seen += text
            if seen == "t0t1t2":
                break
    await upstream.wait_for_disconnect(1, timeout=1.0)
    [step] = await agw.wait_steps("s1", 1)
    assert (step.status, step.finish_reason) == ("client_disconnected", None)
    assert step.response["content"][0]["text"].startswith("t0t1t2")
    assert (step.prompt_tokens, step.completion_tokens) == (25, 1)
    await eventually(lambda: agw.app_state.upstream.in_flight["a"] == 0)


async def test_route_without_streaming_gets_a_synthesized_stream(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(routes=anthropic_routes(upstream, supports_stream=False))
    upstream.script(UP_PATH, [Reply.json(THINK_TEXT_TOOL_MESSAGE)])
    client = gw.anthropic("s1")
    async with client.messages.stream(model="a", max_tokens=10, messages=MESSAGES) as stream:  # type: ignore[arg-type]
        final = await stream.get_final_message()
    assert final.model_dump(exclude_none=True, include={"content", "stop_reason", "usage"}) == {
        k: THINK_TEXT_TOOL_MESSAGE[k] for k in ("content", "stop_reason", "usage")
    }
    assert "stream" not in upstream.requests[0].json
    [step] = await gw.steps("s1")
    assert step.response == THINK_TEXT_TOOL_MESSAGE and step.meta_json == {
        "route": "a",
        "stream_synthesized": True,
    }


# ------------------------------------------------------------------------------ budget
async def test_synthetic_stop_at_max_steps(start_gateway: StartGateway, upstream: FakeUpstream) -> None:
    gw = await start_gateway(routes=anthropic_routes(upstream), max_steps=1)
    client = gw.anthropic("s1")
    await client.messages.create(model="a", max_tokens=10, messages=MESSAGES)  # type: ignore[arg-type]
    raw = await client.messages.with_raw_response.create(model="a", max_tokens=10, messages=MESSAGES)  # type: ignore[arg-type]
    assert raw.http_response.status_code == 200 and raw.headers["x-gateway-stop-reason"] == "max_steps"
    stop = await raw.parse()
    assert (stop.type, stop.role, stop.model, stop.content, stop.stop_reason) == (
        "message",
        "assistant",
        "a",
        [],
        "end_turn",
    )
    assert (stop.usage.input_tokens, stop.usage.output_tokens) == (0, 0)
    Message.model_validate(raw.http_response.json())  # a valid message, strictly

    r = await gw.http().post(
        SESSION_PATH, json={"model": "a", "max_tokens": 10, "messages": MESSAGES, "stream": True}
    )
    assert r.status_code == 200 and r.headers["x-gateway-stop-reason"] == "max_steps"
    events = events_of(r.content)
    assert [(name, ev["type"]) for name, ev in events] == [
        ("message_start", "message_start"),
        ("message_delta", "message_delta"),
        ("message_stop", "message_stop"),
    ]
    assert events[1][1]["delta"]["stop_reason"] == "end_turn"
    async with client.messages.stream(model="a", max_tokens=10, messages=MESSAGES) as stream:  # type: ignore[arg-type]
        final = await stream.get_final_message()
    assert (final.content, final.stop_reason, final.usage.output_tokens) == ([], "end_turn", 0)
    assert len(upstream.requests) == 1
    assert [s.endpoint for s in await gw.steps("s1")] == ["messages"]
    assert await gw.metric("gateway_synthetic_stops_total") == 3


async def test_budget_is_counted_across_the_protocols_of_the_session_route(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    """Chat completions and Responses calls of a session share its budget; a Messages call of the
    same session names another route (an anthropic one) and is refused: a session has one route."""
    gw = await start_gateway(routes=anthropic_routes(upstream), max_steps=2)
    oai, ant = gw.client("s1"), gw.anthropic("s1")
    chat = await oai.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    resp = await oai.responses.create(model="m", input="hi")
    assert [chat.choices[0].message.content, resp.output_text] == [DEFAULT_TEXT] * 2
    # the budget is used: each protocol now gets its own synthetic stop, without an upstream call
    assert (await oai.responses.create(model="m", input="hi")).output == []
    assert (await oai.chat.completions.create(model="m", messages=MESSAGES)).choices[0].message.content == ""  # type: ignore[arg-type]
    with pytest.raises(anthropic.BadRequestError) as e:
        await ant.messages.create(model="a", max_tokens=10, messages=MESSAGES)  # type: ignore[arg-type]
    assert "bound to route `m`" in str(e.value)
    assert len(upstream.requests) == 2

    steps = await gw.steps("s1")
    assert [(s.seq, s.endpoint, s.llm_model, s.step_id) for s in steps] == [
        (1, "chat.completions", "m", 1),
        (2, "responses", "m", 2),
    ]
    assert [(s.prompt_tokens, s.completion_tokens, s.total_tokens) for s in steps] == [(5, 3, 8)] * 2
    assert [s.finish_reason for s in steps] == ["stop", "completed"]
    r = await gw.http().get("/v1/sessions/s1")
    assert (r.json()["status"], r.json()["total_steps"], r.json()["step_counts"]) == (
        "truncated",
        2,
        {"m": 2},
    )
    traj = to_trajectory("s1", steps)
    assert [s.content for s in traj.steps] == [DEFAULT_TEXT] * 2 and traj.final_response == DEFAULT_TEXT


# ------------------------------------------------------------------------------ errors
async def test_unknown_route_is_404_in_anthropic_shape(agw: Gateway, upstream: FakeUpstream) -> None:
    with pytest.raises(anthropic.NotFoundError) as ei:
        await agw.anthropic("s1").messages.create(model="nope", max_tokens=10, messages=MESSAGES)  # type: ignore[arg-type]
    assert "nope" in assert_anthropic_error(ei.value.response.json(), "not_found_error")
    assert upstream.requests == [] and await agw.steps("s1") == []


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"{not json", "not valid JSON"),
        (b"", "empty"),
        (b"[1]", "JSON object"),
        (b'{"max_tokens": 10, "messages": [{"role": "user", "content": "x"}]}', "'model'"),
        (b'{"model": "a", "messages": [{"role": "user", "content": "x"}]}', "'max_tokens'"),
        (b'{"model": "a", "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}', "max_tokens"),
        (b'{"model": "a", "max_tokens": 10, "messages": []}', "messages"),
        (b'{"model": "a", "max_tokens": 10, "messages": [{"role": "user"}]}', "messages[0].content"),
        (
            b'{"model": "a", "max_tokens": 10, "messages": [{"role": "user", "content": 5}]}',
            "messages[0].content",
        ),
        (
            b'{"model": "a", "max_tokens": 10, "messages": [{"role": "user", "content": "x"}], "temperature": 1.5}',
            "temperature",
        ),
        (
            b'{"model": "a", "max_tokens": 10, "messages": [{"role": "user", "content": "x"}], "stream": "no"}',
            "stream",
        ),
        (b'{"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "x"}]}', "openai"),
    ],
)
async def test_malformed_body_is_400_in_anthropic_shape(
    agw: Gateway, upstream: FakeUpstream, body: bytes, fragment: str
) -> None:
    for path in (SESSION_PATH, UP_PATH):
        r = await agw.http().post(path, content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400, r.text
        assert fragment in assert_anthropic_error(r.json(), "invalid_request_error")
    assert upstream.requests == [] and await agw.steps("s1") == []


async def test_malformed_body_through_the_sdk(agw: Gateway, upstream: FakeUpstream) -> None:
    with pytest.raises(anthropic.BadRequestError) as ei:
        await agw.anthropic("s1").messages.create(model="a", max_tokens=0, messages=MESSAGES)  # type: ignore[arg-type]
    assert ei.value.body == ei.value.response.json() and ei.value.response.json()["type"] == "error"


async def test_gateway_and_upstream_errors_keep_anthropic_shape(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    routes = anthropic_routes(upstream, read_timeout_s=0.3, **NO_RETRY)
    routes["down"] = {"api": "anthropic", "base_url": "http://127.0.0.1:9", **NO_RETRY}
    gw = await start_gateway(routes=routes)
    client = gw.anthropic("s1")
    body: dict[str, Any] = {"model": "a", "max_tokens": 10, "messages": MESSAGES}

    err = {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}
    upstream.script(
        UP_PATH, [Reply.json(err, status=429, headers={"retry-after": "3", "request-id": "req_1"})]
    )
    with pytest.raises(anthropic.RateLimitError) as ei:
        await client.messages.create(**body)
    assert ei.value.response.json() == err  # relayed as the upstream sent it
    assert (ei.value.response.headers["retry-after"], ei.value.response.headers["request-id"]) == (
        "3",
        "req_1",
    )

    upstream.script(UP_PATH, [Reply(never_respond=True)])
    with pytest.raises(anthropic.APIStatusError) as ei2:
        await client.messages.create(**body)
    assert ei2.value.status_code == 504
    assert_anthropic_error(ei2.value.response.json(), "timeout_error")

    with pytest.raises(anthropic.APIStatusError) as ei3:
        await gw.anthropic("s-down").messages.create(**{**body, "model": "down"})
    assert ei3.value.status_code == 502
    assert "unreachable" in assert_anthropic_error(ei3.value.response.json(), "api_error")
    with pytest.raises(anthropic.BadRequestError) as mismatch:  # s1 is bound to route a
        await client.messages.create(**{**body, "model": "down"})
    assert "bound to route `a`" in assert_anthropic_error(
        mismatch.value.response.json(), "invalid_request_error"
    )

    upstream.script(UP_PATH, [Reply.raw(b"<html>oops</html>", content_type="text/html")])
    with pytest.raises(anthropic.APIStatusError) as ei4:
        await client.messages.create(**body)
    assert ei4.value.status_code == 502
    assert "not a JSON Anthropic message" in assert_anthropic_error(ei4.value.response.json(), "api_error")

    steps = await gw.steps("s1")
    assert [(s.status, s.status_code) for s in steps] == [("error", 429), ("timeout", 504), ("error", 502)]
    assert [(s.status, s.status_code) for s in await gw.steps("s-down")] == [("error", 502)]
    assert steps[1].response["type"] == "error" and steps[1].meta_json["error"]["code"] == "upstream_timeout"

    await gw.http().post("/v1/sessions/s1/close", json={})
    with pytest.raises(anthropic.ConflictError) as ei5:
        await client.messages.create(**body)
    assert "closed" in assert_anthropic_error(ei5.value.response.json(), "invalid_request_error")


async def test_unexpected_error_is_500_in_anthropic_shape(
    agw: Gateway, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*_a: object, **_k: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(agw.app_state.sessions, "reserve", broken)
    r = await agw.http().post(SESSION_PATH, json={"model": "a", "max_tokens": 10, "messages": MESSAGES})
    assert r.status_code == 500
    assert "RuntimeError" in assert_anthropic_error(r.json(), "api_error")


async def test_passthrough_is_forwarded_but_not_recorded(agw: Gateway, upstream: FakeUpstream) -> None:
    out = await agw.anthropic().messages.create(model="a", max_tokens=10, messages=MESSAGES)  # type: ignore[arg-type]
    assert out.content[0].type == "text" and out.content[0].text == DEFAULT_TEXT
    assert [rq.path for rq in upstream.requests] == [UP_PATH]
    assert "x-session-id" not in upstream.requests[0].headers
    assert agw.sql("SELECT * FROM session_steps") == []


async def test_strict_mode_commits_the_step_before_message_stop(agw: Gateway, upstream: FakeUpstream) -> None:
    lock = agw.hold_write_lock()  # the gateway's commit must wait for this lock
    stream = StreamReader(
        agw.http(), SESSION_PATH, {"model": "a", "max_tokens": 10, "messages": MESSAGES, "stream": True}
    )
    try:
        await stream.until(b"message_delta")
        await stream.assert_nothing_more()
        lock.rollback()
        rest = await stream.rest()
        assert rest == default_messages_stream("a")[-1]
    finally:
        lock.close()
        await stream.aclose()
