"""Sessions named by a request header on the sessionless URLs (``/v1/chat/completions``,
``/v1/responses``, ``/v1/messages``), for clients that take one base URL; and the response
headers that name the step a call was recorded as (``x-gateway-step-seq``, ``x-gateway-step-id``)."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest

from gateway.client_headers import session_from_headers
from gateway.errors import GatewayError
from gateway.settings import DEFAULT_SESSION_HEADERS, GatewaySettings
from tests.fake_upstream import FakeUpstream
from tests.gateway.conftest import CLIENT_KEY, MESSAGES, Gateway, StartGateway, anthropic_routes

NAMES = tuple(n.encode() for n in DEFAULT_SESSION_HEADERS)
CHAT = {"model": "m", "messages": MESSAGES}
SEQ, STEP = "x-gateway-step-seq", "x-gateway-step-id"
# (path, body) of each protocol's sessionless endpoint; route ``a`` speaks Anthropic Messages
CALLS: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", CHAT),
    "responses": ("/v1/responses", {"model": "m", "input": "hi"}),
    "messages": ("/v1/messages", {"model": "a", "max_tokens": 8, "messages": MESSAGES}),
}


def _raw(*pairs: tuple[str, str | bytes]) -> list[tuple[bytes, bytes]]:
    return [(k.encode(), v if isinstance(v, bytes) else v.encode()) for k, v in pairs]


# ------------------------------------------------------------------------------ reading the header
def test_the_first_configured_header_present_names_the_session() -> None:
    # the configured order decides, not the order of the request's headers
    got = session_from_headers(_raw(("session-id", "codex-1"), ("x-session-id", "rollout-7")), NAMES)
    assert got == ("rollout-7", "x-session-id")
    assert session_from_headers(_raw(("session-id", "codex-1")), NAMES) == ("codex-1", "session-id")
    assert session_from_headers(_raw(("x-request-id", "per-call")), NAMES) is None  # not a session header
    assert session_from_headers(_raw(("x-session-id", "a"), ("x-session-id", "a")), NAMES) == (
        "a",
        "x-session-id",
    )
    assert session_from_headers(_raw(("x-session-id", "séance".encode())), NAMES) == (
        "séance",
        "x-session-id",
    )
    # a field value's surrounding whitespace is not part of it: the same session as without it
    assert session_from_headers(_raw(("x-session-id", " spaced \t")), NAMES) == ("spaced", "x-session-id")


@pytest.mark.parametrize(
    "value, why",
    [
        (b"", "empty"),
        (b"   ", "empty"),
        (b"x" * 129, "1 to 128 characters"),
        (b"a\x01b", "control or format character"),
        ("\u202eevil".encode(), "control or format character"),
        ("a\u200bb".encode(), "format character"),
        (b"\xff\xfe", "not UTF-8"),
        (b"a/b", "cannot contain '/'"),
        (b"..", "or be '.' or '..'"),
        (b".", "or be '.'"),
    ],
)
def test_a_header_value_that_cannot_name_a_session_is_a_400(value: bytes, why: str) -> None:
    with pytest.raises(GatewayError) as e:
        session_from_headers(_raw(("x-session-id", value)), NAMES)
    assert (e.value.status, e.value.code, e.value.param) == (400, "invalid_session_id", "x-session-id")
    assert why in e.value.message and e.value.message.startswith("header x-session-id")


def test_one_header_with_two_values_is_a_400() -> None:
    with pytest.raises(GatewayError, match="more than once with different values"):
        session_from_headers(_raw(("x-session-id", "a"), ("x-session-id", "b")), NAMES)


def test_session_headers_setting() -> None:
    assert GatewaySettings().session_headers == list(DEFAULT_SESSION_HEADERS)
    assert GatewaySettings.model_validate({"session_headers": [" X-Run-Id "]}).session_headers == ["x-run-id"]
    cases: list[tuple[list[str], str]] = [
        (["Authorization"], "credential"),
        (["x-api-key"], "credential"),
        (["a b"], "header name"),
        (["x-a", "X-A"], "twice"),
    ]
    for bad, why in cases:
        with pytest.raises(pydantic.ValidationError, match=why):
            GatewaySettings.model_validate({"session_headers": bad})


# ------------------------------------------------------------------------------ over HTTP
@pytest.fixture
async def agw(start_gateway: StartGateway, upstream: FakeUpstream) -> Gateway:
    return await start_gateway(routes=anthropic_routes(upstream))


@pytest.mark.parametrize("proto", sorted(CALLS))
@pytest.mark.parametrize("stream", [False, True])
async def test_each_header_session_is_its_own_session_and_answers_name_their_step(
    agw: Gateway, upstream: FakeUpstream, proto: str, stream: bool
) -> None:
    path, body = CALLS[proto]
    http = agw.http()
    seen = []
    for sid in ("sample-1", "sample-2", "sample-1"):
        async with http.stream(
            "POST", path, json={**body, "stream": stream}, headers={"X-Session-ID": sid}
        ) as r:
            # the step is reserved before the upstream is called: its headers lead even a stream
            seen.append((r.status_code, r.headers.get(SEQ), r.headers.get(STEP)))
            await r.aread()
    assert seen == [(200, "1", "1"), (200, "1", "1"), (200, "2", "2")]
    one, two = await agw.wait_steps("sample-1", 2), await agw.wait_steps("sample-2", 1)
    assert [(s.seq, s.step_id, s.is_stream) for s in one] == [(1, 1, stream), (2, 2, stream)]
    assert len(two) == 1
    assert all((s.meta_json or {}).get("session_header") == "x-session-id" for s in [*one, *two])
    assert [r.headers["x-session-id"] for r in upstream.requests] == ["sample-1", "sample-2", "sample-1"]


async def test_the_path_session_wins_over_a_header(agw: Gateway) -> None:
    r = await agw.http().post(
        "/v1/sessions/from-path/chat/completions",
        json=CHAT,
        headers={"X-Session-ID": "from-header", "x-claude-code-session-id": "cc"},
    )
    assert r.status_code == 200 and (r.headers[SEQ], r.headers[STEP]) == ("1", "1")
    (step,) = await agw.wait_steps("from-path", 1)
    assert "session_header" not in (step.meta_json or {})
    assert (step.meta_json or {})["client_headers"] == {"x-claude-code-session-id": "cc"}
    assert (await agw.http().get("/v1/sessions/from-header")).status_code == 404


async def test_a_sessionless_call_without_a_header_is_forwarded_unrecorded(
    agw: Gateway, upstream: FakeUpstream
) -> None:
    r = await agw.http().post("/v1/chat/completions", json=CHAT, headers={"x-request-id": "per-call"})
    assert r.status_code == 200 and SEQ not in r.headers and STEP not in r.headers
    assert len(upstream.requests) == 1 and "x-session-id" not in upstream.requests[0].headers
    assert agw.sql("SELECT COUNT(*) AS n FROM session_steps")[0]["n"] == 0


@pytest.mark.parametrize("proto", ["chat", "messages"])
async def test_require_session_refuses_a_call_that_names_no_session(
    start_gateway: StartGateway, upstream: FakeUpstream, proto: str
) -> None:
    gw = await start_gateway(routes=anthropic_routes(upstream), require_session=True)
    path, body = CALLS[proto]
    r = await gw.http().post(path, json=body)
    assert r.status_code == 400
    if proto == "messages":  # in the API's own error shape
        assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
        assert "x-session-id" in r.json()["error"]["message"]
    else:
        assert r.json()["error"]["code"] == "session_required"
    assert upstream.requests == []
    ok = await gw.http().post(path, json=body, headers={"x-session-id": "s"})
    assert ok.status_code == 200 and ok.headers[SEQ] == "1"


@pytest.mark.parametrize("proto", ["chat", "messages"])
async def test_a_bad_header_value_is_a_400_in_the_apis_shape(
    agw: Gateway, upstream: FakeUpstream, proto: str
) -> None:
    path, body = CALLS[proto]
    r = await agw.http().post(path, json=body, headers={"x-session-id": "x" * 200})
    assert r.status_code == 400
    err = r.json()["error"]
    if proto == "messages":
        assert r.json()["type"] == "error" and "128 characters" in err["message"]
    else:
        assert (err["code"], err["param"]) == ("invalid_session_id", "x-session-id")
    assert upstream.requests == []


async def test_no_session_headers_configured_means_passthrough(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(session_headers=[])
    r = await gw.http().post("/v1/chat/completions", json=CHAT, headers={"x-session-id": "s"})
    assert r.status_code == 200 and SEQ not in r.headers
    assert gw.sql("SELECT COUNT(*) AS n FROM session_steps")[0]["n"] == 0


# ------------------------------------------------------------------------------ the same rules as a path session
async def test_a_header_cannot_take_a_call_into_another_routes_session(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(routes={"m": {}, "other": {}})
    await gw.register("launched")  # a launcher's session, bound to route m
    http = gw.http()
    r = await http.post(
        "/v1/chat/completions", json={**CHAT, "model": "other"}, headers={"x-session-id": "launched"}
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "session_route_mismatch"
    assert upstream.requests == [] and await gw.steps("launched") == []
    # a session bound by its first call (route m) is refused to route other just the same
    assert (
        await http.post("/v1/chat/completions", json=CHAT, headers={"x-session-id": "free"})
    ).status_code == 200
    r = await http.post(
        "/v1/chat/completions", json={**CHAT, "model": "other"}, headers={"x-session-id": "free"}
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "session_route_mismatch"
    status = (await http.get("/v1/sessions/free")).json()
    assert status["step_counts"] == {"m": 1} and status["rejected_calls"] == {"session_route_mismatch": 1}


async def test_header_and_path_calls_share_one_budget(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(max_steps=2)
    http = gw.http()
    assert (await http.post("/v1/chat/completions", json=CHAT, headers={"x-session-id": "b"})).headers[
        SEQ
    ] == "1"
    assert (await http.post("/v1/sessions/b/chat/completions", json=CHAT)).headers[SEQ] == "2"
    stop = await http.post("/v1/chat/completions", json=CHAT, headers={"x-session-id": "b"})
    assert stop.status_code == 200 and stop.headers["x-gateway-stop-reason"] == "max_steps"
    assert SEQ not in stop.headers  # a synthetic stop is no step
    assert len(upstream.requests) == 2 and len(await gw.wait_steps("b", 2)) == 2
    assert (await http.get("/v1/sessions/b")).json()["rejected_calls"] == {"max_steps": 1}


async def test_a_header_session_needs_the_key_and_a_closed_one_stays_closed(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(auth={"api_keys": [CLIENT_KEY]})
    anon = gw.http()
    r = await anon.post("/v1/chat/completions", json=CHAT, headers={"x-session-id": "k"})
    assert r.status_code == 401 and upstream.requests == []
    keyed = gw.http(headers={"Authorization": f"Bearer {CLIENT_KEY}"})
    assert (await keyed.get("/v1/sessions/k")).status_code == 404  # the refused call created nothing
    assert (
        await keyed.post("/v1/chat/completions", json=CHAT, headers={"x-session-id": "k"})
    ).status_code == 200
    assert (await keyed.post("/v1/sessions/k/close", json={"reason": "done"})).status_code == 200
    r = await keyed.post("/v1/chat/completions", json=CHAT, headers={"x-session-id": "k"})
    assert r.status_code == 409 and r.json()["error"]["code"] == "session_closed"
    assert len(upstream.requests) == 1


async def test_a_retry_answered_from_its_first_call_names_the_same_step(
    agw: Gateway, upstream: FakeUpstream
) -> None:
    headers: dict[str, Any] = {"x-session-id": "r", "Idempotency-Key": "call-1"}
    first = await agw.http().post("/v1/chat/completions", json=CHAT, headers=headers)
    again = await agw.http().post("/v1/chat/completions", json=CHAT, headers=headers)
    assert again.headers["x-gateway-replayed"] == "true" and again.content == first.content
    assert (
        (again.headers[SEQ], again.headers[STEP]) == (first.headers[SEQ], first.headers[STEP]) == ("1", "1")
    )
    assert len(upstream.requests) == 1
