"""Gateway contract for the per-session step budget (``max_steps``): synthetic stop answers,
parallel calls, budgets from the launcher's session rows, and the persisted session state
(a restart keeps the budget and the step ids)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import openai
import pytest

from store import JobEnvironment, Store
from tests.fake_upstream import (
    DEFAULT_TEXT,
    DONE,
    FakeRequest,
    FakeUpstream,
    Reply,
    chat_chunk,
    chat_completion,
)
from tests.gateway.conftest import MESSAGES, Gateway, StartGateway, eventually, sse_json

UP_PATH = "/v1/chat/completions"


@pytest.fixture
def db_url(store_url: str) -> str:
    """This module runs on both backends (SQLite, and PostgreSQL with shared sessions)."""
    return store_url


def session_row(gw: Gateway, sid: str) -> dict[str, object]:
    [row] = gw.sql("SELECT * FROM gateway_sessions WHERE session_id=?", sid)
    return dict(row)


async def test_budget_then_synthetic_stop_without_upstream_call(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(max_steps=2)
    client = gw.client("s1")
    for _ in range(2):
        out = await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        assert out.choices[0].message.content == DEFAULT_TEXT
    raw = await client.chat.completions.with_raw_response.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert raw.http_response.status_code == 200
    assert raw.headers["x-gateway-stop-reason"] == "max_steps"
    stop = raw.parse()
    assert stop.object == "chat.completion" and stop.model == "m"
    assert stop.choices[0].message.content == "" and stop.choices[0].message.role == "assistant"
    assert stop.choices[0].finish_reason == "stop"
    assert stop.usage is not None and (stop.usage.prompt_tokens, stop.usage.total_tokens) == (0, 0)
    await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]

    assert len(upstream.requests) == 2  # no upstream call once the budget is used
    steps = await gw.steps("s1")
    assert [(s.seq, s.step_id, s.status) for s in steps] == [(1, 1, "ok"), (2, 2, "ok")]
    r = await gw.http().get("/v1/sessions/s1")
    assert (r.json()["status"], r.json()["total_steps"], r.json()["max_steps"]) == ("truncated", 2, 2)
    assert session_row(gw, "s1")["status"] == "truncated"
    assert await gw.metric("gateway_synthetic_stops_total") == 2
    assert await gw.metric("gateway_steps_recorded_total") == 2

    r = await gw.http().post("/v1/sessions/s1/close", json={"reason": "agent done"})
    assert r.json()["truncated"] is True and r.json()["completion_mode"] == "truncated"


@pytest.mark.parametrize("client_usage", [False, True])
async def test_streamed_synthetic_stop(
    start_gateway: StartGateway, upstream: FakeUpstream, client_usage: bool
) -> None:
    gw = await start_gateway(max_steps=0)
    body: dict[str, object] = {"model": "m", "messages": MESSAGES, "stream": True}
    if client_usage:
        body["stream_options"] = {"include_usage": True}
    r = await gw.http().post("/v1/sessions/s1/chat/completions", json=body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["x-gateway-stop-reason"] == "max_steps"
    assert r.content.endswith(b"data: [DONE]\n\n")
    chunks = sse_json(r.content)
    assert [c["object"] for c in chunks] == ["chat.completion.chunk"] * len(chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[1]["choices"][0]["finish_reason"] == "stop"
    if client_usage:
        assert len(chunks) == 3
        assert chunks[2]["choices"] == [] and chunks[2]["usage"]["total_tokens"] == 0
    else:
        assert len(chunks) == 2 and b'"choices":[]' not in r.content

    client = gw.client("s1")
    got = [c async for c in await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)]  # type: ignore[arg-type]
    assert [c.choices[0].finish_reason for c in got] == [None, "stop"]
    assert upstream.requests == []
    assert await gw.steps("s1") == []
    assert session_row(gw, "s1")["status"] == "truncated"
    assert await gw.metric("gateway_synthetic_stops_total") == 2


@pytest.mark.parametrize("stream", [False, True])
async def test_parallel_calls_make_exactly_budget_upstream_calls(
    start_gateway: StartGateway, upstream: FakeUpstream, stream: bool
) -> None:
    budget, n = 3, 10
    gw = await start_gateway(max_steps=budget)
    # slow upstream answers, the earliest-reserved finishing last, so calls overlap for real
    delays = [0.3, 0.2, 0.1]

    def reply(req: object) -> Reply:
        d = delays.pop(0)
        if stream:
            body = upstream.default_reply(req).chunks  # type: ignore[arg-type]
            return Reply.sse(body, delay_headers_s=d)
        return Reply.json(chat_completion(), delay_headers_s=d)

    upstream.script(UP_PATH, [reply] * budget)
    client = gw.client("s1")

    async def one() -> str | None:
        if stream:
            text = ""
            async for c in await client.chat.completions.create(model="m", messages=MESSAGES, stream=True):  # type: ignore[arg-type]
                text += (c.choices[0].delta.content or "") if c.choices else ""
            return text
        out = await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        return out.choices[0].message.content

    results = await asyncio.gather(*(one() for _ in range(n)))
    assert sorted(results) == [""] * (n - budget) + [DEFAULT_TEXT] * budget
    assert len(upstream.requests) == budget
    steps = await gw.steps("s1")
    assert sorted(s.step_id for s in steps) == [1, 2, 3]
    assert [s.seq for s in steps] == [1, 2, 3]
    assert {s.status for s in steps} == {"ok"}
    assert await gw.metric("gateway_synthetic_stops_total") == n - budget
    # the persisted state is the final one, not a snapshot of a call that finished late
    row = session_row(gw, "s1")
    assert (row["status"], row["total_steps"], json.loads(str(row["step_counts"]))) == (
        "truncated",
        3,
        {"m": 3},
    )


async def test_persisted_state_survives_out_of_order_completion_and_restart(
    start_gateway: StartGateway, upstream: FakeUpstream, db_url: str
) -> None:
    gw = await start_gateway()
    delays = [0.4, 0.0]  # the first-reserved call finishes last
    upstream.script(UP_PATH, [lambda _r: Reply.json(chat_completion(), delay_headers_s=delays.pop(0))] * 2)
    client = gw.client("s1")
    first = asyncio.ensure_future(client.chat.completions.create(model="m", messages=MESSAGES))  # type: ignore[arg-type]
    await upstream.wait_for_requests(1)
    await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    await first
    row = session_row(gw, "s1")
    assert (row["total_steps"], json.loads(str(row["step_counts"]))) == (2, {"m": 2})
    await gw.stop()

    gw2 = await start_gateway(db_url=db_url)  # a restart on the same database
    # the session the first gateway left active is marked interrupted, budget kept (not with
    # shared sessions: other gateways may be serving it, it stays active)
    left = "active" if gw2.app_state.sessions.persists_itself else "interrupted"
    row = session_row(gw2, "s1")
    assert (row["status"], row["total_steps"]) == (left, 2)
    st = (await gw2.http().get("/v1/sessions/s1")).json()
    assert (st["status"], st["total_steps"]) == (left, 2)
    await gw2.client("s1").chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    steps = await gw2.steps("s1")
    assert [(s.seq, s.step_id, s.status) for s in steps] == [(1, 1, "ok"), (2, 2, "ok"), (3, 3, "ok")]
    row = session_row(gw2, "s1")
    assert (row["status"], row["total_steps"]) == ("active", 3)  # its next call resumed it


async def test_restart_keeps_the_budget(
    start_gateway: StartGateway, upstream: FakeUpstream, db_url: str
) -> None:
    gw = await start_gateway(max_steps=2)
    await gw.client("s1").chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    await gw.stop()
    gw2 = await start_gateway(db_url=db_url, max_steps=2)
    client = gw2.client("s1")
    await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    raw = await client.chat.completions.with_raw_response.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert raw.headers["x-gateway-stop-reason"] == "max_steps"
    assert len(upstream.requests) == 2
    assert [s.step_id for s in await gw2.steps("s1")] == [1, 2]


async def test_launcher_session_row_sets_budget_and_step_metadata(
    start_gateway: StartGateway, upstream: FakeUpstream, db_url: str
) -> None:
    gw = await start_gateway(max_steps=-1)
    store = Store(db_url)
    try:
        await store.add_job_sessions(
            [
                JobEnvironment(
                    session_id="job1-c1-0",
                    job_id="job1",
                    env_name="gsm8k",
                    case_id="c1",
                    llm_model="m",
                    group_id="g1",
                    max_steps=1,
                )
            ]
        )
    finally:
        await store.close()
    client = gw.client("job1-c1-0")
    await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    raw = await client.chat.completions.with_raw_response.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert raw.headers["x-gateway-stop-reason"] == "max_steps"
    [step] = await gw.steps("job1-c1-0")
    assert (step.job_id, step.env_name, step.group_id) == ("job1", "gsm8k", "g1")
    r = await gw.http().get("/v1/sessions/job1-c1-0")
    assert (r.json()["max_steps"], r.json()["status"]) == (1, "truncated")


async def test_close_while_a_call_is_in_flight_stays_closed(gw: Gateway, upstream: FakeUpstream) -> None:
    upstream.script(UP_PATH, [Reply.json(chat_completion(), delay_headers_s=0.3)])
    call = asyncio.ensure_future(gw.client("s1").chat.completions.create(model="m", messages=MESSAGES))  # type: ignore[arg-type]
    await upstream.wait_for_requests(1)
    r = await gw.http().post("/v1/sessions/s1/close", json={"reason": "timeout"})
    assert r.json()["status"] == "closed"
    out = await call  # the call in flight still completes and is recorded
    assert out.choices[0].message.content == DEFAULT_TEXT
    [step] = await gw.steps("s1")
    assert step.status == "ok"
    row = session_row(gw, "s1")
    assert (row["status"], row["close_reason"]) == ("closed", "timeout")  # not reopened by the late step
    r = await gw.http().get("/v1/sessions/s1")
    assert r.json()["status"] == "closed"


def _held(release: asyncio.Event, answer: dict[str, Any]) -> Callable[[FakeRequest], Awaitable[Reply]]:
    """A scripted reply that answers ``answer`` only once ``release`` is set."""

    async def reply(_req: FakeRequest) -> Reply:
        await release.wait()
        return Reply.json(answer)

    return reply


# ------------------------------------------------------------------ close with calls in flight
async def test_close_answers_only_once_the_call_in_flight_is_committed(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    """The launcher closes a session, then reads the trajectory and grades its last step: a call
    in flight at close time must be committed before the close answers, never after."""
    release = asyncio.Event()
    upstream.script(UP_PATH, [_held(release, chat_completion("last words"))])
    call = asyncio.ensure_future(gw.client("s1").chat.completions.create(model="m", messages=MESSAGES))  # type: ignore[arg-type]
    await upstream.wait_for_requests(1)
    closing = asyncio.ensure_future(gw.http().post("/v1/sessions/s1/close", json={"reason": "killed"}))
    await eventually(lambda: not gw.app_state.sessions.takes_calls("s1"))  # the close started
    # the session takes no new call meanwhile
    r = await gw.http().post("/v1/sessions/s1/chat/completions", json={"model": "m", "messages": MESSAGES})
    assert (r.status_code, r.json()["error"]["code"]) == (409, "session_closed")
    assert not closing.done()  # waiting for the call in flight, whose answer is held
    release.set()
    r = await closing
    # at the moment close answers, the step is committed (read with a separate connection)
    rows = gw.sql("SELECT status, is_trainable, meta_json FROM session_steps WHERE session_id='s1'")
    assert [(row["status"], row["is_trainable"]) for row in rows] == [("ok", 1)]
    assert "after_close" not in json.loads(rows[0]["meta_json"])
    assert r.json() == {
        "session_id": "s1",
        "status": "closed",
        "total_steps": 1,
        "max_steps": -1,
        "refunded_steps": 0,
        "truncated": False,
        "close_reason": "killed",
        "completion_mode": None,
        "policy_versions": [None],
        "spans_policy_versions": False,
        "rejected_calls": {"session_closed": 1},
        "unrecorded_calls": 0,
    }  # the refused call above
    assert (await call).choices[0].message.content == "last words"
    assert session_row(gw, "s1")["status"] == "closed"
    assert len(upstream.requests) == 1


async def test_close_waits_for_a_stream_in_flight(gw: Gateway, upstream: FakeUpstream) -> None:
    chunks = [chat_chunk(f"w{i}", role="assistant" if i == 0 else None) for i in range(6)]
    upstream.script(UP_PATH, [Reply.sse([*chunks, chat_chunk(finish_reason="stop"), DONE], delay_s=0.15)])
    stream = await gw.client("s1").chat.completions.create(model="m", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
    first = await stream.__anext__()
    assert first.choices[0].delta.content == "w0"

    async def rest() -> str:
        return "".join([(c.choices[0].delta.content or "") if c.choices else "" async for c in stream])

    reader = asyncio.ensure_future(rest())
    closing = asyncio.ensure_future(gw.http().post("/v1/sessions/s1/close", json={"reason": "done"}))
    await asyncio.sleep(0.3)
    assert not closing.done()  # the stream is still running
    r = await closing
    assert r.json()["status"] == "closed"
    [row] = gw.sql("SELECT status, is_stream, is_trainable FROM session_steps WHERE session_id='s1'")
    assert (row["status"], row["is_stream"], row["is_trainable"]) == ("ok", 1, 1)
    assert "w0" + await reader == "w0w1w2w3w4w5"


async def test_close_returns_quickly_when_the_client_in_flight_leaves(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    """The launcher killed the runtime (its client timed out here), then closes: the close does
    not wait for the upstream's answer (30 s) nor for the grace (30 s by default)."""
    upstream.script(UP_PATH, [Reply.json(chat_completion("late"), delay_headers_s=30)])
    call = asyncio.ensure_future(
        gw.client("s1", timeout=0.5).chat.completions.create(model="m", messages=MESSAGES)
    )  # type: ignore[arg-type]
    await upstream.wait_for_requests(1)
    # the deadline is a hang guard: waiting for the upstream or the grace would take 30 s
    r = await asyncio.wait_for(gw.http().post("/v1/sessions/s1/close", json={"reason": "timeout"}), 20)
    assert r.json()["status"] == "closed"
    [row] = gw.sql("SELECT status, is_trainable FROM session_steps WHERE session_id='s1'")
    assert (row["status"], row["is_trainable"]) == ("client_disconnected", 1)
    with pytest.raises(openai.APITimeoutError):
        await call
    await upstream.wait_for_disconnect(1, timeout=1.0)


async def test_call_outliving_the_close_grace_is_recorded_after_close_untrainable(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(close_grace_s=0.3)
    release = asyncio.Event()
    upstream.script(UP_PATH, [_held(release, chat_completion("too late"))])
    call = asyncio.ensure_future(gw.client("s1").chat.completions.create(model="m", messages=MESSAGES))  # type: ignore[arg-type]
    await upstream.wait_for_requests(1)
    r = await gw.http().post("/v1/sessions/s1/close", json={"reason": "timeout"})
    assert not release.is_set()  # the close answered on its grace, the call's answer still held
    assert r.json()["status"] == "closed"
    assert gw.sql("SELECT count(*) AS n FROM session_steps")[0]["n"] == 0
    release.set()
    out = await call  # the client still gets its answer ...
    assert out.choices[0].message.content == "too late"
    [step] = await gw.steps("s1")  # ... and the step is kept, marked as landed after the close
    assert (step.status, step.is_trainable, step.meta_json["after_close"]) == ("ok", False, True)
    row = session_row(gw, "s1")
    assert (row["status"], row["close_reason"]) == ("closed", "timeout")
    assert gw.app_state.sessions.in_flight("s1") == 0
    assert not gw.app_state.sessions.holds("s1")  # bookkeeping dropped once the call is recorded


async def _fails_once(gw: Gateway, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch, path: str) -> int:
    """Set up one failure path for the next call; returns the HTTP status the client gets."""
    if path == "upstream-error":
        upstream.script(UP_PATH, [Reply.json({"error": {"message": "boom"}}, status=500)])
        return 500
    if path == "upstream-timeout":
        upstream.script(UP_PATH, [Reply(never_respond=True)])
        return 504
    if path == "invalid-answer":
        upstream.script(UP_PATH, [Reply.raw(b"<html>oops</html>", content_type="text/html")])
        return 502
    if path == "telemetry-failure":
        real = gw.app_state.store.write_batch

        async def broken(steps: object, sessions: object, **kw: object) -> None:
            monkeypatch.setattr(gw.app_state.store, "write_batch", real)
            raise OSError("disk full")

        monkeypatch.setattr(gw.app_state.store, "write_batch", broken)
        monkeypatch.setattr(gw.app_state.store, "commit_now", lambda steps, sessions: False)  # always queue
        return 500
    if path == "gateway-bug":
        from gateway.protocols import CHAT

        def bug(*_a: object, **_k: object) -> None:
            raise KeyError("bug")

        monkeypatch.setattr(CHAT, "is_answer", bug)
        return 500
    return 200


@pytest.mark.parametrize(
    "path",
    [
        "ok",
        "upstream-error",
        "upstream-timeout",
        "invalid-answer",
        "telemetry-failure",
        "gateway-bug",
        "synthesized-stream",
        "stream",
        "synthetic-stop",
    ],
)
async def test_every_call_path_ends_its_in_flight_mark(
    start_gateway: StartGateway, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    routes = {"m": {"read_timeout_s": 0.3, "supports_stream": path != "synthesized-stream"}}
    gw = await start_gateway(max_steps=0 if path == "synthetic-stop" else -1, routes=routes)
    status = await _fails_once(gw, upstream, monkeypatch, path)
    stream = path in ("synthesized-stream", "stream", "synthetic-stop")
    r = await gw.http().post(
        "/v1/sessions/s1/chat/completions", json={"model": "m", "messages": MESSAGES, "stream": stream}
    )
    assert r.status_code == status, r.text
    assert gw.app_state.sessions.in_flight("s1") == 0
    # nothing in flight: the close does not wait for its 30 s grace (the deadline is a hang guard)
    r = await asyncio.wait_for(gw.http().post("/v1/sessions/s1/close", json={"reason": "done"}), 20)
    assert r.status_code == 200


async def test_close_racing_the_first_call_waits_for_it(
    gw: Gateway, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session's first call is still being reserved (its state loads from the store) when the
    close arrives: the close waits for that call, whose step is then recorded before the close
    answers, as a normal trainable step."""
    store = gw.app_state.store
    real_load = store.gateway_session_or_context

    async def slow_load(sid: str) -> object:
        await asyncio.sleep(0.3)
        return await real_load(sid)

    monkeypatch.setattr(store, "gateway_session_or_context", slow_load)
    call = asyncio.ensure_future(gw.client("s1").chat.completions.create(model="m", messages=MESSAGES))  # type: ignore[arg-type]
    await asyncio.sleep(0.1)  # the call is inside reserve, loading the session
    r = await gw.http().post("/v1/sessions/s1/close", json={"reason": "done"})
    assert r.json()["total_steps"] == 1
    [row] = gw.sql("SELECT status, is_trainable, meta_json FROM session_steps WHERE session_id='s1'")
    assert (row["status"], row["is_trainable"]) == ("ok", 1) and "after_close" not in row["meta_json"]
    out = await call
    assert out.choices[0].message.content == DEFAULT_TEXT
