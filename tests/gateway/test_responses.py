"""Gateway contract for the OpenAI Responses API (``.../responses``): forwarding to the route's
``<base_url>/responses``, the exact bytes and events the real ``openai`` SDK gets, the step
recorded from non-streamed answers and from streams (arguments only in ``.done``,
the final output nested in ``response.completed``, no ``[DONE]``, an HTML 502), synthetic stops
at ``max_steps`` in the Responses shape, and errors in OpenAI's shape."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from openai.types.responses import Response

from tests.fake_upstream import (
    DEFAULT_TEXT,
    FakeUpstream,
    Reply,
    default_responses_stream,
    response_object,
    sse_event,
)
from tests.faults import HTML_502_PAGE, RESPONSES_ARGS_ONLY_IN_DONE, RESPONSES_NO_COMPLETED
from tests.gateway.conftest import (
    CLIENT_KEY,
    NO_RETRY,
    ROUTE_KEY,
    Gateway,
    StartGateway,
    StreamReader,
    anthropic_routes,
    events_of,
)

UP_PATH = "/v1/responses"
SESSION_PATH = "/v1/sessions/s1/responses"
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CALL = {
    "type": "function_call",
    "id": "fc1",
    "call_id": "call_1",
    "name": "get_weather",
    "arguments": '{"city":"Paris"}',
    "status": "completed",
}


# ------------------------------------------------------------------------------ non-streamed
async def test_non_stream_call_is_recorded_exactly(gw: Gateway, upstream: FakeUpstream) -> None:
    client = gw.client("s1")
    out = await client.responses.create(model="m", input="hi", instructions="be brief", temperature=0.5)
    assert out.output_text == DEFAULT_TEXT
    assert out.usage is not None and (out.usage.input_tokens, out.usage.output_tokens) == (5, 3)

    [sent] = upstream.requests
    assert sent.path == UP_PATH
    assert sent.json == {"model": "m", "input": "hi", "instructions": "be brief", "temperature": 0.5}
    assert sent.headers["authorization"] == f"Bearer {ROUTE_KEY}"
    assert sent.headers["x-session-id"] == "s1"

    [step] = await gw.steps("s1")
    assert (step.endpoint, step.is_stream, step.status, step.status_code) == ("responses", False, "ok", 200)
    assert step.messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert step.request == sent.json
    assert step.response == response_object(DEFAULT_TEXT, model="m")
    assert (step.prompt_tokens, step.completion_tokens, step.total_tokens) == (5, 3, 8)
    assert step.finish_reason == "completed"
    assert step.meta_json == {"route": "m"}
    assert CLIENT_KEY not in gw.db_dump() and ROUTE_KEY not in gw.db_dump()


async def test_function_tools_both_ways_through_the_sdk(gw: Gateway, upstream: FakeUpstream) -> None:
    answer = response_object(
        output=[CALL], usage={"input_tokens": 40, "output_tokens": 12, "total_tokens": 52}
    )
    upstream.script(UP_PATH, [Reply.json(answer)])
    client = gw.client("s1")
    history: list[Any] = [
        {"role": "user", "content": "weather in Paris?"},
        {"type": "function_call", "call_id": "call_0", "name": "get_weather", "arguments": '{"city":"Rome"}'},
        {"type": "function_call_output", "call_id": "call_0", "output": "sunny"},
    ]
    out = await client.responses.create(model="m", input=history, tools=[WEATHER_TOOL])  # type: ignore[list-item]
    [item] = out.output
    assert item.type == "function_call"
    assert (item.call_id, item.name, json.loads(item.arguments)) == (
        "call_1",
        "get_weather",
        {"city": "Paris"},
    )
    assert upstream.requests[0].json["tools"] == [WEATHER_TOOL]
    assert upstream.requests[0].json["input"] == history

    [step] = await gw.steps("s1")
    assert step.messages == history
    assert step.response["output"] == [CALL]
    assert (step.prompt_tokens, step.completion_tokens, step.total_tokens, step.finish_reason) == (
        40,
        12,
        52,
        "completed",
    )


async def test_incomplete_and_failed_answers(gw: Gateway, upstream: FakeUpstream) -> None:
    incomplete = {
        **response_object("partial"),
        "status": "incomplete",
        "incomplete_details": {"reason": "max_output_tokens"},
    }
    failed = {
        **response_object(output=[]),
        "status": "failed",
        "usage": None,
        "error": {"code": "server_error", "message": "the model crashed"},
    }
    upstream.script(UP_PATH, [Reply.json(incomplete), Reply.json(failed)])
    client = gw.client("s1")
    assert (await client.responses.create(model="m", input="hi")).status == "incomplete"
    assert (await client.responses.create(model="m", input="hi")).status == "failed"
    s1, s2 = await gw.steps("s1")
    assert (s1.status, s1.finish_reason, s1.total_tokens) == ("ok", "max_output_tokens", 8)
    assert (s2.status, s2.finish_reason, s2.total_tokens) == ("error", "failed", None)
    assert s2.meta_json["error"] == "the model crashed"


# ------------------------------------------------------------------------------ streamed
async def test_stream_bytes_events_and_record(gw: Gateway, upstream: FakeUpstream) -> None:
    chunks = default_responses_stream()
    r = await gw.http().post(SESSION_PATH, json={"model": "m", "input": "hi", "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert r.content == b"".join(chunks)  # every event, `event:` lines included, byte for byte
    assert upstream.requests[0].json == {
        "model": "m",
        "input": "hi",
        "stream": True,
    }  # no usage request added

    [step] = await gw.steps("s1")
    assert (step.is_stream, step.status, step.finish_reason) == (True, "ok", "completed")
    assert step.response == response_object(DEFAULT_TEXT, model="m")  # response.completed.response
    assert (step.prompt_tokens, step.completion_tokens, step.total_tokens) == (5, 3, 8)
    assert step.meta_json == {"route": "m", "chunks": len(chunks)}
    assert step.ttft_ms is not None
    assert ROUTE_KEY not in gw.db_dump()


async def test_idle_stall_mid_stream_ends_with_a_responses_error_event(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(routes={"m": {"read_timeout_s": 0.3}})
    chunks = default_responses_stream()
    upstream.script(UP_PATH, [Reply.sse(chunks[:5] + chunks[5:], delay_s=[0, 0, 0, 0, 0, 2] + [0] * 6)])
    r = await gw.http().post(SESSION_PATH, json={"model": "m", "input": "hi", "stream": True})
    assert r.content.startswith(b"".join(chunks[:5]))
    name, err = events_of(r.content)[-1]
    assert (name, err["type"], err["code"], err["sequence_number"]) == (
        "error",
        "error",
        "upstream_timeout",
        5,
    )
    [step] = await gw.steps("s1")
    assert (step.status, step.meta_json["phase"]) == ("timeout", "idle")
    assert step.response["output"][0]["content"] == [
        {"type": "output_text", "text": "hello", "annotations": []}
    ]


async def test_stream_through_the_sdk_and_its_stream_helper(gw: Gateway, upstream: FakeUpstream) -> None:
    client = gw.client("s1")
    events = [e async for e in await client.responses.create(model="m", input="hi", stream=True)]
    assert [e.type for e in events] == [
        json.loads(c.split(b"data: ", 1)[1])["type"] for c in default_responses_stream()
    ]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == DEFAULT_TEXT
    assert events[-1].type == "response.completed" and events[-1].response.output_text == DEFAULT_TEXT

    async with client.responses.stream(model="m", input="hi") as stream:
        final = await stream.get_final_response()
    assert final.output_text == DEFAULT_TEXT and final.usage is not None and final.usage.total_tokens == 8
    assert [s.status for s in await gw.steps("s1")] == ["ok", "ok"]


async def test_arguments_only_in_done_and_output_from_completed(gw: Gateway, upstream: FakeUpstream) -> None:
    upstream.script(UP_PATH, [Reply.sse(RESPONSES_ARGS_ONLY_IN_DONE)])
    r = await gw.http().post(
        SESSION_PATH, json={"model": "m", "input": "weather?", "tools": [WEATHER_TOOL], "stream": True}
    )
    assert r.content == b"".join(RESPONSES_ARGS_ONLY_IN_DONE)  # `event:` lines forwarded unchanged
    assert [name for name, _ in events_of(r.content)] == [
        "response.created",
        "response.output_item.added",
        "response.function_call_arguments.done",
        "response.completed",
    ]
    [step] = await gw.steps("s1")
    assert (step.status, step.finish_reason) == ("ok", "completed")
    assert step.response == {
        "id": "r1",
        "status": "completed",
        "output": [
            {
                "type": "function_call",
                "id": "fc1",
                "call_id": "call_1",
                "name": "get_weather",
                "arguments": '{"city":"Paris"}',
            }
        ],
        "usage": {"input_tokens": 12, "output_tokens": 9, "total_tokens": 21},
    }
    assert (step.prompt_tokens, step.completion_tokens, step.total_tokens) == (12, 9, 21)
    assert step.meta_json == {"route": "m", "chunks": 4}


async def test_args_only_in_done_through_the_openai_sdk(gw: Gateway, upstream: FakeUpstream) -> None:
    upstream.script(UP_PATH, [Reply.sse(RESPONSES_ARGS_ONLY_IN_DONE)])
    client = gw.client("s1")
    stream = await client.responses.create(
        model="m",
        input="weather?",
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        stream=True,
    )
    events = [e async for e in stream]
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert [d.arguments for d in done] == ['{"city":"Paris"}']
    final = events[-1]
    assert final.type == "response.completed"
    [call] = final.response.output
    assert call.type == "function_call" and (call.name, call.arguments) == ("get_weather", '{"city":"Paris"}')


async def test_streamed_reasoning_text_and_argument_deltas(gw: Gateway, upstream: FakeUpstream) -> None:
    """Text, reasoning and a function call whose arguments arrive as deltas; the terminal
    response wins over the deltas for the record."""
    ids = {"output_index": 0, "item_id": "rs1"}
    completed = response_object(
        output=[
            {
                "type": "reasoning",
                "id": "rs1",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "think"}],
            },
            {
                "type": "message",
                "id": "m1",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "Let me check.", "annotations": []}],
            },
            {**CALL, "arguments": '{"city": "Paris"}'},
        ],
        usage={"input_tokens": 7, "output_tokens": 20, "total_tokens": 27},
    )
    events = [
        {"type": "response.created", "response": {**completed, "status": "in_progress", "output": []}},
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {"type": "reasoning", "id": "rs1", "summary": []},
        },
        {"type": "response.reasoning_text.delta", **ids, "content_index": 0, "delta": "thi"},
        {"type": "response.reasoning_text.delta", **ids, "content_index": 0, "delta": "nk"},
        {
            "type": "response.output_item.added",
            "output_index": 1,
            "item": {"type": "message", "id": "m1", "role": "assistant", "content": []},
        },
        {
            "type": "response.output_text.delta",
            "output_index": 1,
            "item_id": "m1",
            "content_index": 0,
            "delta": "Let me ",
        },
        {
            "type": "response.output_text.delta",
            "output_index": 1,
            "item_id": "m1",
            "content_index": 0,
            "delta": "check.",
        },
        {"type": "response.output_item.added", "output_index": 2, "item": {**CALL, "arguments": ""}},
        {
            "type": "response.function_call_arguments.delta",
            "output_index": 2,
            "item_id": "fc1",
            "delta": '{"city": ',
        },
        {
            "type": "response.function_call_arguments.delta",
            "output_index": 2,
            "item_id": "fc1",
            "delta": '"Paris"}',
        },
        {"type": "response.completed", "response": completed},
    ]
    chunks = [sse_event({**e, "sequence_number": n}) for n, e in enumerate(events)]
    upstream.script(UP_PATH, [Reply.sse(chunks)])
    client = gw.client("s1")
    got = [e async for e in await client.responses.create(model="m", input="hi", stream=True)]
    assert got[-1].type == "response.completed"
    [step] = await gw.steps("s1")
    assert step.response == completed
    assert (step.prompt_tokens, step.completion_tokens, step.total_tokens) == (7, 20, 27)

    from rollout.grading.trajectory import to_step

    view = to_step(step)
    assert (view.content, view.reasoning) == ("Let me check.", "think")
    assert view.tool_calls == [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
    ]


async def test_stream_without_completed_is_truncated(gw: Gateway, upstream: FakeUpstream) -> None:
    upstream.script(UP_PATH, [Reply.sse(RESPONSES_NO_COMPLETED)])
    r = await gw.http().post(SESSION_PATH, json={"model": "m", "input": "weather?", "stream": True})
    assert r.content.startswith(b"".join(RESPONSES_NO_COMPLETED))
    name, err = events_of(r.content)[-1]
    assert name == "error" and err["type"] == "error"
    assert err["code"] == "upstream_stream_truncated" and "response.completed" in err["message"]
    [step] = await gw.steps("s1")
    assert (step.status, step.is_truncated, step.finish_reason) == ("truncated", True, "in_progress")
    # no completed event: the output is rebuilt from the events (arguments from `.done`)
    assert step.response == {
        "id": "r1",
        "status": "in_progress",
        "output": [
            {
                "type": "function_call",
                "id": "fc1",
                "call_id": "call_1",
                "name": "get_weather",
                "arguments": '{"city":"Paris"}',
            }
        ],
    }
    assert (step.prompt_tokens, step.total_tokens) == (None, None)
    assert step.meta_json["error"]["code"] == "upstream_stream_truncated"

    upstream.script(UP_PATH, [Reply.sse(RESPONSES_NO_COMPLETED)])
    events = []
    async for e in await gw.client("s1").responses.create(model="m", input="x", stream=True):
        events.append(e)
    assert events[-1].type == "error" and events[-1].code == "upstream_stream_truncated"


@pytest.mark.parametrize("stream", [False, True])
async def test_html_502_is_a_recorded_upstream_error_and_a_502(
    start_gateway: StartGateway, upstream: FakeUpstream, stream: bool
) -> None:
    gw = await start_gateway(routes={"m": NO_RETRY})
    upstream.script(UP_PATH, [Reply.raw(HTML_502_PAGE, status=502, content_type="text/html")])
    with pytest.raises(openai.InternalServerError) as ei:
        await gw.client("s1").responses.create(model="m", input="hi", stream=stream)  # type: ignore[call-overload]
    assert ei.value.status_code == 502
    assert ei.value.response.content == HTML_502_PAGE
    [step] = await gw.steps("s1")
    assert (step.status, step.status_code, step.is_stream) == ("error", 502, stream)
    assert step.response == {"raw_body": HTML_502_PAGE.decode(), "content_type": "text/html"}
    assert "502 Bad Gateway" in step.meta_json["error"]
    assert (step.total_tokens, step.finish_reason) == (None, None)


@pytest.mark.parametrize("kind", ["error-event", "failed"])
async def test_error_inside_a_200_stream_is_an_error_step(
    gw: Gateway, upstream: FakeUpstream, kind: str
) -> None:
    created = sse_event(
        {
            "type": "response.created",
            "sequence_number": 0,
            "response": {"id": "r1", "status": "in_progress", "output": []},
        }
    )
    if kind == "error-event":
        last = sse_event(
            {
                "type": "error",
                "sequence_number": 1,
                "code": "context_length_exceeded",
                "message": "too long",
                "param": None,
            }
        )
    else:
        last = sse_event(
            {
                "type": "response.failed",
                "sequence_number": 1,
                "response": {
                    "id": "r1",
                    "status": "failed",
                    "output": [],
                    "error": {"code": "server_error", "message": "too long"},
                },
            }
        )
    upstream.script(UP_PATH, [Reply.sse([created, last])])
    r = await gw.http().post(SESSION_PATH, json={"model": "m", "input": "hi", "stream": True})
    assert r.content == created + last  # relayed as sent, no gateway event added
    [step] = await gw.steps("s1")
    assert step.status == "error" and step.meta_json["error"]["message"] == "too long"


async def test_strict_mode_commits_the_step_before_response_completed(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    lock = gw.hold_write_lock()
    stream = StreamReader(gw.http(), SESSION_PATH, {"model": "m", "input": "hi", "stream": True})
    try:
        got = await stream.until(b"response.output_item.done")
        await stream.assert_nothing_more()  # response.completed must wait for the commit
        assert b"response.completed" not in got
        lock.rollback()
        rest = await stream.rest()
        assert rest == default_responses_stream()[-1]
        assert len(gw.sql("SELECT * FROM session_steps")) == 1
    finally:
        lock.close()
        await stream.aclose()


# ------------------------------------------------------------------------------ budget
async def test_synthetic_stop_at_max_steps_non_stream(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(max_steps=1)
    client = gw.client("s1")
    await client.responses.create(model="m", input="hi")
    raw = await client.responses.with_raw_response.create(model="m", input="hi")
    assert raw.http_response.status_code == 200 and raw.headers["x-gateway-stop-reason"] == "max_steps"
    stop = raw.parse()
    assert (stop.object, stop.status, stop.model, stop.output, stop.output_text) == (
        "response",
        "completed",
        "m",
        [],
        "",
    )
    assert stop.usage is not None and (
        stop.usage.input_tokens,
        stop.usage.output_tokens,
        stop.usage.total_tokens,
    ) == (0, 0, 0)
    Response.model_validate(raw.http_response.json())  # a valid response object, strictly
    assert len(upstream.requests) == 1
    assert [s.endpoint for s in await gw.steps("s1")] == ["responses"]


async def test_synthetic_stop_at_max_steps_streamed(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(max_steps=0)
    r = await gw.http().post(SESSION_PATH, json={"model": "m", "input": "hi", "stream": True})
    assert r.status_code == 200 and r.headers["x-gateway-stop-reason"] == "max_steps"
    events = events_of(r.content)
    assert [(name, ev["type"], ev["sequence_number"]) for name, ev in events] == [
        ("response.created", "response.created", 0),
        ("response.in_progress", "response.in_progress", 1),
        ("response.completed", "response.completed", 2),
    ]
    final = Response.model_validate(events[-1][1]["response"])
    assert (final.status, final.output, final.usage and final.usage.total_tokens) == ("completed", [], 0)

    client = gw.client("s1")
    got = [e async for e in await client.responses.create(model="m", input="hi", stream=True)]
    assert [e.type for e in got] == ["response.created", "response.in_progress", "response.completed"]
    async with client.responses.stream(model="m", input="hi") as stream:
        assert (await stream.get_final_response()).output_text == ""
    assert upstream.requests == [] and await gw.steps("s1") == []
    assert await gw.metric("gateway_synthetic_stops_total") == 3


# ------------------------------------------------------------------------------ errors, routes
async def test_unknown_route_and_malformed_bodies_in_openai_shape(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(routes=anthropic_routes(upstream))
    with pytest.raises(openai.NotFoundError) as ei:
        await gw.client("s1").responses.create(model="nope", input="hi")
    assert ei.value.response.json()["error"]["code"] == "model_not_found"
    for body, param in [
        (b"{not json", None),
        (b'{"input": "hi"}', "model"),
        (b'{"model": "m", "input": 5}', "input"),
        (b'{"model": "m", "input": "x", "stream": "yes"}', "stream"),
        (b'{"model": "m", "input": "x", "max_output_tokens": 0}', "max_output_tokens"),
        (b'{"model": "a", "input": "x"}', "model"),
    ]:
        for path in (SESSION_PATH, UP_PATH):
            r = await gw.http().post(path, content=body, headers={"content-type": "application/json"})
            assert r.status_code == 400, (body, r.text)
            err = r.json()["error"]
            assert (err["type"], err["param"]) == ("invalid_request_error", param), body
    r = await gw.http().post(SESSION_PATH, json={"model": "a", "input": "x"})
    assert r.json()["error"]["code"] == "route_api_mismatch"  # an anthropic route serves no Responses call
    assert upstream.requests == [] and await gw.steps("s1") == []


async def test_passthrough_is_forwarded_but_not_recorded(gw: Gateway, upstream: FakeUpstream) -> None:
    out = await gw.client().responses.create(model="m", input="hi")
    assert out.output_text == DEFAULT_TEXT
    stream = await gw.client().responses.create(model="m", input="hi", stream=True)
    assert [e.type async for e in stream][-1] == "response.completed"
    assert [rq.path for rq in upstream.requests] == [UP_PATH, UP_PATH]
    assert "x-session-id" not in upstream.requests[0].headers
    assert gw.sql("SELECT * FROM session_steps") == []
    assert await gw.metric("gateway_requests_total", endpoint="responses", route="m", status="200") == 2


async def test_route_without_streaming_gets_a_synthesized_stream(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(routes={"m": {"supports_stream": False}})
    answer = response_object(
        output=[
            {
                "type": "message",
                "id": "m1",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "hi there", "annotations": []}],
            },
            CALL,
        ]
    )
    upstream.script(UP_PATH, [Reply.json(answer)])
    client = gw.client("s1")
    async with client.responses.stream(model="m", input="hi") as stream:
        final = await stream.get_final_response()
    assert final.output_text == "hi there" and final.output[1].type == "function_call"
    assert "stream" not in upstream.requests[0].json
    [step] = await gw.steps("s1")
    assert step.response == answer and step.meta_json == {"route": "m", "stream_synthesized": True}


def _with_logprobs(chunks: list[bytes]) -> tuple[list[bytes], list[dict[str, Any]]]:
    """The default stream with ``logprobs`` on each text delta (what ``include:
    ["message.output_text.logprobs"]`` adds) and on the completed response's text part."""
    out, logprobs = [], []
    for c in chunks:
        name, ev = events_of(c)[0]
        if ev["type"] == "response.output_text.delta":
            lp = [
                {
                    "token": ev["delta"],
                    "logprob": -0.25,
                    "bytes": list(ev["delta"].encode()),
                    "top_logprobs": [{"token": ev["delta"], "logprob": -0.25, "bytes": []}],
                }
            ]
            ev = {**ev, "logprobs": lp}
            logprobs += lp
        elif ev["type"] in ("response.output_item.done", "response.completed"):
            item = ev["item"] if ev["type"] == "response.output_item.done" else ev["response"]["output"][0]
            item["content"] = [{**item["content"][0], "logprobs": list(logprobs)}]
        out.append(f"event: {name}\ndata: {json.dumps(ev)}\n\n".encode())
    return out, logprobs


async def test_stream_logprobs_are_recorded_and_request_fields_pass_through(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    chunks, logprobs = _with_logprobs(default_responses_stream())
    # the second stream ends before output_item.done and completed: its output comes from the deltas
    upstream.script(UP_PATH, [Reply.sse(chunks), Reply.sse(chunks[:-2])])
    body = {
        "model": "m",
        "input": "hi",
        "stream": True,
        "include": ["message.output_text.logprobs"],
        "top_logprobs": 1,
        "vendor_extra": {"return_token_ids": True},
    }
    for _ in range(2):
        r = await gw.http().post(SESSION_PATH, json=body)
        assert r.status_code == 200
    assert [req.json for req in upstream.requests] == [body, body]  # forwarded untouched
    done, cut = await gw.steps("s1")
    assert done.status == "ok"
    assert done.response["output"][0]["content"][0]["logprobs"] == logprobs  # from response.completed
    assert cut.status == "truncated"
    part = cut.response["output"][0]["content"][0]
    assert (part["text"], part["logprobs"]) == (DEFAULT_TEXT, logprobs)  # accumulated from the deltas
