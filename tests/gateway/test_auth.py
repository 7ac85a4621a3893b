"""Optional gateway auth (``auth: {api_keys, api_keys_env}``): with keys, every route but
/healthz, /readyz and /metrics needs ``Authorization: Bearer <key>`` or ``x-api-key: <key>``; a
missing or wrong key is a 401 in OpenAI's error shape (Anthropic's on the Messages routes). The
client's key never goes upstream and is never recorded. Real openai and anthropic SDKs."""

from __future__ import annotations

import hmac
from pathlib import Path
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest
from pydantic import ValidationError

import gateway.auth
from gateway.auth import KeyChecker, presented_keys
from gateway.settings import ConfigError, GatewaySettings, load_settings
from tests.fake_upstream import DEFAULT_TEXT, FakeUpstream
from tests.gateway.conftest import CLIENT_KEY, MESSAGES, ROUTE_KEY, Gateway, StartGateway, anthropic_routes

AUTH = {"api_keys": [CLIENT_KEY]}
OPENAI_401_WRONG = {
    "error": {
        "message": "Incorrect API key provided.",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_api_key",
    }
}
MISSING = (
    "Missing API key: this gateway requires one of its keys as `Authorization: Bearer <key>` or "
    "`x-api-key: <key>`."
)
OPENAI_401_MISSING = {
    "error": {"message": MISSING, "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}
}
ANTHROPIC_401_WRONG = {
    "type": "error",
    "error": {"type": "authentication_error", "message": "Incorrect API key provided."},
}
CHAT = {"model": "m", "messages": MESSAGES}
MSG = {"model": "a", "max_tokens": 8, "messages": MESSAGES}

# every protected route: (method, path, JSON body or None, Anthropic error shape?)
PROTECTED: list[tuple[str, str, dict[str, Any] | None, bool]] = [
    ("POST", "/v1/chat/completions", CHAT, False),
    ("POST", "/v1/responses", {"model": "m", "input": "hi"}, False),
    ("POST", "/v1/messages", MSG, True),
    ("POST", "/v1/sessions/s1/chat/completions", CHAT, False),
    ("POST", "/v1/sessions/s1/chat/completions", {**CHAT, "stream": True}, False),
    ("POST", "/v1/sessions/s1/responses", {"model": "m", "input": "hi"}, False),
    ("POST", "/v1/sessions/s1/v1/messages", MSG, True),
    ("GET", "/v1/models", None, False),
    ("GET", "/v1/models/m", None, False),
    ("GET", "/v1/sessions/s1/models", None, False),
    ("GET", "/v1/sessions/s1/models/m", None, False),
    ("GET", "/v1/sessions/s1", None, False),
    ("POST", "/v1/sessions/s1/close", {"reason": "done"}, False),
    ("GET", "/v1/no-such-path", None, False),
]


async def authed(start_gateway: StartGateway, upstream: FakeUpstream, **kw: Any) -> Gateway:
    return await start_gateway(auth=AUTH, routes=anthropic_routes(upstream), **kw)


def test_auth_is_off_by_default() -> None:
    s = GatewaySettings.model_validate({})
    assert (s.auth.enabled, s.auth.keys()) == (False, ())


async def test_without_keys_nothing_is_asked(gw: Gateway, upstream: FakeUpstream) -> None:
    r = await gw.http().post("/v1/sessions/s1/chat/completions", json=CHAT)
    assert r.status_code == 200


@pytest.mark.parametrize(("method", "path", "body", "anthropic_shape"), PROTECTED)
async def test_every_v1_route_needs_a_key(
    start_gateway: StartGateway,
    upstream: FakeUpstream,
    method: str,
    path: str,
    body: dict[str, Any] | None,
    anthropic_shape: bool,
) -> None:
    gw = await authed(start_gateway, upstream)
    http = gw.http()
    missing = await http.request(method, path, json=body)
    wrong = await http.request(method, path, json=body, headers={"Authorization": "Bearer sk-not-it"})
    wrong_x = await http.request(method, path, json=body, headers={"x-api-key": CLIENT_KEY + "x"})
    assert [r.status_code for r in (missing, wrong, wrong_x)] == [401, 401, 401]
    assert missing.headers["www-authenticate"] == "Bearer"
    assert wrong.headers["www-authenticate"] == 'Bearer error="invalid_token"'
    if anthropic_shape:
        assert missing.json() == {
            "type": "error",
            "error": {"type": "authentication_error", "message": MISSING},
        }
        assert wrong.json() == wrong_x.json() == ANTHROPIC_401_WRONG
    else:
        assert missing.json() == OPENAI_401_MISSING
        assert wrong.json() == wrong_x.json() == OPENAI_401_WRONG
    assert CLIENT_KEY not in wrong_x.text  # never echoed
    assert upstream.requests == []
    assert gw.sql("SELECT count(*) AS n FROM gateway_sessions")[0]["n"] == 0
    assert await gw.metric("gateway_error_responses_total", status="401", code="invalid_api_key") == 3
    # the same request with the key is served (whatever its own answer)
    ok = await http.request(method, path, json=body, headers={"Authorization": f"Bearer {CLIENT_KEY}"})
    assert ok.status_code != 401


async def test_probes_and_metrics_stay_open(start_gateway: StartGateway, upstream: FakeUpstream) -> None:
    gw = await authed(start_gateway, upstream)
    http = gw.http()
    for path in ("/healthz", "/readyz", "/metrics"):
        r = await http.get(path)
        assert r.status_code == 200, path
    assert (await http.get("/metrics/")).status_code == 401  # exact paths only


async def test_the_openai_sdk_with_the_key(start_gateway: StartGateway, upstream: FakeUpstream) -> None:
    gw = await authed(start_gateway, upstream)
    client = gw.client("s1")  # api_key=CLIENT_KEY: sent as Authorization: Bearer
    out = await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert out.choices[0].message.content == DEFAULT_TEXT
    chunks = [
        c async for c in await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    ]  # type: ignore[arg-type]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == DEFAULT_TEXT
    assert [m.id async for m in gw.client().models.list()] == ["m", "a"]
    await gw.client().chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    status = (await gw.http().get("/v1/sessions/s1", headers={"x-api-key": CLIENT_KEY})).json()
    assert status["total_steps"] == 2

    with pytest.raises(openai.AuthenticationError) as ei:
        await gw.client("s1", api_key="sk-wrong").chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert ei.value.status_code == 401 and ei.value.response.json() == OPENAI_401_WRONG
    assert ei.value.code == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        await gw.client("s1", api_key="sk-wrong").chat.completions.create(  # type: ignore[call-overload]
            model="m", messages=MESSAGES, stream=True
        )
    assert len(await gw.steps("s1")) == 2  # refused calls use no budget, leave no step


async def test_the_anthropic_sdk_with_the_key(start_gateway: StartGateway, upstream: FakeUpstream) -> None:
    gw = await authed(start_gateway, upstream)
    sent: list[dict[str, str]] = []

    async def hook(request: httpx2.Request) -> None:
        sent.append({k: v for k, v in request.headers.items() if k in ("authorization", "x-api-key")})

    client = gw.anthropic("s1", http_client=httpx2.AsyncClient(event_hooks={"request": [hook]}))
    msg = await client.messages.create(model="a", max_tokens=8, messages=MESSAGES)  # type: ignore[arg-type]
    assert msg.content[0].text == DEFAULT_TEXT  # type: ignore[union-attr]
    # the installed anthropic SDK (2.x) sends its api_key as a Bearer token (0.x sent x-api-key;
    # both are accepted: see test_every_v1_route_needs_a_key and test_x_api_key_header)
    assert sent == [{"authorization": f"Bearer {CLIENT_KEY}"}]
    async with client.messages.stream(model="a", max_tokens=8, messages=MESSAGES) as stream:  # type: ignore[arg-type]
        assert "".join([t async for t in stream.text_stream]) == DEFAULT_TEXT

    with pytest.raises(anthropic.AuthenticationError) as ei:
        await gw.anthropic("s1", api_key="sk-wrong").messages.create(
            model="a", max_tokens=8, messages=MESSAGES
        )  # type: ignore[arg-type]
    assert ei.value.status_code == 401 and ei.value.response.json() == ANTHROPIC_401_WRONG


async def test_x_api_key_header_and_bearer_spelling(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await authed(start_gateway, upstream)
    http = gw.http()
    for headers in (
        {"x-api-key": CLIENT_KEY},
        {"X-Api-Key": CLIENT_KEY},
        {"Authorization": f"bearer {CLIENT_KEY}"},
        {"Authorization": f"BEARER   {CLIENT_KEY}"},
        {"Authorization": "Bearer sk-wrong", "x-api-key": CLIENT_KEY},
    ):
        r = await http.post("/v1/sessions/s1/v1/messages", json=MSG, headers=headers)
        assert r.status_code == 200, headers
    for headers in (
        {"Authorization": CLIENT_KEY},
        {"Authorization": f"Basic {CLIENT_KEY}"},
        {"Authorization": "Bearer"},
        {"x-api-key": ""},
        {"api-key": CLIENT_KEY},
    ):
        r = await http.post("/v1/sessions/s1/v1/messages", json=MSG, headers=headers)
        assert r.status_code == 401, headers


async def test_the_client_key_is_never_forwarded_nor_recorded(
    start_gateway: StartGateway, upstream: FakeUpstream, tmp_path: Path
) -> None:
    routes = {**anthropic_routes(upstream), "nokey": {"api_key": None}}
    log_path = tmp_path / "requests.jsonl"
    gw = await start_gateway(auth=AUTH, routes=routes, request_log={"enabled": True, "path": str(log_path)})
    await gw.client("s1").chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    await gw.client("s2").chat.completions.create(model="nokey", messages=MESSAGES)  # type: ignore[arg-type]
    await gw.anthropic("s3").messages.create(model="a", max_tokens=8, messages=MESSAGES)  # type: ignore[arg-type]
    await gw.http().post("/v1/sessions/s3/v1/messages", json=MSG, headers={"x-api-key": CLIENT_KEY})
    creds = [(r.headers.get("authorization"), r.headers.get("x-api-key")) for r in upstream.requests]
    assert creds == [(f"Bearer {ROUTE_KEY}", None), (None, None), (None, ROUTE_KEY), (None, ROUTE_KEY)]
    for r in upstream.requests:
        assert CLIENT_KEY not in str(r.headers) and CLIENT_KEY.encode() not in r.body
    assert [len(await gw.steps(sid)) for sid in ("s1", "s2", "s3")] == [1, 1, 2]
    assert CLIENT_KEY not in gw.db_dump()
    await gw.stop()  # flushes the request log
    log_text = log_path.read_text()
    assert log_text.count("\n") == 4 and CLIENT_KEY not in log_text


async def test_keys_from_an_environment_variable(
    start_gateway: StartGateway, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GW_TEST_KEYS", " k-one , k-two,,")
    gw = await start_gateway(auth={"api_keys": ["k-inline"], "api_keys_env": "GW_TEST_KEYS"})
    assert gw.settings.auth.keys() == ("k-inline", "k-one", "k-two")
    http = gw.http()
    for key, status in (
        ("k-inline", 200),
        ("k-one", 200),
        ("k-two", 200),
        ("k-three", 401),
        ("k-one,k-two", 401),
    ):
        r = await http.post("/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == status, key


def test_auth_config_errors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("GW_TEST_UNSET", raising=False)
    with pytest.raises(ValidationError, match="names GW_TEST_UNSET, which is not set"):
        GatewaySettings.model_validate({"auth": {"api_keys_env": "GW_TEST_UNSET"}})
    monkeypatch.setenv("GW_TEST_EMPTY", " , ")
    with pytest.raises(ValidationError, match="names GW_TEST_EMPTY, which holds no key"):
        GatewaySettings.model_validate({"auth": {"api_keys_env": "GW_TEST_EMPTY"}})
    monkeypatch.setenv("GW_TEST_BAD", "good,sk bad")
    with pytest.raises(ValidationError, match=r"key #2 in \$GW_TEST_BAD is not a valid key") as ei:
        GatewaySettings.model_validate({"auth": {"api_keys_env": "GW_TEST_BAD"}})
    assert "sk bad" not in str(ei.value)
    with pytest.raises(ValidationError, match="must be an environment variable name"):
        GatewaySettings.model_validate({"auth": {"api_keys_env": "MY-KEYS"}})
    with pytest.raises(ValidationError, match="extra"):
        GatewaySettings.model_validate({"auth": {"api_key": "x"}})
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text("auth:\n  api_keys: [good-key, 'sk-SECRET-with space']\n")
    with pytest.raises(ConfigError) as ci:
        load_settings(cfg)
    assert "auth.api_keys[1] is not a valid key" in str(ci.value) and "SECRET" not in str(ci.value)


def test_presented_keys_reads_both_headers() -> None:
    headers = [
        (b"authorization", b"Bearer  k1 "),
        (b"x-api-key", b" k2"),
        (b"authorization", b"Basic k3"),
        (b"x-api-key", b"  "),
        (b"content-type", b"k4"),
    ]
    assert presented_keys(headers) == [b"k1", b"k2"]


def test_keys_are_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every configured key is compared with hmac.compare_digest on equal-length digests, even
    after a match (no early exit)."""
    calls: list[tuple[int, int]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(gateway.auth.hmac, "compare_digest", spy)
    checker = KeyChecker(["first", "a-much-longer-second-key", "third"])
    assert checker.accepts(b"first") is True
    assert calls == [(32, 32)] * 3
    assert checker.accepts(b"fourth") is False
    assert checker.accepts(b"first ") is False
    assert len(calls) == 9
    with pytest.raises(ValueError):
        KeyChecker([])


async def test_a_raw_client_without_sdk_gets_openai_shaped_401(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await authed(start_gateway, upstream)
    async with httpx.AsyncClient(base_url=gw.url) as c:
        r = await c.post(
            "/v1/sessions/s1/chat/completions", json=CHAT, headers={"Authorization": "Bearer nope"}
        )
    assert (r.status_code, r.json()) == (401, OPENAI_401_WRONG)
    assert r.headers["content-type"] == "application/json"
