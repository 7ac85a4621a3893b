"""Requests a web page could make are refused (gateway.csrf): with auth off, a cross-site simple
request (``text/plain`` body, or no body, no CORS preflight) must not pause the gateway, set a
policy version, add a worker, close a session or make a model call. Control endpoints take JSON
bodies only (415); a browser's request (``Origin`` / ``Sec-Fetch-Site``) is a 403. Real gateway."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.fake_upstream import DEFAULT_TEXT, FakeUpstream
from tests.gateway.conftest import MESSAGES, Gateway, StartGateway, anthropic_routes

CHAT = {"model": "m", "messages": MESSAGES}
PAUSE = b'{"timeout_s": 0}'

# what a page on another site can send without a preflight: the three "simple" content types
SIMPLE_TYPES = [
    "text/plain",
    "text/plain;charset=UTF-8",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
]


def _state(gw: Gateway) -> tuple[bool, int | None]:
    policy = gw.app_state.policy
    return policy.paused, policy.version


@pytest.mark.parametrize("content_type", SIMPLE_TYPES)
async def test_a_simple_request_with_a_body_changes_nothing(
    gw: Gateway, upstream: FakeUpstream, content_type: str
) -> None:
    http = gw.http()
    headers = {"content-type": content_type}
    await gw.client("s1").chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    answers = [
        await http.post("/admin/pause", content=PAUSE, headers=headers),
        await http.post("/admin/policy_version", content=b'{"version": 7}', headers=headers),
        await http.post("/admin/resume", content=b"{}", headers=headers),
        await http.post(
            "/admin/routes/m/workers", content=b'{"base_url": "http://127.0.0.1:9/v1"}', headers=headers
        ),
        await http.post("/v1/sessions/s1/close", content=b'{"reason": "x"}', headers=headers),
        await http.post(
            "/v1/sessions/s1/chat/completions",
            content=httpx.Request("POST", "http://x", json=CHAT).content,
            headers=headers,
        ),
    ]
    for r in answers:
        assert r.status_code == 415, r.request.url
        err = r.json()["error"]
        assert (err["code"], err["type"]) == ("unsupported_media_type", "invalid_request_error")
        assert "application/json" in err["message"]
    assert _state(gw) == (False, None)
    assert len(gw.app_state.upstream.pools["m"].workers) == 1
    assert (await http.get("/v1/sessions/s1")).json()["status"] == "active"
    assert len(upstream.requests) == 1 and len(await gw.steps("s1")) == 1
    assert await gw.metric("gateway_error_responses_total", status="415", code="unsupported_media_type") == 6


@pytest.mark.parametrize(
    "browser",
    [
        {"origin": "https://evil.example"},
        {"origin": "null"},
        {"sec-fetch-site": "cross-site"},
        {"sec-fetch-site": "same-site"},
    ],
)
async def test_a_request_from_a_web_page_is_refused(
    gw: Gateway, upstream: FakeUpstream, browser: dict[str, str]
) -> None:
    """Even without a body (a ``fetch(url, {method: "POST", mode: "no-cors"})``), and even with a
    JSON body: a browser marks the requests it makes for a page."""
    http = gw.http(headers=browser)
    answers = [
        await http.post("/admin/pause"),
        await http.post("/admin/pause", json={"timeout_s": 0}),
        await http.post("/admin/policy_version", json={"version": 7}),
        await http.delete("/admin/routes/m/workers", params={"base_url": "http://127.0.0.1:9/v1"}),
        await http.post("/v1/sessions/s1/close"),
        await http.post("/v1/sessions/s1/chat/completions", json=CHAT),
        await http.post("/v1/chat/completions", json=CHAT),
    ]
    for r in answers:
        assert (r.status_code, r.json()["error"]["code"]) == (403, "cross_site_request"), r.request.url
    assert _state(gw) == (False, None)
    assert upstream.requests == [] and await gw.steps("s1") == []
    assert (await http.get("/healthz")).status_code == 200  # reads stay open


async def test_anthropic_paths_answer_in_anthropic_shape(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(routes=anthropic_routes(upstream))
    body = b'{"model": "a", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}'
    r = await gw.http().post(
        "/v1/sessions/s1/v1/messages", content=body, headers={"content-type": "text/plain"}
    )
    assert r.status_code == 415
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
    assert upstream.requests == []


async def test_control_bodies_need_a_content_type_and_json_ones_pass(gw: Gateway) -> None:
    http = gw.http()
    r = await http.post("/admin/pause", content=PAUSE)  # a body, no Content-Type
    assert (r.status_code, r.json()["error"]["code"]) == (415, "unsupported_media_type")
    assert _state(gw)[0] is False
    ok: list[tuple[str, dict[str, Any] | None]] = [
        ("/admin/policy_version", {"version": 2}),
        ("/admin/pause", {"timeout_s": 0}),
    ]
    for path, body in ok:
        assert (await http.post(path, json=body)).status_code == 200
    assert _state(gw) == (True, 2)
    r = await http.post("/admin/resume")  # no body at all (curl -X POST): still a command line's call
    assert r.status_code == 200 and _state(gw)[0] is False
    r = await http.post(
        "/admin/resume", content=b"{}", headers={"content-type": "Application/JSON; charset=utf-8"}
    )
    assert r.status_code == 200
    # model calls: a body without a Content-Type is still read as JSON (raw clients)
    r = await http.post(
        "/v1/sessions/s2/chat/completions", content=httpx.Request("POST", "http://x", json=CHAT).content
    )
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == DEFAULT_TEXT
