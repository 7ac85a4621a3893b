"""The scripted fake upstream, exercised with the real openai SDK, aiohttp and a raw socket."""

from __future__ import annotations

import asyncio
import io
import json
import time
from pathlib import Path

import aiohttp
import openai
import pytest
from anthropic import AsyncAnthropic
from openai import AsyncOpenAI

from tests.fake_upstream import (
    DEFAULT_TEXT,
    DEFAULT_USAGE,
    DONE,
    SUBMIT_COMMAND,
    FakeRequest,
    FakeUpstream,
    Plan,
    Reply,
    ScriptedPolicy,
    ShellTool,
    chat_chunk,
    chat_completion,
    default_responses_stream,
    find_shell_tool,
    usage_chunk,
)
from tests.faults import RESPONSES_ARGS_ONLY_IN_DONE, SPLIT_EVENTS_AND_CRLF

MESSAGES = [{"role": "user", "content": "hi"}]


def client(up: FakeUpstream, **kw: object) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=up.base_url, api_key="x", max_retries=0, **kw)  # type: ignore[arg-type]


async def raw_exchange(up: FakeUpstream, request: bytes) -> tuple[bytes, list[bytes], bool]:
    """Send one raw HTTP/1.1 request; return (head, list of chunked-body chunks, terminated)."""
    reader, writer = await asyncio.open_connection(up.host, up.port)
    writer.write(request)
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    chunks: list[bytes] = []
    terminated = False
    try:
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            if size == 0:
                await reader.readexactly(2)
                terminated = True
                break
            chunks.append(await reader.readexactly(size))
            assert await reader.readexactly(2) == b"\r\n"
    except asyncio.IncompleteReadError:
        pass
    writer.close()
    await writer.wait_closed()
    return head, chunks, terminated


def post(path: str, body: bytes) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body


async def test_default_non_stream_with_openai_sdk() -> None:
    async with FakeUpstream() as up:
        c = client(up)
        r = await c.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        await c.close()
        assert r.choices[0].message.content == DEFAULT_TEXT == "hello from fake"
        assert r.choices[0].message.role == "assistant"
        assert r.choices[0].finish_reason == "stop"
        assert r.usage is not None
        assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (5, 3, 8)
        assert r.model == "m"
        req = up.requests[0]
        assert (req.method, req.path) == ("POST", "/v1/chat/completions")
        assert req.headers["authorization"] == "Bearer x"
        assert req.headers["content-type"] == "application/json"
        assert req.json == {"model": "m", "messages": MESSAGES}


async def test_default_stream_without_include_usage_has_no_usage_chunk() -> None:
    async with FakeUpstream() as up:
        c = client(up)
        stream = await c.chat.completions.create(model="m", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
        chunks = [ch async for ch in stream]
        await c.close()
        assert [ch.choices[0].delta.content for ch in chunks] == ["hello", " from", " fake", None]
        assert [ch.choices[0].finish_reason for ch in chunks] == [None, None, None, "stop"]
        assert chunks[0].choices[0].delta.role == "assistant"
        assert all(ch.usage is None for ch in chunks)
        assert up.requests[0].json["stream"] is True


async def test_default_stream_with_include_usage_ends_with_usage_only_chunk() -> None:
    async with FakeUpstream() as up:
        c = client(up)
        stream = await c.chat.completions.create(
            model="m",
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": True},  # type: ignore[arg-type]
        )
        chunks = [ch async for ch in stream]
        await c.close()
        assert len(chunks) == 5
        assert chunks[-1].choices == []
        assert chunks[-1].usage is not None
        assert chunks[-1].usage.model_dump(exclude_none=True) == DEFAULT_USAGE
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks[:-1]) == DEFAULT_TEXT
        assert all(ch.usage is None for ch in chunks[:-1])


async def test_default_stream_exact_bytes_and_chunk_boundaries() -> None:
    async with FakeUpstream() as up:
        body = json.dumps(
            {"model": "m", "messages": MESSAGES, "stream": True, "stream_options": {"include_usage": True}}
        ).encode()
        head, chunks, terminated = await raw_exchange(up, post("/v1/chat/completions", body))
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"content-type: text/event-stream\r\n" in head
        assert b"transfer-encoding: chunked\r\n" in head
        assert terminated
        assert chunks == [
            b'data: {"id":"c1","object":"chat.completion.chunk","created":0,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"hello"},"finish_reason":null}],"usage":null}\n\n',
            b'data: {"id":"c1","object":"chat.completion.chunk","created":0,"model":"m","choices":[{"index":0,"delta":{"content":" from"},"finish_reason":null}],"usage":null}\n\n',
            b'data: {"id":"c1","object":"chat.completion.chunk","created":0,"model":"m","choices":[{"index":0,"delta":{"content":" fake"},"finish_reason":null}],"usage":null}\n\n',
            b'data: {"id":"c1","object":"chat.completion.chunk","created":0,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":null}\n\n',
            b'data: {"id":"c1","object":"chat.completion.chunk","created":0,"model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}\n\n',
            DONE,
        ]


async def test_scripted_sse_is_one_http_chunk_per_element() -> None:
    async with FakeUpstream() as up:
        up.script("/v1/chat/completions", [Reply.sse(SPLIT_EVENTS_AND_CRLF)])
        head, chunks, terminated = await raw_exchange(up, post("/v1/chat/completions", b"{}"))
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        assert chunks == SPLIT_EVENTS_AND_CRLF
        assert terminated
        assert up.pending("/v1/chat/completions") == 0


async def test_scripted_split_events_stream_through_openai_sdk() -> None:
    async with FakeUpstream() as up:
        up.script(None, [Reply.sse(SPLIT_EVENTS_AND_CRLF, delay_s=0.01)])
        c = client(up)
        stream = await c.chat.completions.create(model="m", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
        chunks = [ch async for ch in stream]
        await c.close()
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == "hello world"
        assert chunks[-1].choices[0].finish_reason == "stop"


async def test_chunk_builders() -> None:
    assert chat_chunk("Hi", role="assistant") == (
        b'data: {"id":"c1","object":"chat.completion.chunk","created":0,"model":"m",'
        b'"choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"},"finish_reason":null}]}\n\n'
    )
    assert chat_chunk(finish_reason="stop", usage={"total_tokens": 1}) == (
        b'data: {"id":"c1","object":"chat.completion.chunk","created":0,"model":"m",'
        b'"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"total_tokens":1}}\n\n'
    )
    tc = [{"index": 0, "id": "call_a", "type": "function", "function": {"name": "f", "arguments": ""}}]
    assert json.loads(chat_chunk(reasoning="r", tool_calls=tc)[6:])["choices"][0]["delta"] == {
        "reasoning": "r",
        "tool_calls": tc,
    }
    assert json.loads(usage_chunk(DEFAULT_USAGE)[6:])["choices"] == []
    assert DONE == b"data: [DONE]\n\n"


async def test_scripted_chunk_builders_through_openai_sdk_tool_calls() -> None:
    tc0 = [
        {"index": 0, "id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
    ]
    tc1 = [{"index": 0, "function": {"arguments": '{"city": "Paris"}'}}]
    async with FakeUpstream() as up:
        up.script(
            None,
            [
                Reply.sse(
                    [
                        chat_chunk(role="assistant", tool_calls=tc0),
                        chat_chunk(tool_calls=tc1),
                        chat_chunk(finish_reason="tool_calls"),
                        DONE,
                    ]
                )
            ],
        )
        c = client(up)
        stream = await c.chat.completions.create(model="m", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
        chunks = [ch async for ch in stream]
        await c.close()
        deltas = [ch.choices[0].delta.tool_calls for ch in chunks if ch.choices[0].delta.tool_calls]
        assert deltas[0][0].id == "call_a"
        assert "".join(d[0].function.arguments or "" for d in deltas) == '{"city": "Paris"}'
        assert chunks[-1].choices[0].finish_reason == "tool_calls"


async def test_scripted_json_error_status_and_headers() -> None:
    err = {"error": {"message": "slow down", "type": "rate_limit_error", "param": None, "code": "429"}}
    async with FakeUpstream() as up:
        up.script(None, [Reply.json(err, status=429, headers={"Retry-After": "7"})])
        c = client(up)
        with pytest.raises(openai.RateLimitError) as info:
            await c.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        await c.close()
        assert info.value.status_code == 429
        assert info.value.response.headers["retry-after"] == "7"
        assert info.value.body == err["error"]


async def test_default_responses_with_openai_sdk() -> None:
    async with FakeUpstream() as up:
        c = client(up)
        r = await c.responses.create(model="m", input="hi")
        assert (r.output_text, r.status, r.model) == (DEFAULT_TEXT, "completed", "m")
        assert r.usage is not None and (
            r.usage.input_tokens,
            r.usage.output_tokens,
            r.usage.total_tokens,
        ) == (5, 3, 8)
        events = [e async for e in await c.responses.create(model="m", input="hi", stream=True)]
        async with c.responses.stream(model="m", input="hi") as stream:
            final = await stream.get_final_response()
        await c.close()
        assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == DEFAULT_TEXT
        assert [e.sequence_number for e in events] == list(range(len(default_responses_stream())))
        assert final.output_text == DEFAULT_TEXT
        assert [(rq.path, rq.json.get("stream")) for rq in up.requests] == [
            ("/v1/responses", None),
            ("/v1/responses", True),
            ("/v1/responses", True),
        ]


async def test_scripted_responses_args_only_in_done_through_openai_sdk() -> None:
    async with FakeUpstream() as up:
        up.script("/v1/responses", [Reply.sse(RESPONSES_ARGS_ONLY_IN_DONE)])
        c = client(up)
        events = [e async for e in await c.responses.create(model="m", input="hi", stream=True)]
        await c.close()
        assert [e.type for e in events] == [
            "response.created",
            "response.output_item.added",
            "response.function_call_arguments.done",
            "response.completed",
        ]
        assert events[-1].response.output[0].arguments == '{"city":"Paris"}'


async def test_default_anthropic_messages_with_anthropic_sdk() -> None:
    async with FakeUpstream() as up:
        c = AsyncAnthropic(base_url=up.origin, api_key="k", max_retries=0)
        m = await c.messages.create(model="m", max_tokens=5, messages=MESSAGES)  # type: ignore[arg-type]
        async with c.messages.stream(model="m", max_tokens=5, messages=MESSAGES) as stream:  # type: ignore[arg-type]
            final = await stream.get_final_message()
        await c.close()
        for msg in (m, final):
            assert msg.content[0].type == "text" and msg.content[0].text == DEFAULT_TEXT
            assert (msg.stop_reason, msg.usage.input_tokens, msg.usage.output_tokens) == ("end_turn", 5, 3)
        assert [rq.path for rq in up.requests] == ["/v1/messages", "/v1/messages"]
        assert up.requests[0].headers["anthropic-version"]  # the SDK sends its own version


async def test_models_and_unknown_path() -> None:
    async with FakeUpstream(models=["m", "other"]) as up:
        c = client(up)
        models = await c.models.list()
        await c.close()
        assert [m.id for m in models.data] == ["m", "other"]
        async with aiohttp.ClientSession() as s, s.post(up.base_url + "/nope", json={}) as resp:
            assert resp.status == 404
            assert (await resp.json())["error"]["code"] == 404


async def test_queue_order_path_before_wildcard_then_default_and_callables() -> None:
    async def echo(req: FakeRequest) -> Reply:
        return Reply.json(chat_completion(f"echo {req.json['messages'][0]['content']}"))

    async with FakeUpstream() as up:
        up.script(None, [Reply.json(chat_completion("wild 1")), echo])
        up.script(
            "/v1/chat/completions",
            [Reply.json(chat_completion("path 1")), lambda req: Reply.json(chat_completion("path 2"))],
        )
        c = client(up)
        texts = []
        for _ in range(5):
            r = await c.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
            texts.append(r.choices[0].message.content)
        await c.close()
        assert texts == ["path 1", "path 2", "wild 1", "echo hi", DEFAULT_TEXT]


async def test_keep_alive_several_requests_on_one_connection() -> None:
    async with FakeUpstream() as up:
        conn = aiohttp.TCPConnector(limit=1)
        async with aiohttp.ClientSession(connector=conn) as s:
            for i in range(3):
                async with s.post(
                    up.base_url + "/chat/completions",
                    json={"model": "m", "messages": MESSAGES, "stream": i == 1},
                ) as resp:
                    assert resp.status == 200
                    await resp.read()
            async with s.get(up.base_url + "/models") as resp:
                assert (await resp.json())["data"][0]["id"] == "m"
        assert up.connections_opened == 1
        assert [r.path for r in up.requests] == ["/v1/chat/completions"] * 3 + ["/v1/models"]
        await up.wait_for_connections_closed(1, timeout=2.0)


async def test_20mb_request_body() -> None:
    big = "A" * (20 * 1024 * 1024)
    async with FakeUpstream() as up:
        async with aiohttp.ClientSession() as s:
            body = json.dumps({"model": "m", "messages": [{"role": "user", "content": big}]}).encode()
            async with s.post(
                up.base_url + "/chat/completions",
                data=io.BytesIO(body),
                headers={"Content-Type": "application/json"},
            ) as resp:
                assert resp.status == 200
                assert (await resp.json())["choices"][0]["message"]["content"] == DEFAULT_TEXT
        assert len(up.requests[0].json["messages"][0]["content"]) == 20 * 1024 * 1024
        assert int(up.requests[0].headers["content-length"]) == len(up.requests[0].body)


async def test_chunked_request_body() -> None:
    async def gen():  # type: ignore[no-untyped-def]
        yield b'{"model":"m",'
        yield b'"messages":[]}'

    async with FakeUpstream() as up:
        async with (
            aiohttp.ClientSession() as s,
            s.post(up.base_url + "/chat/completions", data=gen()) as resp,
        ):
            assert resp.status == 200
        assert up.requests[0].headers["transfer-encoding"] == "chunked"
        assert up.requests[0].json == {"model": "m", "messages": []}


async def test_abrupt_close_mid_stream_with_aiohttp() -> None:
    c1, c2 = chat_chunk("par", role="assistant"), chat_chunk("tial")
    async with FakeUpstream() as up:
        up.script(None, [Reply.sse([c1, c2], close_abruptly=True)])
        received = b""
        async with aiohttp.ClientSession() as s, s.post(up.base_url + "/chat/completions", json={}) as resp:
            assert resp.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):
                async for data in resp.content.iter_any():
                    received += data
        assert received == c1 + c2
        await up.wait_for_connections_closed(1, timeout=2.0)


async def test_abrupt_close_with_content_length_framing() -> None:
    async with FakeUpstream() as up:
        up.script(None, [Reply.raw(b'{"partial":', content_type="application/json", close_abruptly=True)])
        async with aiohttp.ClientSession() as s, s.post(up.base_url + "/chat/completions", json={}) as resp:
            assert resp.headers["content-length"] == str(len(b'{"partial":') + 1)
            with pytest.raises(aiohttp.ClientPayloadError):
                await resp.read()


async def test_close_framing_and_html_502() -> None:
    async with FakeUpstream() as up:
        up.script(
            None,
            [
                Reply.raw(
                    [b"<html>", b"bad gateway</html>"], status=502, content_type="text/html", framing="close"
                )
            ],
        )
        async with aiohttp.ClientSession() as s, s.post(up.base_url + "/chat/completions", json={}) as resp:
            assert resp.status == 502
            assert resp.headers["content-type"] == "text/html"
            assert await resp.read() == b"<html>bad gateway</html>"


async def test_client_disconnect_mid_stream_is_seen_before_the_next_write() -> None:
    async with FakeUpstream() as up:
        up.script(None, [Reply.sse([chat_chunk("a"), chat_chunk("b"), DONE], delay_s=[0, 30, 0])])
        async with aiohttp.ClientSession() as s:
            resp = await s.post(up.base_url + "/chat/completions", json={})
            first = await resp.content.readuntil(b"\n\n")
            assert first == chat_chunk("a")
            resp.close()  # drops the connection
            await up.wait_for_disconnect(1, timeout=10.0)  # the next write is 30 s away
        assert up.disconnects == 1
        assert up.requests[0].disconnected


async def test_never_respond_and_header_delay_time_out_the_client() -> None:
    async with FakeUpstream() as up:
        up.script(None, [Reply(never_respond=True), Reply.json(chat_completion(), delay_headers_s=5)])
        c = client(up, timeout=0.3)
        for _ in range(2):
            with pytest.raises(openai.APITimeoutError):
                await c.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        await c.close()
        await up.wait_for_disconnect(2, timeout=2.0)
        assert [r.disconnected for r in up.requests] == [True, True]


async def test_per_chunk_delays() -> None:
    async with FakeUpstream() as up:
        up.script(None, [Reply.sse([chat_chunk("a"), DONE], delay_s=0.2)])
        t0 = time.perf_counter()
        async with aiohttp.ClientSession() as s, s.post(up.base_url + "/chat/completions", json={}) as resp:
            body = await resp.read()
        assert time.perf_counter() - t0 >= 0.4
        assert body == chat_chunk("a") + DONE


async def test_stop_closes_open_connections() -> None:
    up = FakeUpstream()
    await up.start()
    up.script(None, [Reply(never_respond=True)])
    reader, writer = await asyncio.open_connection(up.host, up.port)
    writer.write(post("/v1/chat/completions", b"{}"))
    await writer.drain()
    await up.wait_for_requests(1, timeout=2.0)
    await asyncio.wait_for(up.stop(), timeout=2.0)
    assert await asyncio.wait_for(reader.read(), timeout=2.0) == b""
    writer.close()


# ------------------------------------------------------------------ the scripted policy
ANSWER = {"total": 42, "name": "it's"}
PLAN = Plan.write_answer(ANSWER)
CHAT_BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Execute a bash command",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}
CHAT_READ = {
    "type": "function",
    "function": {
        "name": "read_file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
    },
}
RESP_EXEC = {
    "type": "function",
    "name": "exec_command",
    "description": "Runs a command",
    "parameters": {
        "type": "object",
        "properties": {"cmd": {"type": "string"}, "login": {"type": "boolean"}},
        "required": ["cmd"],
    },
}
RESP_VIEW = {
    "type": "function",
    "name": "view_image",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
}
ANTH_TOOLS = [
    {
        "name": "Write",
        "input_schema": {
            "type": "object",
            "properties": {"file_path": {"type": "string"}, "content": {"type": "string"}},
        },
    },
    {
        "name": "Bash",
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string"}, "description": {"type": "string"}},
            "required": ["command"],
        },
    },
]


def run_script(script: str, cwd: str) -> str:
    """Run a planned command the way a client's shell tool does; its output."""
    import subprocess

    return subprocess.run(["bash", "-c", script], cwd=cwd, capture_output=True, text=True, check=True).stdout


def test_plan_write_answer_writes_the_json_and_prints_it(tmp_path: Path) -> None:
    out = run_script(PLAN.commands[0], str(tmp_path))
    assert json.loads(out) == ANSWER
    assert json.loads((tmp_path / "outputs" / "answer.json").read_text()) == ANSWER
    assert Plan.write_answer(ANSWER, submit=True).commands[1] == SUBMIT_COMMAND


def test_find_shell_tool_by_schema_whatever_its_name() -> None:
    assert find_shell_tool("chat_completions", [CHAT_READ, CHAT_BASH]) == ShellTool("bash", "command")
    assert find_shell_tool("responses", [RESP_VIEW, RESP_EXEC]) == ShellTool("exec_command", "cmd")
    assert find_shell_tool("anthropic_messages", ANTH_TOOLS) == ShellTool("Bash", "command", kind="anthropic")
    argv = {
        "type": "function",
        "name": "shell",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "array", "items": {"type": "string"}}},
        },
    }
    tool = find_shell_tool("responses", [argv])
    assert tool == ShellTool("shell", "command", argv=True)
    assert tool.arguments("ls") == {"command": ["bash", "-lc", "ls"]}
    assert find_shell_tool("chat_completions", [CHAT_READ]) is None


async def test_policy_over_chat_tools_streamed_and_not(tmp_path: Path) -> None:
    async with FakeUpstream() as up:
        policy = ScriptedPolicy(PLAN)
        up.add_rule(policy)
        c = client(up)
        messages: list[dict[str, object]] = [{"role": "user", "content": "task"}]
        first = await c.chat.completions.create(model="r", messages=messages, tools=[CHAT_READ, CHAT_BASH])  # type: ignore
        call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
        assert (first.choices[0].finish_reason, call.function.name) == ("tool_calls", "bash")  # type: ignore[union-attr]
        output = run_script(json.loads(call.function.arguments)["command"], str(tmp_path))  # type: ignore[union-attr]
        messages += [
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": output},
        ]
        stream = await c.chat.completions.create(
            model="r",
            messages=messages,
            tools=[CHAT_BASH],
            stream=True,  # type: ignore
            stream_options={"include_usage": True},
        )
        text, usage = "", None
        async for chunk in stream:
            text += "".join(ch.delta.content or "" for ch in chunk.choices)
            usage = chunk.usage or usage
        await c.close()
    assert text == PLAN.final
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (110, 20)
    assert [(t.kind, t.index, t.stream, t.tool) for t in policy.turns] == [
        ("command", 0, False, "bash"),
        ("final", 1, True, "bash"),
    ]
    assert json.loads(policy.turns[1].observation or "") == ANSWER
    sent = policy.turns[0].reply
    assert first.choices[0].message.model_dump(exclude_none=True) == sent["choices"][0]["message"]
    assert (first.id, first.usage.total_tokens) == (sent["id"], 120)  # type: ignore[union-attr]
    assert policy.turns[1].reply["choices"][0]["message"]["content"] == text


async def test_policy_streamed_chat_tool_call_assembles_to_the_reply() -> None:
    async with FakeUpstream() as up:
        policy = ScriptedPolicy(PLAN)
        up.add_rule(policy)
        c = client(up)
        stream = await c.chat.completions.create(model="r", messages=MESSAGES, tools=[CHAT_BASH], stream=True)  # type: ignore
        name, args, finish = "", "", None
        async for chunk in stream:
            for ch in chunk.choices:
                for tc in ch.delta.tool_calls or []:
                    name += tc.function.name or "" if tc.function else ""
                    args += tc.function.arguments or "" if tc.function else ""
                finish = ch.finish_reason or finish
        await c.close()
    sent = policy.turns[0].reply["choices"][0]["message"]["tool_calls"][0]["function"]
    assert (name, args, finish) == (sent["name"], sent["arguments"], "tool_calls")
    assert json.loads(args) == {"command": PLAN.commands[0]}


async def test_policy_over_responses_streamed_and_not(tmp_path: Path) -> None:
    async with FakeUpstream() as up:
        policy = ScriptedPolicy(PLAN)
        up.add_rule(policy)
        c = client(up)
        async with c.responses.stream(model="r", input="task", tools=[RESP_VIEW, RESP_EXEC]) as s:  # type: ignore
            first = await s.get_final_response()
        call = next(o for o in first.output if o.type == "function_call")
        assert (call.name, json.loads(call.arguments)) == ("exec_command", {"cmd": PLAN.commands[0]})
        output = run_script(json.loads(call.arguments)["cmd"], str(tmp_path))
        second = await c.responses.create(
            model="r",
            tools=[RESP_EXEC],
            input=[  # type: ignore
                {"role": "user", "content": "task"},
                {
                    "type": "function_call",
                    "call_id": call.call_id,
                    "name": call.name,
                    "arguments": call.arguments,
                },
                {"type": "function_call_output", "call_id": call.call_id, "output": output},
            ],
        )
        await c.close()
    assert second.output_text == PLAN.final
    assert first.model_dump(exclude_none=True)["output"] == policy.turns[0].reply["output"]
    assert first.usage is not None and first.usage.input_tokens == 100
    assert [(t.protocol, t.kind, t.stream) for t in policy.turns] == [
        ("responses", "command", True),
        ("responses", "final", False),
    ]
    assert json.loads(policy.turns[1].observation or "") == ANSWER


async def test_policy_over_anthropic_messages_streamed_and_not(tmp_path: Path) -> None:
    async with FakeUpstream() as up:
        policy = ScriptedPolicy(Plan.write_answer({"x": 1}, final="all done"))
        up.add_rule(policy)
        c = AsyncAnthropic(base_url=up.origin, api_key="x", max_retries=0)
        async with c.messages.stream(
            model="r",
            max_tokens=100,
            tools=ANTH_TOOLS,  # type: ignore[arg-type]
            messages=[{"role": "user", "content": "task"}],
        ) as s:
            first = await s.get_final_message()
        use = next(b for b in first.content if b.type == "tool_use")
        assert (use.name, first.stop_reason) == ("Bash", "tool_use")
        output = run_script(use.input["command"], str(tmp_path))  # type: ignore[index]
        second = await c.messages.create(
            model="r",
            max_tokens=100,
            tools=ANTH_TOOLS,
            messages=[  # type: ignore
                {"role": "user", "content": "task"},
                {"role": "assistant", "content": first.model_dump()["content"]},
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": use.id,
                            "content": [{"type": "text", "text": output}],
                        }
                    ],
                },
            ],
        )
        await c.close()
    assert first.model_dump(exclude_none=True)["content"] == policy.turns[0].reply["content"]
    assert (first.usage.input_tokens, first.usage.output_tokens) == (100, 20)
    assert second.content[0].text == "all done"  # type: ignore[union-attr]
    assert json.loads(policy.turns[1].observation or "") == {"x": 1}


async def test_policy_text_protocol_fenced_blocks_then_submit() -> None:
    plan = Plan.write_answer(ANSWER, submit=True)
    async with FakeUpstream() as up:
        policy = ScriptedPolicy(plan)
        up.add_rule(policy)
        c = client(up)
        system = "Reply with one block:\n```mswea_bash_command\nls\n```"
        messages: list[dict[str, str]] = [
            {"role": "system", "content": system},
            {"role": "user", "content": "task"},
        ]
        texts = []
        for observation in ("<output>the answer</output>", None):
            r = await c.chat.completions.create(model="r", messages=messages)  # type: ignore[arg-type]
            texts.append(r.choices[0].message.content or "")
            messages.append({"role": "assistant", "content": texts[-1]})
            if observation:
                messages.append({"role": "user", "content": observation})
        await c.close()
    assert texts[0].endswith(f"```mswea_bash_command\n{plan.commands[0]}\n```")
    assert texts[1].endswith(f"```mswea_bash_command\n{SUBMIT_COMMAND}\n```")
    assert [t.observation for t in policy.turns] == [None, "<output>the answer</output>"]


async def test_policy_side_calls_and_unplayable_requests() -> None:
    async with FakeUpstream() as up:
        policy = ScriptedPolicy(PLAN, text_protocol=False)
        up.add_rule(policy)
        c = client(up)
        side = await c.chat.completions.create(model="r", messages=MESSAGES)  # type: ignore[arg-type]
        with pytest.raises(openai.BadRequestError, match="no shell tool among the offered tools"):
            await c.chat.completions.create(model="r", messages=MESSAGES, tools=[CHAT_READ])  # type: ignore
        await c.close()
    assert side.choices[0].message.content == "OK"
    assert [t.kind for t in policy.turns] == ["side"]
    assert policy.errors == ["scripted policy: no shell tool among the offered tools ['read_file']"]


async def test_policy_gives_each_new_session_the_next_plan() -> None:
    right, wrong = Plan.write_answer({"v": 1}), Plan.write_answer({"v": 2})
    async with FakeUpstream() as up:
        policy = ScriptedPolicy([right, wrong])
        up.add_rule(policy)
        c = client(up)
        got = {}
        for sid in ("s-a", "s-b", "s-a", "s-c"):
            r = await c.chat.completions.create(
                model="r",
                messages=MESSAGES,
                tools=[CHAT_BASH],  # type: ignore
                extra_headers={"X-Session-Id": sid},
            )
            got.setdefault(sid, []).append(json.loads(r.choices[0].message.tool_calls[0].function.arguments))  # type: ignore
        await c.close()
    assert got == {
        "s-a": [{"command": right.commands[0]}] * 2,
        "s-b": [{"command": wrong.commands[0]}],
        "s-c": [{"command": wrong.commands[0]}],
    }
    assert policy.session_plans == {"s-a": right, "s-b": wrong, "s-c": wrong}
    assert [t.session_id for t in policy.turns] == ["s-a", "s-b", "s-a", "s-c"]
    with pytest.raises(ValueError, match="at least one plan"):
        ScriptedPolicy([])
