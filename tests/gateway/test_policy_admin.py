"""The trainer's weight-sync hook: ``POST /admin/policy_version`` stamps every step admitted after it;
``POST /admin/pause`` holds new model calls and answers once the calls in flight have ended;
``POST /admin/resume`` lets them go. Ordering is driven by events, never by sleeps."""

from __future__ import annotations

import asyncio
from typing import Any

from store import Store
from tests.fake_upstream import DONE, FakeRequest, FakeUpstream, Reply, chat_chunk, chat_completion
from tests.gateway.conftest import CLIENT_KEY, MESSAGES, Gateway, StartGateway, eventually

CHAT = {"model": "m", "messages": MESSAGES}
UP_PATH = "/v1/chat/completions"
JSON = {"content-type": "application/json"}


def held(release: asyncio.Event, text: str) -> Any:
    async def reply(_req: FakeRequest) -> Reply:
        await release.wait()
        return Reply.json(chat_completion(text))

    return reply


async def chat(gw: Gateway, sid: str) -> Any:
    r = await gw.http().post(f"/v1/sessions/{sid}/chat/completions", json=CHAT)
    assert r.status_code == 200, r.text
    return r.json()


async def test_version_stamped_on_steps_that_start_after_it(gw: Gateway, upstream: FakeUpstream) -> None:
    http = gw.http()
    assert (await http.get("/admin/policy_version")).json() == {
        "policy_version": None,
        "paused": False,
        "in_flight": 0,
        "waiting": 0,
    }
    await chat(gw, "s1")  # before any version: unknown
    r = await http.post("/admin/policy_version", json={"version": 3})
    assert r.json() == {"policy_version": 3, "paused": False, "in_flight": 0, "waiting": 0, "previous": None}
    # a call in flight while the version changes keeps the version it started with
    release = asyncio.Event()
    upstream.script(UP_PATH, [held(release, "slow")])
    slow = asyncio.ensure_future(chat(gw, "s1"))
    await upstream.wait_for_requests(2)
    assert (await http.post("/admin/policy_version", json={"version": 4})).json()["previous"] == 3
    await chat(gw, "s2")
    release.set()
    assert (await slow)["choices"][0]["message"]["content"] == "slow"
    await chat(gw, "s1")
    steps = await gw.wait_steps("s1", 3)
    assert [s.policy_version for s in steps] == [None, 3, 4]
    assert [s.policy_version for s in await gw.steps("s2")] == [4]
    status = (await http.get("/v1/sessions/s1")).json()
    assert (status["policy_versions"], status["spans_policy_versions"]) == ([None, 3, 4], True)
    closed = (await http.post("/v1/sessions/s2/close")).json()
    assert (closed["policy_versions"], closed["spans_policy_versions"]) == ([4], False)
    store = Store(gw.db_url)
    try:
        await store.init()
        assert await store.policy_versions("s1") == [None, 3, 4]
        assert await store.policy_versions("nope") == []
    finally:
        await store.close()


def admin_error(r: Any) -> tuple[int, str | None, str]:
    """(status, param, message) of an admin error answer, checked to be in OpenAI's error shape."""
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error", r.text
    assert err["code"] == "invalid_request" and "validation error" not in err["message"], (
        r.text
    )  # no raw pydantic text
    return r.status_code, err["param"], err["message"]


async def test_bad_admin_bodies_are_400(gw: Gateway) -> None:
    http = gw.http()
    for body in ({"version": "3"}, {"version": -1}, {"version": 2**63}, {"version": 1.5}, {"v": 1}, {}):
        r = await http.post("/admin/policy_version", json=body)
        status, param, _ = admin_error(r)
        assert (status, param) == (400, "version"), body
    status, param, message = admin_error(await http.post("/admin/policy_version", json={"version": "3"}))
    assert (
        message
        == "invalid /admin/policy_version body: field 'version': Input should be a valid integer (got '3')"
    )
    _, _, message = admin_error(await http.post("/admin/policy_version", json={"v": 1}))
    assert message == "invalid /admin/policy_version body: field 'version' is required; also: 'v' (unknown)"
    _, param, message = admin_error(await http.post("/admin/policy_version", content=b"{nope", headers=JSON))
    assert param is None and message.startswith("invalid /admin/policy_version body: not valid JSON (")
    assert admin_error(await http.post("/admin/pause", json={"timeout_s": -1})) == (
        400,
        "timeout_s",
        "invalid /admin/pause body: field 'timeout_s': Input should be greater than or equal to 0 (got -1)",
    )
    for bad in ("5", True, 86401, None):  # a number of seconds, not a string, a boolean or null
        status, param, _ = admin_error(await http.post("/admin/pause", json={"timeout_s": bad}))
        assert (status, param) == (400, "timeout_s"), bad
    _, param, message = admin_error(
        await http.post("/admin/pause", content=b'{"timeout_s": Infinity}', headers=JSON)
    )
    assert (param, message) == (
        "timeout_s",
        "invalid /admin/pause body: field 'timeout_s': Input should be a finite number (got inf)",
    )
    assert admin_error(await http.post("/admin/pause", json={"timeout": 5})) == (
        400,
        "timeout",
        "invalid /admin/pause body: unknown field 'timeout' (known: timeout_s)",
    )
    state = (await http.get("/admin/policy_version")).json()
    assert (state["policy_version"], state["paused"]) == (None, False)  # nothing was set or held


async def test_resume_takes_no_body_but_an_empty_one(gw: Gateway) -> None:
    http = gw.http()
    assert (await http.post("/admin/pause", json={"timeout_s": 0})).json()["paused"] is True
    assert admin_error(await http.post("/admin/resume", json={"now": True})) == (
        400,
        "now",
        "invalid /admin/resume body: unknown field 'now' (known: none)",
    )
    _, param, message = admin_error(await http.post("/admin/resume", content=b"resume please", headers=JSON))
    assert param is None and message.startswith("invalid /admin/resume body: not valid JSON (")
    assert (await http.get("/admin/policy_version")).json()[
        "paused"
    ] is True  # a refused resume resumed nothing
    r = await http.post("/admin/resume", json={})
    assert r.status_code == 200 and r.json()["paused"] is False
    await http.post("/admin/pause", json={"timeout_s": 0})
    r = await http.post("/admin/resume")
    assert r.status_code == 200 and r.json() == {"policy_version": None, "paused": False, "released": 0}


async def test_pause_drains_in_flight_and_holds_new_calls(gw: Gateway, upstream: FakeUpstream) -> None:
    http = gw.http()
    release = asyncio.Event()
    upstream.script(UP_PATH, [held(release, "in flight")])
    first = asyncio.ensure_future(chat(gw, "s1"))
    await upstream.wait_for_requests(1)
    pausing = asyncio.ensure_future(http.post("/admin/pause"))
    await eventually(lambda: gw.app_state.policy.paused)
    # a new call while paused waits before it reserves a step: the upstream never sees it
    second = asyncio.ensure_future(chat(gw, "s2"))
    await eventually(lambda: gw.app_state.policy.waiting == 1)
    assert not pausing.done()  # the call in flight is not finished
    assert len(upstream.requests) == 1
    release.set()
    r = await pausing
    assert r.json() == {"policy_version": None, "paused": True, "in_flight": 0, "waiting": 1, "drained": True}
    assert (await first)["choices"][0]["message"]["content"] == "in flight"
    assert not second.done() and len(upstream.requests) == 1
    assert gw.sql("SELECT count(*) AS n FROM session_steps WHERE session_id='s2'")[0]["n"] == 0
    await http.post("/admin/policy_version", json={"version": 7})  # the weight sync
    r = await http.post("/admin/resume")
    assert r.json() == {"policy_version": 7, "paused": False, "released": 1}
    await second
    assert [s.policy_version for s in await gw.wait_steps("s2", 1)] == [7]
    assert [s.policy_version for s in await gw.steps("s1")] == [None]


async def test_pause_times_out_when_a_call_does_not_end(gw: Gateway, upstream: FakeUpstream) -> None:
    release = asyncio.Event()
    upstream.script(UP_PATH, [held(release, "x")])
    first = asyncio.ensure_future(chat(gw, "s1"))
    await upstream.wait_for_requests(1)
    r = await gw.http().post("/admin/pause", json={"timeout_s": 0})
    assert (r.json()["drained"], r.json()["in_flight"]) == (False, 1)
    release.set()
    await first
    await gw.http().post("/admin/resume")
    assert (await chat(gw, "s1"))["choices"][0]["message"]["content"] == "hello from fake"


async def test_a_client_that_leaves_while_paused_uses_nothing(gw: Gateway, upstream: FakeUpstream) -> None:
    await gw.http().post("/admin/pause")
    waiter = asyncio.ensure_future(chat(gw, "s1"))
    await eventually(lambda: gw.app_state.policy.waiting == 1)
    waiter.cancel()
    await eventually(lambda: gw.app_state.policy.waiting == 0)
    await gw.http().post("/admin/resume")
    assert gw.app_state.policy.in_flight == 0
    assert len(upstream.requests) == 0
    assert gw.sql("SELECT count(*) AS n FROM session_steps")[0]["n"] == 0
    await chat(gw, "s1")
    assert [s.seq for s in await gw.wait_steps("s1", 1)] == [1]


async def test_admin_routes_need_an_admin_key(start_gateway: StartGateway) -> None:
    gw = await start_gateway(auth={"api_keys": [CLIENT_KEY], "admin_api_keys": ["sk-admin"]})
    http = gw.http()
    for method, path in (
        ("GET", "/admin/policy_version"),
        ("POST", "/admin/policy_version"),
        ("POST", "/admin/pause"),
        ("POST", "/admin/resume"),
    ):
        r = await http.request(method, path, json={"version": 1})
        assert (r.status_code, r.json()["error"]["code"]) == (401, "invalid_api_key")
        r = await http.request(
            method, path, json={"version": 1}, headers={"Authorization": f"Bearer {CLIENT_KEY}"}
        )
        assert (r.status_code, r.json()["error"]["code"]) == (403, "admin_key_required")
    r = await http.post(
        "/admin/policy_version", json={"version": 1}, headers={"Authorization": "Bearer sk-admin"}
    )
    assert r.json()["policy_version"] == 1


async def test_pause_waits_for_a_stream_in_flight(gw: Gateway, upstream: FakeUpstream) -> None:
    release = asyncio.Event()

    async def stream(_req: FakeRequest) -> Reply:
        await release.wait()
        return Reply.sse([chat_chunk("one", role="assistant"), chat_chunk(finish_reason="stop"), DONE])

    upstream.script(UP_PATH, [stream])
    reader = asyncio.ensure_future(
        gw.http().post("/v1/sessions/s1/chat/completions", json={**CHAT, "stream": True})
    )
    await upstream.wait_for_requests(1)
    pausing = asyncio.ensure_future(gw.http().post("/admin/pause"))
    await eventually(lambda: gw.app_state.policy.paused)
    assert not pausing.done() and gw.app_state.policy.in_flight == 1
    release.set()
    assert (await pausing).json()["drained"] is True
    assert b'"one"' in (await reader).content
    assert [s.status for s in await gw.wait_steps("s1", 1)] == ["ok"]
    await gw.http().post("/admin/resume")
