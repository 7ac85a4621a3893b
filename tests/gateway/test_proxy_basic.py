"""Gateway contract: endpoints, what one call records, routes, secrets, errors in OpenAI's shape.

The gateway runs on a loopback port (tests/gateway/conftest.py) in front of the scripted fake
upstream; the client is the real openai SDK, raw httpx only where the SDK cannot say it.
"""

from __future__ import annotations

import json
import re
from typing import Any

import openai
import pytest

from tests.fake_upstream import DEFAULT_TEXT, DEFAULT_USAGE, FakeUpstream, Reply, chat_completion
from tests.gateway.conftest import CLIENT_KEY, MESSAGES, NO_RETRY, ROUTE_KEY, Gateway, StartGateway, sse_json

UP_PATH = "/v1/chat/completions"


def assert_openai_error(body: Any, *, type_: str, code: str | None = None, param: str | None = None) -> None:
    """``body`` is ``{"error": {"message": str, "type", "param", "code"}}`` (OpenAI's shape)."""
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"]
    assert err["type"] == type_
    assert err["param"] == param
    assert err["code"] == code


async def test_healthz_and_readyz(start_gateway: StartGateway) -> None:
    gw = await start_gateway(max_steps=7, routes={"m": {}, "b": {}})
    http = gw.http()
    r = await http.get("/healthz")
    assert (r.status_code, r.json()) == (200, {"status": "ok"})
    r = await http.get("/readyz")
    assert r.status_code == 200
    assert r.json() == {
        "status": "ready",
        "storage_type": "sqlite",
        "db_url": f"sqlite://{gw.db_path}",
        "max_steps": 7,
        "routes": ["b", "m"],
        "base_session_path": "/v1/sessions",
        "telemetry_mode": "strict",
        "shared_sessions": False,
    }


async def test_non_stream_call_is_recorded_exactly(gw: Gateway, upstream: FakeUpstream) -> None:
    client = gw.client("s1")
    out = await client.chat.completions.create(model="m", messages=MESSAGES, temperature=0.5)  # type: ignore[arg-type]
    assert out.choices[0].message.content == DEFAULT_TEXT
    assert out.usage is not None and out.usage.total_tokens == 8

    assert len(upstream.requests) == 1
    sent = upstream.requests[0]
    assert sent.path == UP_PATH
    assert sent.json == {"messages": MESSAGES, "model": "m", "temperature": 0.5}
    assert sent.headers["authorization"] == f"Bearer {ROUTE_KEY}"
    assert sent.headers["x-session-id"] == "s1"

    [step] = await gw.steps("s1")
    assert (step.session_id, step.seq, step.step_id, step.llm_model) == ("s1", 1, 1, "m")
    assert (step.endpoint, step.is_stream, step.status, step.status_code) == (
        "chat.completions",
        False,
        "ok",
        200,
    )
    assert step.messages == MESSAGES
    assert step.request == sent.json
    assert step.response == chat_completion(DEFAULT_TEXT, model="m")
    assert (step.prompt_tokens, step.completion_tokens, step.total_tokens) == (5, 3, 8)
    assert step.finish_reason == "stop"
    assert step.latency_ms is not None and step.latency_ms > 0
    assert step.ttft_ms is None
    assert step.is_truncated is False
    assert step.meta_json == {"route": "m"}
    assert len(step.record_id) == 22 and re.fullmatch(r"[A-Za-z0-9_-]{22}", step.record_id)


async def test_body_is_forwarded_byte_for_byte(gw: Gateway, upstream: FakeUpstream) -> None:
    raw = b'{ "model" : "m",\n  "messages": [{"role":"user","content":"caf\\u00e9 \xf0\x9f\x8d\xb5"}], "seed": 1.50 }'
    r = await gw.http().post(
        "/v1/sessions/s1/chat/completions", content=raw, headers={"content-type": "application/json"}
    )
    assert r.status_code == 200
    assert upstream.requests[0].body == raw
    [step] = await gw.steps("s1")
    assert step.messages == [{"role": "user", "content": "café 🍵"}]
    assert step.request == json.loads(raw)


async def test_stream_call_is_recorded_assembled(gw: Gateway, upstream: FakeUpstream) -> None:
    client = gw.client("s1")
    stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
    pieces = [c.choices[0].delta.content async for c in stream if c.choices and c.choices[0].delta.content]
    assert "".join(pieces) == DEFAULT_TEXT

    sent = upstream.requests[0].json
    assert sent == {
        "messages": MESSAGES,
        "model": "m",
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    [step] = await gw.steps("s1")
    assert (step.is_stream, step.status, step.status_code, step.finish_reason) == (True, "ok", 200, "stop")
    assert step.request == sent  # as sent upstream, the gateway's include_usage included
    assert step.response["object"] == "chat.completion"
    assert step.response["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": DEFAULT_TEXT},
            "finish_reason": "stop",
            "logprobs": None,
        }
    ]
    assert step.response["usage"] == DEFAULT_USAGE
    assert (step.prompt_tokens, step.completion_tokens, step.total_tokens) == (5, 3, 8)
    assert step.ttft_ms is not None and 0 < step.ttft_ms <= step.latency_ms
    assert step.meta_json == {"route": "m", "usage_requested_by_gateway": True, "chunks": 5}


async def test_step_id_counts_per_session(start_gateway: StartGateway) -> None:
    gw = await start_gateway(routes={"m": {}, "m2": {}})
    for _ in range(3):
        await gw.client("s1").chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    for _ in range(2):
        await gw.client("s2").chat.completions.create(model="m2", messages=MESSAGES)  # type: ignore[arg-type]

    assert [(s.seq, s.llm_model, s.step_id) for s in await gw.steps("s1")] == [
        (1, "m", 1),
        (2, "m", 2),
        (3, "m", 3),
    ]
    assert [(s.seq, s.llm_model, s.step_id) for s in await gw.steps("s2")] == [(1, "m2", 1), (2, "m2", 2)]
    r = await gw.http().get("/v1/sessions/s1")
    assert r.json() == {
        "session_id": "s1",
        "status": "active",
        "max_steps": -1,
        "total_steps": 3,
        "refunded_steps": 0,
        "step_counts": {"m": 3},
        "close_reason": None,
        "completion_mode": None,
        "rejected_calls": {},
        "unrecorded_calls": 0,
        "policy_versions": [None],
        "spans_policy_versions": False,
    }
    [row] = gw.sql(
        "SELECT status, total_steps, step_counts, route FROM gateway_sessions WHERE session_id='s1'"
    )
    assert (row["status"], row["total_steps"], json.loads(row["step_counts"]), row["route"]) == (
        "active",
        3,
        {"m": 3},
        "m",
    )


@pytest.mark.parametrize("stream", [False, True])
async def test_secrets_are_never_recorded(gw: Gateway, upstream: FakeUpstream, stream: bool) -> None:
    body_secret = "sk-body-SECRET-0d15ea5e"
    client = gw.client("s1", default_headers={"X-Api-Key": "sk-header-SECRET-feed"})
    kw: dict[str, Any] = {"model": "m", "messages": MESSAGES, "extra_body": {"api_key": body_secret}}
    if stream:
        async for _ in await client.chat.completions.create(stream=True, **kw):
            pass
    else:
        await client.chat.completions.create(**kw)
    sent = upstream.requests[0]
    # upstream gets the route's key, never the client's credentials
    assert sent.headers["authorization"] == f"Bearer {ROUTE_KEY}"
    assert CLIENT_KEY.encode() not in sent.body and "x-api-key" not in sent.headers
    [step] = await gw.steps("s1")
    assert step.request["api_key"] == "[REDACTED]"
    dump = gw.db_dump()
    assert "session_steps" in dump and DEFAULT_TEXT in dump
    for secret in (ROUTE_KEY, CLIENT_KEY, body_secret, "sk-header-SECRET-feed"):
        assert secret not in dump
    for suffix in ("", "-wal"):
        path = gw.db_path.with_name(gw.db_path.name + suffix)
        if path.exists():
            data = path.read_bytes()
            assert ROUTE_KEY.encode() not in data and CLIENT_KEY.encode() not in data


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "fetch_repo",
            "description": "Clone a repository",
            "parameters": {
                "type": "object",
                "properties": {
                    "url": {"type": "string"},
                    "access_token": {"type": "string", "description": "PAT to use"},
                    "password": {"type": "string"},
                },
                "required": ["url"],
            },
        },
    }
]
TOOL_CONVERSATION = [
    {"role": "user", "content": "clone it"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "fetch_repo", "arguments": '{"url": "u", "access_token": "t"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"ok": true, "api_key": "shown-to-model"}'},
]


async def test_tool_calls_and_tool_messages_pass_through_both_ways(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    answer_calls = [
        {"id": "call_2", "type": "function", "function": {"name": "fetch_repo", "arguments": '{"url": "v"}'}}
    ]
    upstream_answer = chat_completion(None, tool_calls=answer_calls, finish_reason="tool_calls")
    upstream.script(UP_PATH, [Reply.json(upstream_answer)])
    out = await gw.client("s1").chat.completions.create(
        model="m", messages=TOOL_CONVERSATION, tools=TOOLS, tool_choice="auto"
    )  # type: ignore[arg-type]
    assert out.choices[0].finish_reason == "tool_calls"
    assert [tc.model_dump() for tc in out.choices[0].message.tool_calls or []] == answer_calls

    sent = upstream.requests[0].json
    assert sent["messages"] == TOOL_CONVERSATION and sent["tools"] == TOOLS and sent["tool_choice"] == "auto"
    [step] = await gw.steps("s1")
    assert step.messages == TOOL_CONVERSATION
    assert step.request == sent  # tool schemas and tool messages are content: recorded untouched
    assert step.response == upstream_answer
    assert step.finish_reason == "tool_calls"


async def test_unknown_route_is_404_in_openai_shape(gw: Gateway, upstream: FakeUpstream) -> None:
    with pytest.raises(openai.NotFoundError) as ei:
        await gw.client("s1").chat.completions.create(model="nope", messages=MESSAGES)  # type: ignore[arg-type]
    assert ei.value.status_code == 404
    assert_openai_error(
        ei.value.response.json(), type_="not_found_error", code="model_not_found", param="model"
    )
    assert "nope" in ei.value.response.json()["error"]["message"]
    with pytest.raises(openai.NotFoundError):
        await gw.client().chat.completions.create(model="nope", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
    assert upstream.requests == []
    assert await gw.steps("s1") == []


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        (b"", None),
        (b"[1, 2]", None),
        (b'"text"', None),
        (b'{"messages": [{"role": "user", "content": "x"}]}', "model"),
        (b'{"model": "m", "messages": "hi"}', "messages"),
        (b'{"model": "m"}', "messages"),
        (b'{"model": 3, "messages": []}', "model"),
        (b'{"model": "m", "messages": [], "stream": {"a": 1}}', "stream"),
        (b'\xff\xfe{"model": "m"}', None),
    ],
)
async def test_malformed_request_is_400_in_openai_shape(
    gw: Gateway, upstream: FakeUpstream, body: bytes, param: str | None
) -> None:
    for path in ("/v1/sessions/s1/chat/completions", "/v1/chat/completions"):
        r = await gw.http().post(path, content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400, r.text
        assert_openai_error(r.json(), type_="invalid_request_error", param=param)
    assert upstream.requests == []
    assert await gw.steps("s1") == []


GOOD = {"model": "m", "messages": MESSAGES}


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": ["hi"]}, "messages"),
        ({"messages": [{"content": "no role"}]}, "messages"),
        ({"messages": [{"role": "user", "content": "x"}, {"role": 7, "content": "x"}]}, "messages"),
        ({"messages": [{"role": None, "content": "x"}]}, "messages"),
        ({"temperature": "0.7"}, "temperature"),
        ({"temperature": 2.5}, "temperature"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": True}, "temperature"),
        ({"top_p": 1.01}, "top_p"),
        ({"top_p": "1"}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": "100"}, "max_tokens"),
        ({"max_tokens": 10.5}, "max_tokens"),
        ({"max_completion_tokens": -5}, "max_completion_tokens"),
        ({"max_completion_tokens": [1]}, "max_completion_tokens"),
        ({"n": 0}, "n"),
        ({"n": "2"}, "n"),
        ({"stream": "true"}, "stream"),
        ({"stream": 1}, "stream"),
        ({"tools": {"type": "function"}}, "tools"),
        ({"tools": ["get_weather"]}, "tools"),
        ({"stop": 5}, "stop"),
        ({"stop": ["a", 5]}, "stop"),
        ({"stop": {"a": 1}}, "stop"),
    ],
)
async def test_wrong_types_of_standard_fields_are_400_naming_the_field(
    gw: Gateway, upstream: FakeUpstream, extra: dict[str, Any], param: str
) -> None:
    for path in ("/v1/sessions/s1/chat/completions", "/v1/chat/completions"):
        r = await gw.http().post(path, json={**GOOD, **extra})
        assert r.status_code == 400, r.text
        assert_openai_error(r.json(), type_="invalid_request_error", param=param)
        assert f"'{param}" in r.json()["error"]["message"]
    assert upstream.requests == []
    assert await gw.steps("s1") == []


async def test_wrong_type_through_the_openai_sdk(gw: Gateway, upstream: FakeUpstream) -> None:
    with pytest.raises(openai.BadRequestError) as ei:
        await gw.client("s1").chat.completions.create(model="m", messages=MESSAGES, max_tokens=0)  # type: ignore[arg-type]
    assert ei.value.status_code == 400
    assert ei.value.param == "max_tokens"  # type: ignore[attr-defined]
    assert upstream.requests == []


async def test_valid_fields_unknown_roles_and_vendor_extras_pass_untouched(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "developer", "content": "be brief"},
            {"role": "ipython", "content": None},
            {"role": "user", "content": [{"type": "text", "text": "hi"}], "name": "u1", "x-extra": 1},
        ],
        "temperature": 0,
        "top_p": 1,
        "max_tokens": 1,
        "max_completion_tokens": 64,
        "n": 1,
        "stream": False,
        "tools": [],
        "stop": ["\n\n", "END"],
        "seed": 7,
        # vLLM / SGLang extras
        "top_k": 20,
        "min_p": 0.05,
        "repetition_penalty": 1.1,
        "skip_special_tokens": False,
        "chat_template_kwargs": {"enable_thinking": False},
        "guided_json": {"type": "object"},
        "return_token_ids": True,
        "separate_reasoning": True,
    }
    raw = json.dumps(body, indent=1).encode()
    r = await gw.http().post(
        "/v1/sessions/s1/chat/completions", content=raw, headers={"content-type": "application/json"}
    )
    assert r.status_code == 200, r.text
    assert upstream.requests[0].body == raw  # the client's bytes, not a re-serialisation
    for value in (2, 2.0, 0.0, None):
        r = await gw.http().post("/v1/chat/completions", json={**GOOD, "temperature": value, "stop": "x"})
        assert r.status_code == 200, r.text


async def test_models_list_names_the_route_keys(start_gateway: StartGateway, upstream: FakeUpstream) -> None:
    gw = await start_gateway(routes={"qwen": {}, "local": {}, "org/model-7b": {}}, default_route="local")
    for client in (gw.client(), gw.client("s1")):  # plain /v1 and a session base URL
        page = await client.models.list()
        assert [(m.id, m.object, m.created, m.owned_by) for m in page.data] == [
            ("qwen", "model", 0, "gateway"),
            ("local", "model", 0, "gateway"),
            ("org/model-7b", "model", 0, "gateway"),
        ]
        got = await client.models.retrieve("org/model-7b")
        assert (got.id, got.owned_by) == ("org/model-7b", "gateway")
        with pytest.raises(openai.NotFoundError) as ei:
            await client.models.retrieve("nope")
        assert_openai_error(
            ei.value.response.json(), type_="not_found_error", code="model_not_found", param="model"
        )
    r = await gw.http().get("/v1/models")
    assert r.json() == {
        "object": "list",
        "data": [
            {"id": key, "object": "model", "created": 0, "owned_by": "gateway"}
            for key in ("qwen", "local", "org/model-7b")
        ],
    }
    assert upstream.requests == []  # answered by the gateway, not forwarded
    assert await gw.steps("s1") == []


async def test_unknown_path_and_wrong_method_in_openai_shape(gw: Gateway) -> None:
    http = gw.http()
    r = await http.get("/v1/nope")
    assert r.status_code == 404
    assert_openai_error(r.json(), type_="not_found_error")
    r = await http.get("/v1/sessions/s1/chat/completions")
    assert r.status_code == 405
    assert_openai_error(r.json(), type_="invalid_request_error")


@pytest.mark.parametrize("stream", [False, True])
async def test_upstream_429_relayed_with_status_body_and_retry_after(
    start_gateway: StartGateway, upstream: FakeUpstream, stream: bool
) -> None:
    gw = await start_gateway(routes={"m": NO_RETRY})  # retries: test_proxy_retries.py
    err = {"error": {"message": "rate limited", "type": "rate_limit_error", "param": None, "code": None}}
    upstream.script(UP_PATH, [Reply.json(err, status=429, headers={"Retry-After": "1"})])
    with pytest.raises(openai.RateLimitError) as ei:
        res = await gw.client("s1").chat.completions.create(model="m", messages=MESSAGES, stream=stream)  # type: ignore[call-overload]
        if stream:
            async for _ in res:
                pass
    assert ei.value.status_code == 429
    assert ei.value.response.headers["retry-after"] == "1"
    assert ei.value.response.json() == err
    assert len(upstream.requests) == 1  # retries disabled: the 429 is relayed as is, never turned into a 500
    [step] = await gw.steps("s1")
    assert (step.status, step.status_code, step.is_stream) == ("error", 429, stream)
    assert step.response == err
    assert step.meta_json == {
        "route": "m",
        "error": "rate limited",
        "budget_refunded": True,
        **({"usage_requested_by_gateway": True} if stream else {}),
    }
    assert step.is_trainable is False  # a 429 never reached the model (test_budget_refund.py)
    assert (step.prompt_tokens, step.total_tokens, step.finish_reason) == (None, None, None)


@pytest.mark.parametrize(
    ("status", "exc"), [(400, openai.BadRequestError), (503, openai.InternalServerError)]
)
async def test_upstream_4xx_5xx_relayed(
    start_gateway: StartGateway, upstream: FakeUpstream, status: int, exc: type[openai.APIStatusError]
) -> None:
    gw = await start_gateway(routes={"m": NO_RETRY})
    err = {"error": {"message": f"upstream says {status}", "type": "x", "param": None, "code": status}}
    upstream.script(UP_PATH, [Reply.json(err, status=status, headers={"Retry-After": "7"})])
    with pytest.raises(exc) as ei:
        await gw.client("s1").chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert ei.value.status_code == status
    assert ei.value.response.json() == err
    assert ei.value.response.headers["retry-after"] == "7"
    [step] = await gw.steps("s1")
    assert (step.status, step.status_code, step.response) == ("error", status, err)


async def test_upstream_html_502_is_relayed_and_recorded_as_error(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(routes={"m": NO_RETRY})
    html = b"<html><body><h1>502 Bad Gateway</h1></body></html>"
    upstream.script(UP_PATH, [Reply.raw(html, status=502, content_type="text/html")])
    r = await gw.http().post("/v1/sessions/s1/chat/completions", json={"model": "m", "messages": MESSAGES})
    assert (r.status_code, r.content) == (502, html)
    assert r.headers["content-type"].startswith("text/html")
    [step] = await gw.steps("s1")
    assert (step.status, step.status_code) == ("error", 502)
    assert step.response == {"raw_body": html.decode(), "content_type": "text/html"}


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b"<html><body><h1>Welcome to nginx!</h1></body></html>", "text/html"),
        (b'{"id": "c1", "object": "chat.completion", "choices": [{"index": 0, "mess', "application/json"),
        (b"[1, 2, 3]", "application/json"),
        (b'{"error": {"message": "model overloaded"}}', "application/json"),
        (b"", "application/json"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
async def test_upstream_200_that_is_not_a_chat_completion_is_502(
    gw: Gateway, upstream: FakeUpstream, body: bytes, content_type: str, stream: bool
) -> None:
    upstream.script(UP_PATH, [Reply.raw(body, content_type=content_type)])
    with pytest.raises(openai.InternalServerError) as ei:  # not a crash inside the SDK
        res = await gw.client("s1").chat.completions.create(model="m", messages=MESSAGES, stream=stream)  # type: ignore[call-overload]
        if stream:
            async for _ in res:
                pass
    assert ei.value.status_code == 502
    err = ei.value.response.json()
    assert_openai_error(err, type_="api_error", code="upstream_invalid_response")
    message = err["error"]["message"]
    assert content_type in message and "200" in message
    assert body[:20].decode() in message
    [step] = await gw.steps("s1")
    assert (step.status, step.status_code, step.is_stream) == ("error", 502, stream)
    parsed = None
    try:
        parsed = json.loads(body)
    except ValueError:
        pass
    assert step.response == (
        parsed if parsed is not None else {"raw_body": body.decode(), "content_type": content_type}
    )
    assert step.meta_json["upstream_status"] == 200
    assert step.meta_json["error"] == err["error"]


async def test_upstream_error_status_with_a_text_body_is_still_relayed(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    upstream.script(UP_PATH, [Reply.raw(b"model not loaded", status=404, content_type="text/plain")])
    r = await gw.http().post("/v1/sessions/s1/chat/completions", json={"model": "m", "messages": MESSAGES})
    assert (r.status_code, r.content) == (404, b"model not loaded")
    [step] = await gw.steps("s1")
    assert (step.status, step.status_code) == ("error", 404)
    assert step.response == {"raw_body": "model not loaded", "content_type": "text/plain"}


async def test_upstream_unreachable_is_502_and_recorded(start_gateway: StartGateway) -> None:
    gw = await start_gateway(
        routes={"m": {"base_url": "http://127.0.0.1:9/v1", "connect_timeout_s": 2, **NO_RETRY}}
    )
    with pytest.raises(openai.InternalServerError) as ei:
        await gw.client("s1").chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert ei.value.status_code == 502
    assert_openai_error(ei.value.response.json(), type_="api_error", code="upstream_unreachable")
    [step] = await gw.steps("s1")
    assert (step.status, step.status_code, step.meta_json["phase"]) == ("error", 502, "connect")
    assert step.response == ei.value.response.json()


async def test_passthrough_is_forwarded_but_not_recorded(gw: Gateway, upstream: FakeUpstream) -> None:
    client = gw.client()
    out = await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert out.choices[0].message.content == DEFAULT_TEXT
    chunks = [
        c async for c in await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    ]  # type: ignore[arg-type]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == DEFAULT_TEXT
    assert all(c.choices for c in chunks)  # the gateway's own usage request is hidden here too
    assert len(upstream.requests) == 2
    assert "x-session-id" not in upstream.requests[0].headers
    assert gw.sql("SELECT count(*) AS n FROM session_steps")[0]["n"] == 0
    assert gw.sql("SELECT count(*) AS n FROM gateway_sessions")[0]["n"] == 0
    assert await gw.metric("gateway_steps_recorded_total") == 0
    assert (
        await gw.metric("gateway_requests_total", endpoint="chat.completions", route="m", status="200") == 2
    )


async def test_upstream_model_replaces_the_route_key(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(routes={"m": {"upstream_model": "org/real-model-7b"}})
    out = await gw.client("s1").chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert out.model == "org/real-model-7b"  # the upstream's answer, relayed as is
    assert upstream.requests[0].json["model"] == "org/real-model-7b"
    [step] = await gw.steps("s1")
    assert step.llm_model == "m"
    assert step.request["model"] == "org/real-model-7b"
    assert step.meta_json == {"route": "m", "upstream_model": "org/real-model-7b"}


async def test_metrics_count_requests_and_recorded_steps(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(routes={"m": NO_RETRY})
    client = gw.client("s1")
    await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    async for _ in await client.chat.completions.create(model="m", messages=MESSAGES, stream=True):  # type: ignore[arg-type]
        pass
    upstream.script(UP_PATH, [Reply.json({"error": {"message": "busy"}}, status=503)])
    with pytest.raises(openai.InternalServerError):
        await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    m = await gw.metrics()
    assert m[("gateway_steps_recorded_total", ())] == 3
    assert (
        m[("gateway_requests_total", (("endpoint", "chat.completions"), ("route", "m"), ("status", "200")))]
        == 2
    )
    assert (
        m[("gateway_requests_total", (("endpoint", "chat.completions"), ("route", "m"), ("status", "503")))]
        == 1
    )
    assert m[("gateway_synthetic_stops_total", ())] == 0
    assert m[("gateway_telemetry_dropped_total", ())] == 0
    assert m[("gateway_upstream_in_flight", (("route", "m"),))] == 0
    assert m[("gateway_ttft_seconds_count", (("route", "m"),))] == 1
    assert (
        m[("gateway_request_latency_seconds_count", (("endpoint", "chat.completions"), ("route", "m")))] == 3
    )


async def test_session_status_close_and_closed_session(gw: Gateway, upstream: FakeUpstream) -> None:
    http = gw.http()
    r = await http.get("/v1/sessions/s1")
    assert r.status_code == 404
    assert_openai_error(r.json(), type_="not_found_error", code="session_not_found")

    await gw.client("s1").chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    r = await http.post("/v1/sessions/s1/close", json={"reason": "done", "completion_mode": "finished"})
    assert r.status_code == 200
    assert r.json() == {
        "session_id": "s1",
        "status": "closed",
        "total_steps": 1,
        "max_steps": -1,
        "refunded_steps": 0,
        "truncated": False,
        "close_reason": "done",
        "completion_mode": "finished",
        "rejected_calls": {},
        "unrecorded_calls": 0,
        "policy_versions": [None],
        "spans_policy_versions": False,
    }
    r = await http.post("/v1/sessions/s1/close", json={"reason": "again"})  # idempotent: first reason kept
    assert r.json()["close_reason"] == "done"
    r = await http.get("/v1/sessions/s1")
    assert (r.json()["status"], r.json()["total_steps"], r.json()["close_reason"]) == ("closed", 1, "done")
    [row] = gw.sql("SELECT status, close_reason, completion_mode, closed_at FROM gateway_sessions")
    assert (row["status"], row["close_reason"], row["completion_mode"]) == ("closed", "done", "finished")
    assert row["closed_at"] is not None

    with pytest.raises(openai.ConflictError) as ei:
        await gw.client("s1").chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert_openai_error(ei.value.response.json(), type_="conflict_error", code="session_closed")
    assert len(upstream.requests) == 1

    r = await http.post("/v1/sessions/s1/close", json={"reason": "x", "typo": 1})
    assert r.status_code == 400
    assert_openai_error(r.json(), type_="invalid_request_error", code="invalid_request", param="typo")
    await gw.register("s3")  # a session a launcher registered, that never called the model
    r = await http.post("/v1/sessions/s3/close")  # no body at all
    assert (r.status_code, r.json()["status"], r.json()["total_steps"]) == (200, "closed", 0)


async def test_closing_an_unknown_session_is_a_404_that_creates_nothing(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    http = gw.http()
    r = await http.post("/v1/sessions/nobody/close", json={"reason": "done"})
    assert r.status_code == 404
    assert_openai_error(r.json(), type_="not_found_error", code="session_not_found", param="session_id")
    assert "unknown session nobody" in r.json()["error"]["message"]
    assert gw.sql("SELECT session_id FROM gateway_sessions") == []
    assert (await http.get("/v1/sessions/nobody")).status_code == 404  # no state was made up
    assert not gw.app_state.sessions.holds("nobody")
    # a session registered by a launcher that never called the model (its runtime answered
    # without one) is closed: 0 steps, its budget, and a late call of it is refused
    await gw.register("quiet", max_steps=4)
    r = await http.post("/v1/sessions/quiet/close", json={"reason": "succeeded"})
    assert r.status_code == 200
    assert (r.json()["status"], r.json()["total_steps"], r.json()["max_steps"]) == ("closed", 0, 4)
    assert (r.json()["policy_versions"], r.json()["spans_policy_versions"]) == ([], False)  # no step
    r = await http.post("/v1/sessions/quiet/chat/completions", json={"model": "m", "messages": MESSAGES})
    assert (r.status_code, r.json()["error"]["code"]) == (409, "session_closed")
    # a session that called the model and was forgotten after its close: closing it again is idempotent
    await gw.client("talker").chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    for reason in ("done", "again"):
        r = await http.post("/v1/sessions/talker/close", json={"reason": reason})
        assert (r.status_code, r.json()["close_reason"], r.json()["total_steps"]) == (200, "done", 1)
        assert r.json()["policy_versions"] == [None]  # its one step, made before any version was set
    assert sorted(row["session_id"] for row in gw.sql("SELECT session_id FROM gateway_sessions")) == [
        "quiet",
        "talker",
    ]
    assert len(upstream.requests) == 1


async def test_a_control_body_larger_than_its_limit_is_a_413(gw: Gateway) -> None:
    """A close or admin body carries a few fields: one over CONTROL_BODY_BYTES is refused
    without being kept, and the session is left as it was."""
    from gateway.bodies import CONTROL_BODY_BYTES

    await gw.register("big", max_steps=4)
    http = gw.http()
    padding = "x" * (CONTROL_BODY_BYTES + 1)
    for path in ("/v1/sessions/big/close", "/admin/pause", "/admin/policy_version"):
        r = await http.post(path, json={"reason": padding})
        assert r.status_code == 413, path
        assert_openai_error(r.json(), type_="invalid_request_error", code="request_too_large")
        assert r.json()["error"]["message"] == (  # the fixed control limit, not max_request_bytes
            "request body is larger than the gateway's limit of 65536 bytes "
            "(control body limit, fixed: a close or admin body holds a few fields)"
        ), path
    r = await http.post("/v1/sessions/big/close", json={"reason": "done"})
    assert (r.status_code, r.json()["close_reason"]) == (200, "done")  # the refused close closed nothing


async def test_default_stream_bytes_hide_the_gateways_usage_request(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    """The client did not ask for usage: it gets the same bytes as from an upstream it had asked
    without include_usage, except the ``"usage":null`` fields OpenAI adds to every chunk."""
    r = await gw.http().post(
        "/v1/sessions/s1/chat/completions", json={"model": "m", "messages": MESSAGES, "stream": True}
    )
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert b'"choices":[]' not in r.content
    assert r.content.endswith(b"data: [DONE]\n\n")
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in sse_json(r.content)) == DEFAULT_TEXT
    [step] = await gw.steps("s1")
    assert step.response["usage"] == DEFAULT_USAGE
