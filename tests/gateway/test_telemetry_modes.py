"""Telemetry modes as the agent sees them (``telemetry.mode``): ``best_effort`` answers never wait
for the DB (lost records are counted); ``strict`` makes a DB failure an error the agent sees
(500 ``telemetry_error``, or an error event instead of the stream's end). The DB failure is a
real SQLite one: a trigger that aborts every insert into ``session_steps``, created and dropped
from a second connection.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable

import openai
import pytest

from tests.fake_upstream import DEFAULT_TEXT, FakeUpstream
from tests.gateway.conftest import MESSAGES, Gateway, StartGateway, eventually

BEST_EFFORT = {"mode": "best_effort"}
PROMPT_S = 1.0  # how long the test keeps the lock after the answers, to see nothing commit
ANSWER_DEADLINE_S = 30.0  # a hang guard, half the store's 60 s busy timeout a waiting commit would need
FAILURE = "disk full (test trigger)"


def break_step_inserts(gw: Gateway) -> None:
    """Make every INSERT into session_steps fail inside SQLite (until :func:`heal`)."""
    con = sqlite3.connect(gw.db_path, timeout=30)
    try:
        con.execute(
            "CREATE TRIGGER fail_steps BEFORE INSERT ON session_steps "
            f"BEGIN SELECT RAISE(ABORT, '{FAILURE}'); END"
        )
        con.commit()
    finally:
        con.close()


def heal(gw: Gateway) -> None:
    con = sqlite3.connect(gw.db_path, timeout=30)
    try:
        con.execute("DROP TRIGGER fail_steps")
        con.commit()
    finally:
        con.close()


async def answered(coro: Awaitable[object]) -> None:
    """Await ``coro`` under :data:`ANSWER_DEADLINE_S` (it would hang on the held lock if it
    waited for the DB)."""
    await asyncio.wait_for(coro, ANSWER_DEADLINE_S)


def step_count(gw: Gateway) -> int:
    return int(gw.sql("SELECT count(*) AS n FROM session_steps")[0]["n"])


async def test_best_effort_answers_while_the_db_is_locked(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(telemetry=BEST_EFFORT)
    client = gw.client("s1")
    lock = gw.hold_write_lock()
    try:
        await answered(client.chat.completions.create(model="m", messages=MESSAGES))  # type: ignore[arg-type]

        async def stream() -> None:
            chunks = [
                c
                async for c in await client.chat.completions.create(
                    model="m",
                    messages=MESSAGES,  # type: ignore[arg-type]
                    stream=True,
                )
            ]
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == DEFAULT_TEXT

        await answered(stream())
        await answered(client.responses.create(model="m", input="hi"))
        await answered(gw.http().post("/v1/sessions/s1/close", json={"reason": "done"}))
        assert step_count(gw) == 0  # every answer came while the lock was held
        await asyncio.sleep(PROMPT_S)  # the lock stays held: nothing can be committed meanwhile
        assert step_count(gw) == 0
        assert await gw.metric("gateway_steps_recorded_total") == 0
    finally:
        lock.rollback()
        lock.close()
    steps = await gw.wait_steps("s1", 3)
    assert [(s.seq, s.endpoint, s.is_stream, s.status) for s in steps] == [
        (1, "chat.completions", False, "ok"),
        (2, "chat.completions", True, "ok"),
        (3, "responses", False, "ok"),
    ]
    assert steps[1].response["choices"][0]["message"]["content"] == DEFAULT_TEXT

    async def closed() -> bool:
        return gw.sql("SELECT status FROM gateway_sessions WHERE session_id='s1'")[0]["status"] == "closed"

    await eventually(closed)
    assert await gw.metric("gateway_telemetry_dropped_total") == 0


async def test_best_effort_answers_when_the_db_fails_and_counts_the_loss(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(telemetry=BEST_EFFORT)
    client = gw.client("s1")
    break_step_inserts(gw)
    out = await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert out.choices[0].message.content == DEFAULT_TEXT
    chunks = [
        c async for c in await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    ]  # type: ignore[arg-type]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == DEFAULT_TEXT

    async def both_dropped() -> bool:
        return await gw.metric("gateway_telemetry_dropped_total") == 2

    await eventually(both_dropped)
    assert step_count(gw) == 0
    assert await gw.metric("gateway_steps_recorded_total") == 0
    assert (
        await gw.metric("gateway_requests_total", endpoint="chat.completions", route="m", status="200") == 2
    )

    heal(gw)  # the DB works again: the next call is recorded, the lost ones stay lost
    await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    [step] = await gw.wait_steps("s1", 1)
    assert (step.seq, step.status) == (3, "ok")
    assert await gw.metric("gateway_telemetry_dropped_total") == 2
    assert await gw.metric("gateway_steps_recorded_total") == 1


async def test_best_effort_full_queue_drops_and_counts(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    """queue_max 1 with the DB locked: the writer holds the first record, the second waits in
    the queue, the third finds it full and is dropped; every answer still arrives."""
    gw = await start_gateway(telemetry={**BEST_EFFORT, "queue_max": 1})
    client = gw.client("s1")
    lock = gw.hold_write_lock()
    try:
        for _ in range(3):
            out = await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
            assert out.choices[0].message.content == DEFAULT_TEXT
        assert await gw.metric("gateway_telemetry_dropped_total") == 1
    finally:
        lock.rollback()
        lock.close()
    steps = await gw.wait_steps("s1", 2)
    assert [s.seq for s in steps] == [1, 2]
    await asyncio.sleep(0.2)
    assert [s.seq for s in await gw.steps("s1")] == [1, 2]


async def test_strict_db_failure_is_an_error_the_agent_sees(gw: Gateway, upstream: FakeUpstream) -> None:
    assert gw.settings.telemetry.mode == "strict"
    client = gw.client("s1")
    break_step_inserts(gw)
    with pytest.raises(openai.InternalServerError) as ei:
        await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    err = ei.value.response.json()["error"]
    assert (ei.value.status_code, err["type"], err["code"], err["param"]) == (
        500,
        "api_error",
        "telemetry_error",
        None,
    )
    assert err["message"].startswith("the gateway could not record this call: ") and FAILURE in err["message"]

    # a stream: the answer's content arrives, then an error event instead of [DONE]
    got: list[str] = []
    with pytest.raises(openai.APIError) as si:
        async for c in await client.chat.completions.create(model="m", messages=MESSAGES, stream=True):  # type: ignore[arg-type]
            got.extend(ch.delta.content or "" for ch in c.choices)
    assert "".join(got) == DEFAULT_TEXT
    assert "could not record this call" in si.value.message and FAILURE in si.value.message

    assert step_count(gw) == 0
    assert await gw.metric("gateway_telemetry_dropped_total") == 0  # strict mode drops nothing silently
    assert await gw.metric("gateway_steps_recorded_total") == 0
    assert await gw.metric("gateway_error_responses_total", status="500", code="telemetry_error") == 1
    # both failed calls (the stream ended by the relay, the non-streamed one answered by the error
    # handler) count as 500 answers of their route
    assert (
        await gw.metric("gateway_requests_total", endpoint="chat.completions", route="m", status="500") == 2
    )

    heal(gw)
    out = await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert out.choices[0].message.content == DEFAULT_TEXT
    [step] = await gw.steps("s1")  # strict: committed before the answer
    assert (step.seq, step.status) == (3, "ok")


async def test_best_effort_close_that_was_not_stored_still_refuses_calls(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    """The closed state is dropped from memory only once it is committed: when the DB loses it,
    the session stays closed in memory (a later call is 409, not reloaded from the store as
    active); once the DB works again, a second close stores it."""
    gw = await start_gateway(telemetry=BEST_EFFORT)
    client = gw.client("s1")
    await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    await gw.wait_steps("s1", 1)
    con = sqlite3.connect(gw.db_path, timeout=30)
    con.execute(
        "CREATE TRIGGER fail_sessions BEFORE UPDATE ON gateway_sessions "
        f"BEGIN SELECT RAISE(ABORT, '{FAILURE}'); END"
    )
    con.commit()
    try:
        r = await gw.http().post("/v1/sessions/s1/close", json={"reason": "done"})
        assert r.status_code == 200 and r.json()["status"] == "closed"

        async def dropped() -> bool:
            return await gw.metric("gateway_telemetry_dropped_total") == 1

        await eventually(dropped)
        assert gw.sql("SELECT status FROM gateway_sessions WHERE session_id='s1'")[0]["status"] == "active"
        with pytest.raises(openai.ConflictError):
            await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    finally:
        con.execute("DROP TRIGGER fail_sessions")
        con.commit()
        con.close()
    r = await gw.http().post("/v1/sessions/s1/close", json={"reason": "again"})
    assert r.json()["close_reason"] == "done"  # the first reason is kept

    async def stored() -> bool:
        return gw.sql("SELECT status FROM gateway_sessions WHERE session_id='s1'")[0]["status"] == "closed"

    await eventually(stored)
    assert len(upstream.requests) == 1


def fill_the_disk(gw: Gateway, times: int = 1_000_000, exc: BaseException | None = None) -> list[int]:
    """Make the gateway's store fail the next ``times`` commits that hold a step, as a full disk
    does (``sqlite3.OperationalError: database or disk is full``); a session's state alone is
    still written. Returns the count left (set it to 0 to free the disk)."""
    store = gw.app_state.store
    now, batch = store.commit_now, store.write_batch
    left = [times]

    def full(steps: object) -> None:
        if steps and left[0] > 0:
            left[0] -= 1
            raise exc or sqlite3.OperationalError("database or disk is full")

    def commit_now(steps: list[object], sessions: list[object]) -> bool:
        full(steps)
        return bool(now(steps, sessions))

    async def write_batch(steps: list[object], sessions: list[object], **kw: object) -> None:
        full(steps)
        await batch(steps, sessions, **kw)

    store.commit_now, store.write_batch = commit_now, write_batch
    return left


@pytest.mark.parametrize(
    "exc", [sqlite3.OperationalError("database or disk is full"), OSError(28, "No space left on device")]
)
async def test_strict_calls_the_store_could_not_record_are_counted_in_the_sessions_answers(
    gw: Gateway, upstream: FakeUpstream, exc: BaseException
) -> None:
    """The gateway's own record of its outage: calls the store failed to record are counted per
    session, in memory (the store is full), in the status and close answers."""
    client = gw.client("s1")
    left = fill_the_disk(gw, exc=exc)
    for _ in range(2):
        with pytest.raises(openai.InternalServerError):
            await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    http = gw.http()
    assert (await http.get("/v1/sessions/s1")).json()["unrecorded_calls"] == 2
    closed = (await http.post("/v1/sessions/s1/close", json={"reason": "done"})).json()
    assert (closed["status"], closed["total_steps"], closed["unrecorded_calls"]) == ("closed", 2, 2)
    assert step_count(gw) == 0
    # another session's calls are its own
    left[0] = 0
    await gw.client("s2").chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert (await http.post("/v1/sessions/s2/close", json={})).json()["unrecorded_calls"] == 0


async def test_a_record_the_store_refuses_is_not_an_outage(gw: Gateway, upstream: FakeUpstream) -> None:
    """A record refused for what it holds (here a trigger: a constraint error) is not the store's
    outage: not counted, the call is the caller's error."""
    client = gw.client("s1")
    break_step_inserts(gw)
    with pytest.raises(openai.InternalServerError):
        await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    heal(gw)
    closed = (await gw.http().post("/v1/sessions/s1/close", json={})).json()
    assert (closed["total_steps"], closed["unrecorded_calls"]) == (1, 0)


async def test_best_effort_drops_to_a_full_store_are_counted(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(telemetry=BEST_EFFORT)
    client = gw.client("s1")
    fill_the_disk(gw)
    out = await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert out.choices[0].message.content == DEFAULT_TEXT

    async def dropped() -> bool:
        return await gw.metric("gateway_telemetry_dropped_total") == 1

    await eventually(dropped)
    assert (await gw.http().get("/v1/sessions/s1")).json()["unrecorded_calls"] == 1


async def test_a_new_state_of_the_session_starts_a_new_count(gw: Gateway, upstream: FakeUpstream) -> None:
    """A retry under the same session id (the launcher drops the session's state from the store)
    counts afresh."""
    from store import Store

    client = gw.client("s1")
    fill_the_disk(gw, times=1)
    with pytest.raises(openai.InternalServerError):
        await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    http = gw.http()
    assert (await http.post("/v1/sessions/s1/close", json={})).json()["unrecorded_calls"] == 1
    launcher = Store(gw.db_url)
    try:
        await launcher.reset_for_retry("s1", 1)
    finally:
        await launcher.close()
    await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    closed = (await http.post("/v1/sessions/s1/close", json={})).json()
    assert (closed["total_steps"], closed["unrecorded_calls"]) == (1, 0)
