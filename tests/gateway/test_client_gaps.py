"""What real CLI clients ask of the gateway besides model calls, with the real anthropic and openai
SDKs: Anthropic's count_tokens (forwarded to an ``api: anthropic`` route, else counted by the
route's tokenizer or estimated; never a step, never budget), Anthropic's error shape on every
Anthropic path, ``HEAD`` of a session's base URL, and route aliases."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import anthropic
import pytest

from gateway.count_tokens import CHARS_PER_TOKEN, TOKENS_PER_MESSAGE, estimate_tokens
from gateway.settings import GatewaySettings
from tests.fake_upstream import FakeUpstream, Reply
from tests.gateway.conftest import (
    CLIENT_KEY,
    MESSAGES,
    ROUTE_KEY,
    Gateway,
    StartGateway,
    anthropic_routes,
    eventually,
)

COUNT_PATH = "/v1/messages/count_tokens"


def assert_anthropic_error(body: Any, type_: str) -> str:
    assert body["type"] == "error" and set(body) == {"type", "error"}, body
    assert set(body["error"]) == {"type", "message"} and body["error"]["type"] == type_, body
    return str(body["error"]["message"])


@pytest.fixture
async def agw(start_gateway: StartGateway, upstream: FakeUpstream) -> Gateway:
    return await start_gateway(routes=anthropic_routes(upstream))


# ------------------------------------------------------------------------------ count_tokens
async def test_count_tokens_forwarded_to_an_anthropic_route(agw: Gateway, upstream: FakeUpstream) -> None:
    upstream.script(COUNT_PATH, [Reply.json({"input_tokens": 1234}), Reply.json({"input_tokens": 99})])
    client = agw.anthropic("s1")
    await client.messages.create(model="a", max_tokens=8, messages=MESSAGES)  # type: ignore[arg-type]
    out = await client.messages.count_tokens(model="a", messages=MESSAGES, system="sys")  # type: ignore[arg-type]
    assert out.input_tokens == 1234
    beta = await agw.http().post(
        f"/v1/sessions/s1{COUNT_PATH}?beta=true",
        json={"model": "a", "messages": MESSAGES},
        headers={"anthropic-beta": "token-counting-2024-11-01"},
    )
    assert beta.json() == {"input_tokens": 99}  # Claude Code's form of the call

    sent = [r for r in upstream.requests if r.path == COUNT_PATH]
    assert [r.query for r in sent] == ["", "beta=true"]
    assert sent[0].json == {"model": "a", "messages": MESSAGES, "system": "sys"}
    assert sent[0].headers["x-api-key"] == ROUTE_KEY and sent[0].headers["x-session-id"] == "s1"
    assert sent[1].headers["anthropic-beta"] == "token-counting-2024-11-01"
    assert CLIENT_KEY not in str(sent[0].headers)
    # never a step, never budget
    steps = await agw.steps("s1")
    assert [s.endpoint for s in steps] == ["messages"]
    status = (await agw.http().get("/v1/sessions/s1")).json()
    assert status["total_steps"] == 1

    raw = await agw.http().post(
        COUNT_PATH, json={"model": "a", "messages": MESSAGES}
    )  # sessionless: 404 upstream
    assert raw.status_code == 404 and raw.headers["x-gateway-token-count"] == "upstream"


async def test_count_tokens_estimated_for_an_openai_route(agw: Gateway, upstream: FakeUpstream) -> None:
    client = agw.anthropic("s1")
    messages = [
        {"role": "user", "content": "x" * 40},
        {"role": "assistant", "content": [{"type": "text", "text": "y" * 9}]},
    ]
    r = await client.messages.with_raw_response.count_tokens(
        model="m",
        messages=messages,  # type: ignore[arg-type]
        system="z" * 7,
    )
    assert r.headers["x-gateway-token-count"] == "estimate"
    assert (
        (await r.parse()).input_tokens
        == math.ceil((40 + 9 + 7) / CHARS_PER_TOKEN) + 3 * TOKENS_PER_MESSAGE
        == 23
    )
    assert upstream.requests == []  # counted in the gateway
    assert await agw.steps("s1") == []


def test_estimate_counts_tools_and_tool_blocks() -> None:
    tools = [{"name": "bash", "input_schema": {"type": "object"}}]
    body = {
        "messages": [
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t", "name": "bash", "input": {"cmd": "ls"}}],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t",
                        "content": [{"type": "text", "text": "a.txt"}],
                    }
                ],
            },
        ],
        "tools": tools,
    }
    chars = (
        len('bash {"cmd": "ls"}')
        + len("a.txt")
        + len('[{"name": "bash", "input_schema": {"type": "object"}}]')
    )
    assert estimate_tokens(body) == math.ceil(chars / CHARS_PER_TOKEN) + 2 * TOKENS_PER_MESSAGE


async def test_count_tokens_by_the_route_tokenizer(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    g = await start_gateway(
        routes={
            "v": {"count_tokens": "vllm", "upstream_model": "Qwen/Q"},
            "l": {"count_tokens": "llama_cpp"},
            "bad": {"count_tokens": "vllm"},
        }
    )
    upstream.script(
        "/tokenize",
        [
            Reply.json({"count": 77, "max_model_len": 4096, "tokens": []}),
            Reply.json({"detail": "Not Found"}, status=404),
        ],
    )
    upstream.script("/extras/tokenize/count", [Reply.json({"count": 5})])
    client = g.anthropic("s1")
    tools = [{"name": "bash", "description": "run", "input_schema": {"type": "object"}}]
    r = await client.messages.with_raw_response.count_tokens(
        model="v",
        messages=MESSAGES,
        system="sys",  # type: ignore[arg-type]
        tools=tools,
    )  # type: ignore[arg-type]
    assert (await r.parse()).input_tokens == 77 and r.headers["x-gateway-token-count"] == "vllm"
    v = upstream.requests[-1]
    assert v.path == "/tokenize" and v.headers["authorization"] == f"Bearer {ROUTE_KEY}"
    assert v.json == {
        "model": "Qwen/Q",
        "add_generation_prompt": True,
        "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}],
        "tools": [
            {
                "type": "function",
                "function": {"name": "bash", "description": "run", "parameters": {"type": "object"}},
            }
        ],
    }
    out = await client.messages.count_tokens(model="l", messages=MESSAGES)  # type: ignore[arg-type]
    assert out.input_tokens == 5
    assert upstream.requests[-1].path == "/extras/tokenize/count"
    assert upstream.requests[-1].json == {"model": "l", "input": "user: hi"}
    with pytest.raises(anthropic.APIStatusError) as e:  # no tokenizer there: a clear 502, no guess
        await client.messages.count_tokens(model="bad", messages=MESSAGES)  # type: ignore[arg-type]
    assert e.value.status_code == 502
    assert "estimate" in assert_anthropic_error(e.value.body, "api_error")
    assert await g.steps("s1") == []


async def test_count_tokens_bad_body_and_unknown_route(agw: Gateway) -> None:
    http = agw.http()
    r = await http.post("/v1/sessions/s1" + COUNT_PATH, json={"model": "a"})
    assert r.status_code == 400 and "messages" in assert_anthropic_error(r.json(), "invalid_request_error")
    r = await http.post("/v1/sessions/s1" + COUNT_PATH, json={"model": "nope", "messages": MESSAGES})
    assert r.status_code == 404 and "nope" in assert_anthropic_error(r.json(), "not_found_error")


# ------------------------------------------------------------------------------ error shape
async def test_errors_on_anthropic_paths_are_in_anthropic_shape(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    g = await start_gateway(
        routes=anthropic_routes(upstream), max_request_bytes=2000, auth={"api_keys": [CLIENT_KEY]}
    )
    http = g.http(headers={"x-api-key": CLIENT_KEY})
    with pytest.raises(anthropic.NotFoundError) as nf:
        await g.anthropic("s1").messages.create(model="claude-opus-4-8", max_tokens=8, messages=MESSAGES)  # type: ignore[arg-type]
    assert "claude-opus-4-8" in assert_anthropic_error(nf.value.body, "not_found_error")
    r = await http.post("/v1/sessions/s1/v1/messages/batches", json={})
    assert r.status_code == 404
    assert_anthropic_error(r.json(), "not_found_error")
    r = await http.get("/v1/sessions/s1/v1/messages")
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert_anthropic_error(r.json(), "invalid_request_error")
    big = {"model": "a", "max_tokens": 8, "messages": [{"role": "user", "content": "x" * 5000}]}
    for path in ("/v1/sessions/s1/v1/messages", "/v1/sessions/s1" + COUNT_PATH, "/v1/messages"):
        r = await http.post(path, json=big)
        assert r.status_code == 413, path
        assert_anthropic_error(r.json(), "request_too_large")
    for path in ("/v1/sessions/s1" + COUNT_PATH, "/v1/messages/count_tokens", "/v1/sessions/s1/v1/messages"):
        r = await g.http().post(path, json={"model": "a", "messages": MESSAGES})
        assert r.status_code == 401, path
        assert_anthropic_error(r.json(), "authentication_error")
    r = await g.http().post("/v1/sessions/s1/chat/completions", json={})  # OpenAI paths keep OpenAI's shape
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert await g.steps("s1") == []


# ------------------------------------------------------------------------------ HEAD
async def test_head_of_the_session_base_url(start_gateway: StartGateway, upstream: FakeUpstream) -> None:
    g = await start_gateway(auth={"api_keys": [CLIENT_KEY]})
    http = g.http(headers={"authorization": f"Bearer {CLIENT_KEY}"})
    for path in (
        "/v1/sessions/fresh",
        "/v1/sessions/fresh/",
        "/v1/sessions/fresh/v1",
        "/v1/sessions/fresh/v1/",
        "/",
        "/v1",
    ):
        r = await http.head(path)
        assert (r.status_code, r.content) == (200, b""), path
    assert (await g.http().head("/v1/sessions/fresh")).status_code == 401  # auth still applies
    assert (await http.get("/v1/sessions/fresh")).status_code == 404  # HEAD made no session
    assert upstream.requests == []


# ------------------------------------------------------------------------------ aliases
async def test_aliases_and_patterns_reach_their_route(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    routes = anthropic_routes(upstream)
    routes["m"] = {"aliases": ["gpt-5-codex", "o4"]}
    routes["a"].update(alias_pattern="claude-*", upstream_model="claude-real")
    g = await start_gateway(routes=routes)
    out = await g.client("s1").chat.completions.create(model="gpt-5-codex", messages=MESSAGES)  # type: ignore[arg-type]
    assert out.choices[0].message.content
    msg = await g.anthropic("s2").messages.create(model="claude-opus-4-8", max_tokens=8, messages=MESSAGES)  # type: ignore[arg-type]
    assert msg.content
    await g.client("s1").chat.completions.create(model="o4", messages=MESSAGES)  # type: ignore[arg-type]
    assert [r.json["model"] for r in upstream.requests] == ["m", "claude-real", "m"]
    steps = await g.steps("s1")
    assert [(s.llm_model, s.step_id) for s in steps] == [("m", 1), ("m", 2)]
    [claude] = await g.steps("s2")
    assert (claude.llm_model, claude.step_id) == ("a", 1)
    assert steps[0].meta_json == {"route": "m", "requested_model": "gpt-5-codex", "upstream_model": "m"}
    assert (claude.meta_json or {})["requested_model"] == "claude-opus-4-8"
    assert steps[1].meta_json == {"route": "m", "requested_model": "o4", "upstream_model": "m"}
    got = await g.client().models.retrieve("o4")
    assert got.id == "o4"
    listed = [m.id async for m in g.client().models.list()]
    assert listed == ["m", "a", "gpt-5-codex", "o4"]


def test_alias_config_is_strict() -> None:
    def load(routes: dict[str, Any]) -> GatewaySettings:
        return GatewaySettings.model_validate({"llm_routes": routes})

    u = "http://127.0.0.1:1/v1"
    with pytest.raises(ValueError, match="already an alias of route 'a'"):
        load({"a": {"base_url": u, "aliases": ["x"]}, "b": {"base_url": u, "aliases": ["x"]}})
    with pytest.raises(ValueError, match="is the key of route 'b'"):
        load({"a": {"base_url": u, "aliases": ["b"]}, "b": {"base_url": u}})
    with pytest.raises(ValueError, match="exact model name"):
        load({"a": {"base_url": u, "aliases": ["claude-*"]}})
    with pytest.raises(ValueError, match="a name twice"):
        load({"a": {"base_url": u, "aliases": ["x", "x"]}})
    with pytest.raises(ValueError, match="count_tokens: upstream needs an api: anthropic route"):
        load({"a": {"base_url": u, "count_tokens": "upstream"}})
    s = load(
        {
            "a": {"base_url": u, "alias_pattern": "claude-*"},
            "b": {"base_url": u, "alias_pattern": "*"},
            "claude-x": {"base_url": u},
        }
    )
    assert [s.resolve_route(n) for n in ("claude-opus-4-8", "gpt", "claude-x", "a")] == [
        "a",
        "b",
        "claude-x",
        "a",
    ]
    assert load({"a": {"base_url": u}}).resolve_route("b") is None


# ------------------------------------------------------------------------------ self-answered calls
async def test_self_answered_calls_are_logged_and_counted_never_steps(
    start_gateway: StartGateway, upstream: FakeUpstream, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log_path = tmp_path / "requests.jsonl"
    g = await start_gateway(
        routes=anthropic_routes(upstream),
        auth={"api_keys": [CLIENT_KEY]},
        max_steps=1,
        max_request_bytes=4000,
        request_log={"enabled": True, "path": str(log_path)},
    )
    caplog.set_level(logging.INFO, logger="gateway.rejections")
    wrong = g.anthropic("s1", api_key="sk-wrong")
    for _ in range(2):
        with pytest.raises(anthropic.AuthenticationError):
            await wrong.messages.create(model="a", max_tokens=8, messages=MESSAGES)  # type: ignore[arg-type]
    client = g.anthropic("s1")
    with pytest.raises(anthropic.NotFoundError):
        await client.messages.create(model="nope", max_tokens=8, messages=MESSAGES)  # type: ignore[arg-type]
    with pytest.raises(anthropic.APIStatusError) as big:
        await client.messages.create(
            model="a", max_tokens=8, messages=[{"role": "user", "content": "x" * 5000}]
        )
    assert big.value.status_code == 413
    await client.messages.create(model="a", max_tokens=8, messages=MESSAGES)  # type: ignore[arg-type]
    stop = await client.messages.with_raw_response.create(model="a", max_tokens=8, messages=MESSAGES)  # type: ignore[arg-type]
    assert stop.headers["x-gateway-stop-reason"] == "max_steps"
    await g.client("other").chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]

    want = {"invalid_api_key": 2, "model_not_found": 1, "request_too_large": 1, "max_steps": 1}
    http = g.http(headers={"x-api-key": CLIENT_KEY})
    status = (await http.get("/v1/sessions/s1")).json()
    assert (status["rejected_calls"], status["total_steps"]) == (want, 1)
    assert (await http.get("/v1/sessions/other")).json()["rejected_calls"] == {}
    assert len(await g.steps("s1")) == 1  # none of them is a step
    closed = (await http.post("/v1/sessions/s1/close", json={})).json()
    assert closed["rejected_calls"] == want

    def rejected_lines() -> list[dict[str, Any]]:
        lines = [json.loads(x) for x in log_path.read_text().splitlines()] if log_path.exists() else []
        return [ln for ln in lines if ln.get("rejected")]

    await eventually(lambda: len(rejected_lines()) == 5)
    lines = rejected_lines()
    assert [(ln["session_id"], ln["http_status"], ln["rejected"]) for ln in lines] == [
        ("s1", 401, "invalid_api_key"),
        ("s1", 401, "invalid_api_key"),
        ("s1", 404, "model_not_found"),
        ("s1", 413, "request_too_large"),
        ("s1", 200, "max_steps"),
    ]
    assert lines[0]["path"] == "/v1/sessions/s1/v1/messages" and lines[0]["step_status"] is None
    assert "sk-wrong" not in log_path.read_text()
    logged = [r.getMessage() for r in caplog.records if r.name == "gateway.rejections"]
    assert len(logged) == 5 and "401 invalid_api_key (session s1)" in logged[0]


# ------------------------------------------------------------------------------ correlation headers
async def test_client_correlation_headers_kept_in_the_step(agw: Gateway) -> None:
    sent = {
        "X-Claude-Code-Session-Id": "cc-7f1",
        "session_id": "codex-1",
        "x-client-request-id": "req-9",
        "x-stainless-retry-count": "0",
        "x-app": "cli",
        "cookie": "secret=1",
    }
    await agw.anthropic("s1").messages.create(
        model="a",
        max_tokens=8,
        messages=MESSAGES,  # type: ignore[arg-type]
        extra_headers=sent,
    )
    await agw.client("s2").chat.completions.create(
        model="m",
        messages=MESSAGES,  # type: ignore[arg-type]
        extra_headers={"session-id": "s" * 300, "thread-id": "t-1", "x-codex-turn-metadata": "{}"},
    )
    (first,), (second,) = await agw.steps("s1"), await agw.steps("s2")
    assert (first.meta_json or {})["client_headers"] == {
        "x-claude-code-session-id": "cc-7f1",
        "session_id": "codex-1",
        "x-client-request-id": "req-9",
    }
    assert (second.meta_json or {})["client_headers"] == {"session-id": "s" * 256, "thread-id": "t-1"}
    assert "secret=1" not in agw.db_dump() and CLIENT_KEY not in agw.db_dump()
