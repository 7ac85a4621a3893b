"""Gateway contract for streamed answers: the upstream stream quirks of
:mod:`tests.faults` (exact upstream byte lists), relayed to the real openai SDK and to
raw httpx, and the step recorded from them; strict telemetry ordering."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import openai
import pytest

from tests.fake_upstream import DEFAULT_USAGE, DONE, FakeUpstream, Reply, chat_chunk, usage_chunk
from tests.faults import (
    COMMENTS_AND_KEEPALIVES,
    EMPTY_CHOICES_CHUNKS,
    ERROR_IN_200_STREAM,
    PARALLEL_TOOL_CALLS,
    PARALLEL_TOOL_CALLS_NO_INDEX,
    REASONING_VARIANTS,
    SPLIT_EVENTS_AND_CRLF,
)
from tests.gateway.conftest import (
    MESSAGES,
    NO_RETRY,
    Gateway,
    StartGateway,
    StreamReader,
    sse_json,
    sse_payloads,
)

UP_PATH = "/v1/chat/completions"
SESSION_PATH = "/v1/sessions/s1/chat/completions"

PARALLEL_CALLS = [
    {
        "id": "call_a",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    },
    {"id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": '{"tz": "UTC"}'}},
]


async def raw_post(gw: Gateway, body: dict[str, Any], path: str = SESSION_PATH) -> httpx.Response:
    """POST with raw httpx and read the whole answer (the exact bytes the client got)."""
    return await gw.http().post(path, json=body)


def stream_body(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": MESSAGES, "stream": True, **extra}


# ------------------------------------------------------- empty choices, usage-only chunks
@pytest.mark.parametrize("client_opts", [None, {"include_usage": False}])
async def test_usage_only_chunk_hidden_from_a_client_that_did_not_ask(
    gw: Gateway, upstream: FakeUpstream, client_opts: dict[str, Any] | None
) -> None:
    upstream.script(UP_PATH, [Reply.sse(EMPTY_CHOICES_CHUNKS)])
    extra = {} if client_opts is None else {"stream_options": client_opts}
    r = await raw_post(gw, stream_body(**extra))
    assert r.status_code == 200
    # the gateway asked upstream for usage on its own ...
    assert upstream.requests[0].json["stream_options"] == {**(client_opts or {}), "include_usage": True}
    # ... so the usage-only chunk is stripped, every other chunk (Azure's empty first one too) relayed
    f1 = EMPTY_CHOICES_CHUNKS
    assert r.content == f1[0] + f1[1] + f1[2] + f1[4]
    [step] = await gw.steps("s1")
    assert step.status == "ok" and step.finish_reason == "stop"
    assert step.response["choices"][0]["message"] == {"role": "assistant", "content": "Hi"}
    assert (step.prompt_tokens, step.completion_tokens, step.total_tokens) == (10, 1, 11)
    assert step.response["prompt_filter_results"] == [{"prompt_index": 0}]
    assert step.meta_json["usage_requested_by_gateway"] is True


async def test_client_that_asked_for_usage_gets_every_chunk(gw: Gateway, upstream: FakeUpstream) -> None:
    upstream.script(UP_PATH, [Reply.sse(EMPTY_CHOICES_CHUNKS)])
    r = await raw_post(gw, stream_body(stream_options={"include_usage": True}))
    assert r.content == b"".join(EMPTY_CHOICES_CHUNKS)
    [step] = await gw.steps("s1")
    assert (step.prompt_tokens, step.completion_tokens, step.total_tokens) == (10, 1, 11)
    assert "usage_requested_by_gateway" not in step.meta_json


async def test_usage_only_chunk_through_the_openai_sdk(gw: Gateway, upstream: FakeUpstream) -> None:
    upstream.script(UP_PATH, [Reply.sse(EMPTY_CHOICES_CHUNKS), Reply.sse(EMPTY_CHOICES_CHUNKS)])
    client = gw.client("s1")
    chunks = [
        c async for c in await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    ]  # type: ignore[arg-type]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hi"
    assert [c.usage for c in chunks] == [None, None, None]
    chunks = [
        c
        async for c in await client.chat.completions.create(
            model="m", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
    ]  # type: ignore[arg-type]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 11
    assert [s.total_tokens for s in await gw.steps("s1")] == [11, 11]


# ------------------------------------------------ SSE comments, keep-alives, data-less blocks
async def test_comments_and_dataless_blocks_are_neither_parsed_nor_relayed(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    upstream.script(
        UP_PATH,
        [
            Reply.sse(COMMENTS_AND_KEEPALIVES, delay_s=[0, 0, 0.2, 0, 0, 0, 0]),
            Reply.sse(COMMENTS_AND_KEEPALIVES),
        ],
    )
    stream = await gw.client("s1").chat.completions.create(model="m", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
    assert "".join([c.choices[0].delta.content or "" async for c in stream if c.choices]) == "AB"
    r = await raw_post(gw, stream_body())
    assert r.content == COMMENTS_AND_KEEPALIVES[1] + COMMENTS_AND_KEEPALIVES[5] + COMMENTS_AND_KEEPALIVES[6]
    steps = await gw.steps("s1")
    assert [(s.status, s.response["choices"][0]["message"]["content"]) for s in steps] == [("ok", "AB")] * 2
    assert [s.finish_reason for s in steps] == ["stop", "stop"]
    assert [s.prompt_tokens for s in steps] == [None, None]  # this upstream sends no usage: unknown, not 0


# ---------------------------------------------- events split across reads, CRLF, multi-line
async def test_events_split_across_reads_crlf_and_multiline_data(gw: Gateway, upstream: FakeUpstream) -> None:
    upstream.script(UP_PATH, [Reply.sse(SPLIT_EVENTS_AND_CRLF), Reply.sse(SPLIT_EVENTS_AND_CRLF)])
    stream = await gw.client("s1").chat.completions.create(model="m", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
    assert "".join([c.choices[0].delta.content or "" async for c in stream if c.choices]) == "hello world"
    r = await raw_post(gw, stream_body())
    payloads = sse_payloads(r.content)
    assert len(payloads) == 3 and payloads[-1] == "[DONE]"
    assert [json.loads(p)["choices"][0]["delta"]["content"] for p in payloads[:2]] == ["hello", " world"]
    for step in await gw.steps("s1"):
        assert (step.status, step.finish_reason) == ("ok", "stop")
        assert step.response["choices"][0]["message"]["content"] == "hello world"


async def test_multibyte_utf8_cut_between_writes(gw: Gateway, upstream: FakeUpstream) -> None:
    event = chat_chunk("café ☕ 😀", role="assistant", finish_reason="stop")
    cut = event.index("é".encode()) + 1
    cut2 = event.index("😀".encode()) + 2
    upstream.script(UP_PATH, [Reply.sse([event[:cut], event[cut:cut2], event[cut2:], DONE])])
    stream = await gw.client("s1").chat.completions.create(model="m", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
    assert "".join([c.choices[0].delta.content or "" async for c in stream if c.choices]) == "café ☕ 😀"
    [step] = await gw.steps("s1")
    assert step.response["choices"][0]["message"]["content"] == "café ☕ 😀"


# ------------------------------------------------------------------------- very long lines
async def test_one_700kb_line_is_forwarded_whole_and_recorded(gw: Gateway, upstream: FakeUpstream) -> None:
    args = '{"path":"a.txt","content":"' + "x" * 700_000 + '"}'
    big = chat_chunk(
        role="assistant",
        tool_calls=[
            {
                "index": 0,
                "id": "call_w",
                "type": "function",
                "function": {"name": "write_file", "arguments": args},
            }
        ],
    )
    chunks = [big, chat_chunk(finish_reason="tool_calls"), DONE]
    upstream.script(UP_PATH, [Reply.sse(chunks), Reply.sse(chunks)])
    r = await raw_post(gw, stream_body())
    assert r.content == b"".join(chunks)  # the huge event arrives whole and unchanged
    stream = await gw.client("s1").chat.completions.create(model="m", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
    got = [
        tc.function.arguments
        async for c in stream
        if c.choices
        for tc in c.choices[0].delta.tool_calls or []
        if tc.function
    ]
    assert "".join(a or "" for a in got) == args
    for step in await gw.steps("s1"):
        assert (step.status, step.finish_reason) == ("ok", "tool_calls")
        [call] = step.response["choices"][0]["message"]["tool_calls"]
        assert call["id"] == "call_w" and call["function"]["name"] == "write_file"
        assert len(call["function"]["arguments"]) == len(args) == 700_029
        assert call["function"]["arguments"] == args


# ------------------------------------------------------------------------ parallel tool calls
@pytest.mark.parametrize(
    "chunks", [PARALLEL_TOOL_CALLS, PARALLEL_TOOL_CALLS_NO_INDEX], ids=["indexed", "no-index"]
)
async def test_parallel_tool_calls_assembled_and_bytes_unchanged(
    gw: Gateway, upstream: FakeUpstream, chunks: list[bytes]
) -> None:
    upstream.script(UP_PATH, [Reply.sse(chunks)])
    r = await raw_post(gw, stream_body())
    assert r.content == b"".join(chunks)
    [step] = await gw.steps("s1")
    message = step.response["choices"][0]["message"]
    assert message["tool_calls"] == PARALLEL_CALLS
    assert message["content"] is None
    assert step.finish_reason == "tool_calls"


async def test_tool_calls_reach_the_sdk_and_tool_messages_go_back_untouched(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    upstream.script(UP_PATH, [Reply.sse(PARALLEL_TOOL_CALLS)])
    client = gw.client("s1")
    calls: dict[int, dict[str, str]] = {}
    async for c in await client.chat.completions.create(model="m", messages=MESSAGES, stream=True):  # type: ignore[arg-type]
        for tc in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            entry = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
            entry["id"] += tc.id or ""
            entry["name"] += (tc.function.name or "") if tc.function else ""
            entry["arguments"] += (tc.function.arguments or "") if tc.function else ""
    assert [(v["id"], v["name"], v["arguments"]) for _, v in sorted(calls.items())] == [
        (c["id"], c["function"]["name"], c["function"]["arguments"]) for c in PARALLEL_CALLS
    ]
    followup = [
        *MESSAGES,
        {"role": "assistant", "content": None, "tool_calls": PARALLEL_CALLS},
        {"role": "tool", "tool_call_id": "call_a", "content": "18C"},
        {"role": "tool", "tool_call_id": "call_b", "content": "12:00"},
    ]
    async for _ in await client.chat.completions.create(model="m", messages=followup, stream=True):  # type: ignore[arg-type]
        pass
    assert upstream.requests[1].json["messages"] == followup
    steps = await gw.steps("s1")
    assert [s.step_id for s in steps] == [1, 2]
    assert steps[1].messages == followup and steps[1].request["messages"] == followup


# ----------------------------------------------------------- reasoning fields, vendor token ids
async def test_reasoning_fields_relayed_verbatim_and_recorded(gw: Gateway, upstream: FakeUpstream) -> None:
    upstream.script(UP_PATH, [Reply.sse(REASONING_VARIANTS)])
    r = await raw_post(gw, stream_body())
    assert r.content == b"".join(REASONING_VARIANTS)  # no chunk filtered as "empty", unknown fields kept
    [step] = await gw.steps("s1")
    assert step.status == "ok" and step.finish_reason == "stop"
    choice = step.response["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "4", "reasoning_content": "2+2 is four."}
    assert choice["token_ids"] == [17]


async def test_non_stream_reasoning_recorded_as_received(gw: Gateway, upstream: FakeUpstream) -> None:
    answer = {
        "id": "c1",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "logprobs": None,
                "message": {
                    "role": "assistant",
                    "content": "4",
                    "reasoning": "2+2 is four.",
                    "reasoning_content": "2+2 is four.",
                },
                "token_ids": [17, 18],
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
        "prompt_token_ids": [1],
    }
    upstream.script(UP_PATH, [Reply.json(answer)])
    r = await raw_post(gw, {"model": "m", "messages": MESSAGES})
    assert r.json() == answer
    [step] = await gw.steps("s1")
    assert step.response == answer
    assert (step.prompt_tokens, step.completion_tokens, step.total_tokens) == (3, 2, 5)


# --------------------------------------------------------------------------------- usage
async def test_gateway_asks_for_usage_and_records_it(gw: Gateway, upstream: FakeUpstream) -> None:
    # the default fake upstream sends usage only when include_usage was requested
    r = await raw_post(gw, stream_body())
    assert b'"choices":[]' not in r.content and b'"total_tokens"' not in r.content
    [step] = await gw.steps("s1")
    assert step.response["usage"] == DEFAULT_USAGE
    assert (step.prompt_tokens, step.completion_tokens, step.total_tokens) == (5, 3, 8)


async def test_no_usage_is_recorded_as_null_not_zero(gw: Gateway, upstream: FakeUpstream) -> None:
    upstream.script(
        UP_PATH, [Reply.sse([chat_chunk("ok", role="assistant"), chat_chunk(finish_reason="stop"), DONE])]
    )
    await raw_post(gw, stream_body())
    [step] = await gw.steps("s1")
    assert step.status == "ok"
    assert step.response["usage"] is None
    assert (step.prompt_tokens, step.completion_tokens, step.total_tokens) == (None, None, None)
    [row] = gw.sql("SELECT prompt_tokens, completion_tokens, total_tokens FROM session_steps")
    assert tuple(row) == (None, None, None)


async def test_zero_usage_on_a_content_chunk_then_the_last_non_null_wins(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    zero = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    real = {"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14}
    upstream.script(
        UP_PATH,
        [
            Reply.sse(
                [
                    chat_chunk("a", role="assistant", usage=zero),
                    chat_chunk("b", usage=zero),
                    chat_chunk(finish_reason="stop"),
                    usage_chunk(real),
                    DONE,
                ]
            ),
            Reply.sse(
                [
                    chat_chunk("a", role="assistant", usage=zero),
                    chat_chunk(finish_reason="stop", usage=zero),
                    DONE,
                ]
            ),
        ],
    )
    await raw_post(gw, stream_body(stream_options={"include_usage": True}))
    await raw_post(gw, stream_body(stream_options={"include_usage": True}))
    s1, s2 = await gw.steps("s1")
    assert (s1.prompt_tokens, s1.completion_tokens, s1.total_tokens) == (12, 2, 14)  # never summed
    assert (s2.prompt_tokens, s2.completion_tokens, s2.total_tokens) == (0, 0, 0)


# -------------------------------------- an error in a 200 stream, EOF without [DONE], only [DONE]
async def test_error_event_inside_a_200_stream_is_an_error_step(gw: Gateway, upstream: FakeUpstream) -> None:
    upstream.script(UP_PATH, [Reply.sse(ERROR_IN_200_STREAM), Reply.sse(ERROR_IN_200_STREAM)])
    r = await raw_post(gw, stream_body())
    assert r.status_code == 200
    assert r.content.startswith(ERROR_IN_200_STREAM[0])  # the error event is forwarded as is
    with pytest.raises(openai.APIError, match="maximum context length exceeded"):
        async for _ in await gw.client("s1").chat.completions.create(
            model="m", messages=MESSAGES, stream=True
        ):  # type: ignore[arg-type]
            pass
    for step in await gw.steps("s1"):
        assert (step.status, step.status_code, step.finish_reason) == ("error", 200, None)
        assert step.meta_json["error"] == {
            "message": "maximum context length exceeded",
            "type": "BadRequestError",
            "code": 400,
        }
        assert step.response["choices"] == []


async def test_upstream_closes_mid_stream(gw: Gateway, upstream: FakeUpstream) -> None:
    partial = [chat_chunk("Hel", role="assistant"), chat_chunk("lo")]
    upstream.script(
        UP_PATH, [Reply.sse(partial, close_abruptly=True), Reply.sse(partial, close_abruptly=True)]
    )
    r = await raw_post(gw, stream_body())
    assert r.status_code == 200
    assert r.content.startswith(partial[0] + partial[1])
    payloads = sse_payloads(r.content)
    assert "[DONE]" not in payloads  # no fake [DONE] ...
    last = json.loads(payloads[-1])  # ... but a terminal error event
    assert last["error"]["code"] in ("upstream_stream_broken", "upstream_stream_truncated")
    with pytest.raises(openai.APIError):
        async for _ in await gw.client("s1").chat.completions.create(
            model="m", messages=MESSAGES, stream=True
        ):  # type: ignore[arg-type]
            pass
    for step in await gw.steps("s1"):
        assert (step.status, step.is_truncated, step.finish_reason) == ("truncated", True, None)
        assert step.response["choices"][0]["message"]["content"] == "Hello"
        assert step.meta_json["error"]["code"] == last["error"]["code"]


async def test_eof_without_done_with_clean_chunked_end(gw: Gateway, upstream: FakeUpstream) -> None:
    upstream.script(UP_PATH, [Reply.sse([chat_chunk("Hel", role="assistant"), chat_chunk("lo")])])
    r = await raw_post(gw, stream_body())
    payloads = sse_payloads(r.content)
    assert "[DONE]" not in payloads
    assert json.loads(payloads[-1])["error"]["code"] == "upstream_stream_truncated"
    [step] = await gw.steps("s1")
    assert (step.status, step.is_truncated) == ("truncated", True)
    assert step.response["choices"][0]["message"]["content"] == "Hello"


async def test_only_done_is_recorded_and_nothing_hangs(gw: Gateway, upstream: FakeUpstream) -> None:
    upstream.script(UP_PATH, [Reply.sse([DONE]), Reply.sse([DONE])])
    async with asyncio.timeout(5):
        r = await raw_post(gw, stream_body())
        chunks = [
            c
            async for c in await gw.client("s1").chat.completions.create(
                model="m", messages=MESSAGES, stream=True
            )
        ]  # type: ignore[arg-type]
    assert r.content == DONE and chunks == []
    for step in await gw.steps("s1"):
        assert step.status == "empty"
        assert step.response["choices"] == [] and step.finish_reason is None
        assert step.prompt_tokens is None
        assert step.meta_json["chunks"] == 0


async def test_error_status_with_sse_content_type_is_not_a_stream(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(routes={"m": NO_RETRY})
    body = b'data: {"error":{"message":"overloaded","code":503}}\n\n'
    upstream.script(UP_PATH, [Reply.raw(body, status=503, content_type="text/event-stream")])
    r = await raw_post(gw, stream_body())
    assert (r.status_code, r.content) == (503, body)
    [step] = await gw.steps("s1")
    assert (step.status, step.status_code) == ("error", 503)


# ------------------------------------------------------------------------------ strict telemetry
async def test_strict_mode_commits_the_step_before_done(gw: Gateway, upstream: FakeUpstream) -> None:
    lock = gw.hold_write_lock()  # the gateway's commit must wait for this lock
    stream = StreamReader(gw.http(), SESSION_PATH, stream_body())

    def committed_by_done(rest: bytes) -> None:
        if rest.endswith(b"data: [DONE]\n\n"):  # at the moment the client has [DONE], the row is committed
            assert len(gw.sql("SELECT 1 FROM session_steps WHERE session_id='s1'")) == 1

    try:
        await stream.until(b'"finish_reason":"stop"')
        await stream.assert_nothing_more()  # the last content arrived; [DONE] must wait for the commit
        lock.rollback()
        assert (await stream.rest(committed_by_done)).endswith(b"data: [DONE]\n\n")
    finally:
        lock.close()
        await stream.aclose()


async def test_strict_mode_commits_before_a_non_stream_response(gw: Gateway, upstream: FakeUpstream) -> None:
    lock = gw.hold_write_lock()
    try:
        task = asyncio.ensure_future(raw_post(gw, {"model": "m", "messages": MESSAGES}))
        await upstream.wait_for_requests(1)
        done, _ = await asyncio.wait({task}, timeout=0.4)
        assert not done
        lock.rollback()
        r = await task
        assert r.status_code == 200
        assert len(gw.sql("SELECT 1 FROM session_steps")) == 1
    finally:
        lock.close()


async def test_best_effort_mode_does_not_wait_for_the_db(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(telemetry={"mode": "best_effort"})
    lock = gw.hold_write_lock()
    try:
        async with asyncio.timeout(3):
            r = await raw_post(gw, stream_body())
        assert r.content.endswith(b"data: [DONE]\n\n")
        assert gw.sql("SELECT count(*) AS n FROM session_steps")[0]["n"] == 0
    finally:
        lock.rollback()
        lock.close()
    [step] = await gw.wait_steps("s1", 1)
    assert step.status == "ok"


async def test_synthesized_error_events_are_valid_sse_json(gw: Gateway, upstream: FakeUpstream) -> None:
    upstream.script(UP_PATH, [Reply.sse([chat_chunk("x", role="assistant")], close_abruptly=True)])
    r = await raw_post(gw, stream_body())
    objs = sse_json(r.content)
    assert set(objs[-1]["error"]) == {"message", "type", "param", "code"}
