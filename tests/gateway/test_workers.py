"""A route with a pool of upstream workers (``base_urls``): each session sticks to one worker
(rendezvous hashing of its id), a worker that refuses connections or fails its health check is
taken out and its sessions move, and come back once it is healthy; workers are added and removed
at run time (admin endpoints) without dropping the calls in flight. Real gateway, two or three
scripted fake upstreams, the real openai SDK."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.settings import GatewaySettings
from gateway.workers import WorkerPool
from tests.fake_upstream import FakeRequest, FakeUpstream, Reply, chat_completion
from tests.gateway.conftest import CLIENT_KEY, MESSAGES, Gateway, eventually, make_settings, serve

SIDS = [f"sess-{i}" for i in range(24)]


# ------------------------------------------------------------------------------ the pool itself
def test_rendezvous_moves_only_the_sessions_of_the_worker_that_changed() -> None:
    urls = [f"http://10.0.0.{i}:8000/v1" for i in range(1, 5)]
    sids = [f"s{i}" for i in range(2000)]
    pool = WorkerPool("m", urls)
    before = {s: pool.pick(s).base_url for s in sids}
    assert {s: pool.pick(s).base_url for s in sids} == before  # sticky
    assert all(300 < list(before.values()).count(u) < 700 for u in urls)  # about a quarter each

    pool.set_health(urls[1], False, "down")
    out = {s: pool.pick(s).base_url for s in sids}
    assert all(out[s] == before[s] for s in sids if before[s] != urls[1])  # the others stay
    assert urls[1] not in out.values()
    pool.set_health(urls[1], True)
    assert {s: pool.pick(s).base_url for s in sids} == before  # back where they were

    new = "http://10.0.0.9:8000/v1"
    pool.add(new)
    after = {s: pool.pick(s).base_url for s in sids}
    moved = [s for s in sids if after[s] != before[s]]
    assert all(after[s] == new for s in moved)  # only to the new worker
    assert 200 < len(moved) < 600  # about a fifth
    pool.remove(new)
    assert {s: pool.pick(s).base_url for s in sids} == before


def test_pool_edges() -> None:
    pool = WorkerPool("m", ["http://a/v1", "http://b/v1"])
    assert [pool.pick(None).base_url for _ in range(4)] == ["http://a/v1", "http://b/v1"] * 2  # round-robin
    pool.set_health("http://a/v1", False, "x")
    pool.set_health("http://b/v1", False, "y")
    assert pool.pick("s1").base_url in ("http://a/v1", "http://b/v1")  # none healthy: still a worker
    assert pool.workers["http://b/v1"].last_error == "y"
    with pytest.raises(KeyError):
        pool.remove("http://c/v1")
    pool.remove("http://a/v1")
    with pytest.raises(ValueError, match="last worker"):
        pool.remove("http://b/v1")
    assert not pool.add("http://b/v1")


def test_pool_config() -> None:
    def route(**r: Any) -> GatewaySettings:
        return GatewaySettings.model_validate({"llm_routes": {"m": r}})

    s = route(base_urls=["http://a:1/v1/", "http://b:1/v1"])
    assert (s.llm_routes["m"].base_url, s.llm_routes["m"].workers) == (
        "http://a:1/v1",
        ["http://a:1/v1", "http://b:1/v1"],
    )
    with pytest.raises(ValueError, match="not both"):
        route(base_url="http://a:1/v1", base_urls=["http://b:1/v1"])
    assert route(base_url="http://a:1/v1", base_urls=["http://a:1/v1", "http://b:1/v1"]) == s
    with pytest.raises(ValueError, match="twice"):
        route(base_urls=["http://a:1/v1", "http://a:1/v1/"])
    with pytest.raises(ValueError, match="placeholder"):
        route(base_urls=["http://a:1/s/{session_id}/v1"])
    with pytest.raises(ValueError, match="http"):
        route(base_urls=["a:1/v1"])


# ------------------------------------------------------------------------------ through the gateway
@pytest.fixture
async def fakes() -> AsyncIterator[list[FakeUpstream]]:
    ups = [FakeUpstream(), FakeUpstream(), FakeUpstream()]
    for u in ups:
        await u.start()
    yield ups
    for u in ups:
        await u.stop()


async def _gateway(ups: list[FakeUpstream], db_url: str, **route: Any) -> Gateway:
    fields = {
        "base_urls": [u.base_url for u in ups],
        "health_check_interval_s": 3600,
        "retry": {"max_attempts": 3, "backoff_s": 30},
        **route,
    }  # a backoff would show
    overrides: dict[str, Any] = {"routes": {"m": fields}}
    if "auth" in route:
        overrides["auth"] = fields.pop("auth")
    settings = make_settings(ups[0], db_url, **overrides)  # its base_url is the pool's first worker
    assert (
        GatewaySettings.model_validate(settings.model_dump()) == settings
    )  # a dumped pool config loads again
    return await serve(settings)


def _served_by(ups: list[FakeUpstream]) -> dict[str, list[int]]:
    """session id -> the index of the fake that got each of its calls, in order of arrival."""
    out: dict[str, list[tuple[int, int]]] = {}
    for i, u in enumerate(ups):
        for n, r in enumerate(u.requests):
            if r.path.endswith("/chat/completions"):
                out.setdefault(r.headers["x-session-id"], []).append((n, i))
    return {sid: [i for _, i in sorted(v)] for sid, v in out.items()}


async def _call_all(g: Gateway, sids: list[str]) -> None:
    """One call of each session, in order (one raw HTTP client: the SDK's client per session costs
    more than the call)."""
    http = g.http(headers={"authorization": f"Bearer {CLIENT_KEY}"})  # a key, for a gateway with auth
    for sid in sids:
        r = await http.post(f"/v1/sessions/{sid}/chat/completions", json={"model": "m", "messages": MESSAGES})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]


async def test_sessions_stick_move_when_a_worker_is_down_and_come_back(
    fakes: list[FakeUpstream], db_url: str
) -> None:
    g = await _gateway(fakes, db_url)
    try:
        await _call_all(g, SIDS)
        await _call_all(g, SIDS)
        first = {sid: calls[0] for sid, calls in _served_by(fakes).items()}
        assert all(calls == [calls[0]] * 2 for calls in _served_by(fakes).values())  # sticky
        assert set(first) == set(SIDS) and set(first.values()) == {0, 1, 2}  # all three used
        steps = await g.steps(SIDS[0])
        assert [(s.meta_json or {})["upstream_worker"] for s in steps] == [fakes[first[SIDS[0]]].base_url] * 2

        on_b = [s for s in SIDS if first[s] == 1]
        await fakes[1].stop()  # refuses connections from now on
        for u in fakes:
            u.requests.clear()
        await _call_all(g, SIDS)
        moved = _served_by(fakes)
        assert all(moved[s] == [first[s]] for s in SIDS if s not in on_b)  # the others stay
        assert all(moved[s][0] in (0, 2) for s in on_b)  # b's sessions moved, every call answered
        view = (await g.http().get("/admin/routes/m/workers")).json()
        b = next(w for w in view["workers"] if w["base_url"] == fakes[1].base_url)
        assert not b["healthy"] and "connect failed" in b["last_error"]
        health = {
            w.base_url: await g.metric("gateway_upstream_worker_healthy", route="m", worker=w.base_url)
            for w in fakes
        }
        assert health == {fakes[0].base_url: 1.0, fakes[1].base_url: 0.0, fakes[2].base_url: 1.0}
        [*_, last] = await g.steps(on_b[0])
        assert last.status == "ok" and (last.meta_json or {})["upstream_worker"] != fakes[1].base_url
        attempts = (last.meta_json or {})[
            "attempts"
        ]  # refused by b, then answered by its next worker at once
        assert [(a["status"], a.get("wait_s")) for a in attempts] == [(None, 0.0), (200, None)]

        await fakes[1].start()  # back on the same port
        await g.app_state.upstream.check_workers()
        for u in fakes:
            u.requests.clear()
        await _call_all(g, SIDS)
        assert {s: c[0] for s, c in _served_by(fakes).items()} == first  # everyone home again
        assert all(r.headers["x-session-id"] in on_b for r in fakes[1].requests)
    finally:
        await g.stop()


async def test_a_failing_health_check_takes_a_worker_out(fakes: list[FakeUpstream], db_url: str) -> None:
    ups = fakes[:2]
    sick = {"on": False}

    def health(req: FakeRequest) -> Reply | None:
        if req.method == "GET" and req.path == "/v1/models" and sick["on"]:
            return Reply.json({"error": "loading"}, status=503)
        return None

    ups[1].add_rule(health)
    g = await _gateway(ups, db_url, health_check_interval_s=0.5)
    # a check times out after its interval: 0.5 s leaves a loaded machine room to answer it
    try:

        async def healthy() -> list[bool]:
            view = (await g.http().get("/admin/routes/m/workers")).json()
            return [w["healthy"] for w in view["workers"]]

        sick["on"] = True
        await eventually(lambda: _is(healthy(), [True, False]), timeout=30)
        await _call_all(g, SIDS[:8])
        assert {c[0] for c in _served_by(ups).values()} == {0}  # no call to the sick worker
        view = (await g.http().get("/admin/routes/m/workers")).json()
        assert "health check: answered HTTP 503" in view["workers"][1]["last_error"]
        sick["on"] = False
        await eventually(lambda: _is(healthy(), [True, True]), timeout=30)
        for u in ups:
            u.requests.clear()
        await _call_all(g, SIDS)
        assert {c[0] for c in _served_by(ups).values()} == {0, 1}
    finally:
        await g.stop()


async def _is(got: Any, want: list[bool]) -> bool:
    return bool(await got == want)


async def test_workers_added_and_removed_at_run_time_without_dropping_calls(
    fakes: list[FakeUpstream], db_url: str
) -> None:
    a, b = fakes[0], fakes[1]
    g = await _gateway([a], db_url, auth={"api_keys": [CLIENT_KEY], "admin_api_keys": ["sk-admin-key"]})
    admin = g.http(headers={"authorization": "Bearer sk-admin-key"})
    try:
        assert (await g.http().get("/admin/routes/m/workers")).status_code == 401  # the gateway's admin keys
        client = g.http(headers={"authorization": f"Bearer {CLIENT_KEY}"})
        assert (await client.get("/admin/routes/m/workers")).status_code == 403
        release = asyncio.Event()

        async def held(_req: FakeRequest) -> Reply:
            await release.wait()
            return Reply.json(chat_completion("slow answer"))

        a.script("/v1/chat/completions", [held])
        call = asyncio.ensure_future(g.client("x").chat.completions.create(model="m", messages=MESSAGES))  # type: ignore[arg-type]
        await eventually(lambda: any(r.method == "POST" for r in a.requests))  # not just a health check
        r = await admin.post("/admin/routes/m/workers", json={"base_url": b.base_url + "/"})
        assert r.status_code == 200
        assert [(w["base_url"], w["healthy"], w["in_flight"]) for w in r.json()["workers"]] == [
            (a.base_url, True, 1),
            (b.base_url, True, 0),
        ]
        r = await admin.delete("/admin/routes/m/workers", params={"base_url": a.base_url})
        assert [w["base_url"] for w in r.json()["workers"]] == [b.base_url]
        release.set()
        out = await call  # the call in flight on the removed worker finishes there
        assert out.choices[0].message.content == "slow answer"
        await _call_all(g, ["x", "y"])
        assert [r.headers["x-session-id"] for r in b.requests if r.method == "POST"] == ["x", "y"]
        steps = await g.steps("x")
        assert [(s.status, (s.meta_json or {})["upstream_worker"]) for s in steps] == [
            ("ok", a.base_url),
            ("ok", b.base_url),
        ]

        r = await admin.delete("/admin/routes/m/workers", params={"base_url": b.base_url})
        assert (r.status_code, r.json()["error"]["code"]) == (409, "last_worker")
        r = await admin.delete("/admin/routes/m/workers", params={"base_url": "http://127.0.0.1:9/v1"})
        assert (r.status_code, r.json()["error"]["code"]) == (404, "worker_not_found")
        r = await admin.post("/admin/routes/nope/workers", json={"base_url": b.base_url})
        assert (r.status_code, r.json()["error"]["code"]) == (404, "route_not_found")
        r = await admin.post("/admin/routes/m/workers", json={"base_url": "ftp://x"})
        assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_worker")
        r = await admin.post("/admin/routes/m/workers", json={"url": b.base_url})
        assert r.status_code == 400
    finally:
        await g.stop()


async def test_readyz_of_a_pool_needs_one_worker_up(fakes: list[FakeUpstream], db_url: str) -> None:
    g = await _gateway(fakes[:2], db_url)
    try:
        await fakes[0].stop()
        r = await g.http().get("/readyz", params={"route": "m"})
        assert r.status_code == 200 and r.json()["status"] == "ready"
        await fakes[1].stop()
        r = await g.http().get("/readyz", params={"route": "m"})
        assert r.status_code == 503
        why = r.json()["error"]
        assert why.startswith("no worker of route m answers: ")
        assert fakes[0].base_url in why and fakes[1].base_url in why
    finally:
        await g.stop()
        for u in fakes[:2]:
            await u.start()  # the fixture stops them again
