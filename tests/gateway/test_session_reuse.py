"""The contract a launcher retry relies on: once a session's close has been answered (strict
telemetry: committed and dropped from the gateway's memory), ``Store.reset_for_retry`` (steps
moved to ``<sid>~a<n>``, the gateway's state of the session deleted) makes the same session id
a fresh session for the gateway: its next call is taken, with step ids and budget from 1."""

from __future__ import annotations

import openai
import pytest

from store import Store
from tests.gateway.conftest import MESSAGES, StartGateway


@pytest.fixture
def db_url(store_url: str) -> str:
    """This module runs on both backends (SQLite, and PostgreSQL with shared sessions)."""
    return store_url


async def test_closed_session_is_fresh_after_reset_for_retry(start_gateway: StartGateway) -> None:
    gw = await start_gateway(max_steps=1)
    client = gw.client("s1")
    await client.chat.completions.create(model="m", messages=MESSAGES)
    r = await gw.http().post("/v1/sessions/s1/close", json={"reason": "failed"})
    assert r.status_code == 200
    with pytest.raises(openai.APIStatusError) as refused:  # a closed session takes no call
        await client.chat.completions.create(model="m", messages=MESSAGES)
    assert refused.value.status_code == 409

    store = Store(gw.db_url)
    try:
        assert await store.reset_for_retry("s1", 1) == 1
    finally:
        await store.close()
    answer = await client.chat.completions.create(model="m", messages=MESSAGES)
    assert answer.choices[0].message.content
    [step] = await gw.wait_steps("s1", 1)
    assert (step.step_id, step.seq, step.status, step.is_trainable) == (1, 1, "ok", True)
    archived = gw.sql(
        "SELECT step_id, is_trainable FROM session_steps WHERE session_id = 's1~a1' ORDER BY seq"
    )
    assert [tuple(r) for r in archived] == [(1, 0)]
    state = (await gw.http().get("/v1/sessions/s1")).json()
    assert (state["status"], state["total_steps"], state["max_steps"]) == ("active", 1, 1)  # a fresh budget
