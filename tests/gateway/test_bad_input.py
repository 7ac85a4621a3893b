"""Input a fresh-user trial broke the gateway with: each is a clear 4xx before any budget is
used, or is recorded exactly, and never fails another session's call."""

from __future__ import annotations

import asyncio
import json
import sqlite3

from tests.fake_upstream import FakeUpstream
from tests.gateway.conftest import MESSAGES, Gateway

CHAT = {"model": "m", "messages": MESSAGES}


async def test_lone_surrogate_is_forwarded_and_recorded_exactly(gw: Gateway, upstream: FakeUpstream) -> None:
    """``"\\ud800"`` is valid JSON that no UTF-8 text can carry: the row is stored with escapes
    and reads back as the same string."""
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "a\\ud800b"}]}'
    r = await gw.http().post(
        "/v1/sessions/s1/chat/completions", content=raw, headers={"content-type": "application/json"}
    )
    assert r.status_code == 200
    [step] = await gw.steps("s1")
    assert step.status == "ok"
    assert step.messages == [{"role": "user", "content": "a\ud800b"}]
    assert upstream.requests[0].body == raw  # forwarded byte for byte


async def test_a_row_the_db_refuses_fails_only_its_own_call(gw: Gateway, upstream: FakeUpstream) -> None:
    """Calls of several sessions committed in one batch: the DB refuses one row (a trigger), the
    other sessions' steps are committed and their calls answered 200."""
    con = sqlite3.connect(gw.db_path, timeout=30)
    con.execute(
        "CREATE TRIGGER refuse_bad BEFORE INSERT ON session_steps WHEN NEW.session_id = 'bad' "
        "BEGIN SELECT RAISE(ABORT, 'refused by test'); END"
    )
    con.commit()
    con.close()
    http = gw.http()
    lock = gw.hold_write_lock()  # the writer's first batch waits: the next calls queue up behind it
    try:
        calls = [
            asyncio.ensure_future(http.post(f"/v1/sessions/{sid}/chat/completions", json=CHAT))
            for sid in ("first", "good1", "bad", "good2")
        ]
        await upstream.wait_for_requests(4)
        await asyncio.sleep(0.3)
    finally:
        lock.rollback()
        lock.close()
    answers = dict(zip(("first", "good1", "bad", "good2"), await asyncio.gather(*calls), strict=True))
    assert {sid: r.status_code for sid, r in answers.items()} == {
        "first": 200,
        "good1": 200,
        "bad": 500,
        "good2": 200,
    }
    assert answers["bad"].json()["error"]["code"] == "telemetry_error"
    rows = gw.sql("SELECT session_id FROM session_steps ORDER BY session_id")
    assert [r["session_id"] for r in rows] == ["first", "good1", "good2"]


async def test_session_id_is_decoded_once_on_every_route(gw: Gateway) -> None:
    http = gw.http()
    r = await http.post("/v1/sessions/dbl%2541/chat/completions", json=CHAT)
    assert r.status_code == 200
    [row] = gw.sql("SELECT session_id FROM session_steps")
    assert row["session_id"] == "dbl%41"
    st = await http.get("/v1/sessions/dbl%2541")
    assert (st.status_code, st.json()["session_id"], st.json()["total_steps"]) == (200, "dbl%41", 1)
    closed = await http.post("/v1/sessions/dbl%2541/close")
    assert (closed.json()["session_id"], closed.json()["total_steps"]) == ("dbl%41", 1)


async def test_session_id_with_control_characters_or_too_long_is_400_before_any_budget(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    http = gw.http()
    for path in ("%00z", "a%0D%0AX-Evil:%201", "x" * 129, "%20", "%20%20%09"):  # whitespace is no id either
        r = await http.post(f"/v1/sessions/{path}/chat/completions", json=CHAT)
        assert r.status_code == 400, path
        assert r.json()["error"]["code"] == "invalid_session_id"
        assert (await http.get(f"/v1/sessions/{path}")).status_code == 400
    assert upstream.requests == []
    assert gw.sql("SELECT count(*) AS n FROM gateway_sessions")[0]["n"] == 0
    ok = await http.post(f"/v1/sessions/{'x' * 128}/chat/completions", json=CHAT)
    assert ok.status_code == 200


async def test_deeply_nested_body_is_400(gw: Gateway, upstream: FakeUpstream) -> None:
    body = '{"model": "m", "messages": [], "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    r = await gw.http().post(
        "/v1/sessions/s1/chat/completions",
        content=body.encode(),
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400
    assert "nested too deeply" in r.json()["error"]["message"]
    assert upstream.requests == []


async def test_announced_body_far_over_the_limit_is_413_at_once(start_gateway: object) -> None:
    gw: Gateway = await start_gateway(max_request_bytes=1000)  # type: ignore[operator]
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    writer.write(
        b"POST /v1/sessions/s1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: 99999999999\r\n\r\n{}"
    )
    await writer.drain()
    # the body is never sent: an answer at all means the gateway did not wait for it
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=30)
    assert head.startswith(b"HTTP/1.1 413")
    length = int(
        next(
            line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
        )
    )
    body = json.loads(await reader.readexactly(length))
    assert body["error"]["code"] == "request_too_large"
    writer.close()


async def test_a_body_nested_past_the_limit_is_400_and_never_recorded(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    """A body nested deeper than the gateway takes (but not too deep for Python's JSON reader) is
    refused before any budget is used: no step the launcher could not read back is recorded."""
    from gateway.bodies import MAX_BODY_DEPTH

    def body(depth: int) -> bytes:  # the body object itself is one level
        return (
            '{"model": "m", "messages": [{"role": "user", "content": "hi"}], "metadata": '
            + "[" * (depth - 1)
            + "]" * (depth - 1)
            + "}"
        ).encode()

    http = gw.http()
    r = await http.post(
        "/v1/sessions/s1/chat/completions",
        content=body(MAX_BODY_DEPTH + 1),
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400
    assert (
        r.json()["error"]["message"]
        == f"request body is nested too deeply (more than {MAX_BODY_DEPTH} levels)"
    )
    assert upstream.requests == [] and await gw.steps("s1") == []
    r = await http.post(
        "/v1/sessions/s1/chat/completions",
        content=body(MAX_BODY_DEPTH),
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 200
    [step] = await gw.steps("s1")
    assert step.seq == 1
