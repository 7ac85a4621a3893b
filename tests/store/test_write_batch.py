"""``Store.write_batch`` on both backends (``store_url``: SQLite and PostgreSQL): a batch stores
exactly what the SQLAlchemy ORM stores, the last state of a session in a batch wins, and a batch
commits or rolls back as a whole. The SQLite-only fast path has its own tests
(test_write_batch_sqlite3.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import exc as sa_exc

from store import GatewaySession, SessionStep, Store
from tests.store.test_write_batch_sqlite3 import STEP_EXCLUDED, TZ_PLUS2, _fields, _orm_add, _step_kwargs


def _aware(d: datetime) -> datetime:
    """SQLite gives naive UTC-less datetimes back (tzinfo dropped), PostgreSQL aware UTC ones."""
    return d.replace(tzinfo=None) if d.tzinfo is None else d


async def test_write_batch_rows_equal_orm_rows(store_url: str) -> None:
    store = Store(store_url)
    await store.init()
    try:
        kws = [
            kw for kw in _step_kwargs(0) if kw["created_at"].year >= 1000
        ]  # PG and SQLite agree from year 1000
        await store.write_batch([SessionStep(session_id="batch", **kw) for kw in kws], [])
        await _orm_add(store, *[SessionStep(session_id="orm", **kw) for kw in kws])
        fast, orm = await store.trajectory("batch"), await store.trajectory("orm")
        assert len(fast) == len(orm) == len(kws)
        for f, o in zip(fast, orm, strict=True):
            assert _fields(f, STEP_EXCLUDED) == _fields(o, STEP_EXCLUDED)
        assert fast[0].response["x"] == "nan" and fast[0].response["y"][:2] == ["inf", "-inf"]
        assert fast[0].messages == kws[0]["messages"] and fast[0].request == kws[0]["request"]
        assert (fast[0].is_stream, fast[0].is_trainable, fast[0].reward) == (True, False, 1e300)
        if store.kind == "postgresql":  # timestamptz: the same instant, read back in UTC
            assert fast[1].created_at == datetime(2024, 6, 30, 21, 59, 59, 999999, tzinfo=UTC)
    finally:
        await store.close()


async def test_session_upsert_last_state_wins_and_created_at_is_kept(store_url: str) -> None:
    store = Store(store_url)
    await store.init()
    t0 = datetime(2024, 1, 1, tzinfo=UTC)
    try:
        await store.write_batch(
            [], [GatewaySession(session_id="s", total_steps=1, created_at=t0, updated_at=t0)]
        )
        last: dict[str, Any] = dict(
            status="closed",
            max_steps=5,
            total_steps=3,
            step_counts={"m/é": 3, "n": 0},
            job_id="j",
            close_reason="done ✓",
            completion_mode="auto",
            updated_at=datetime(2024, 1, 3, tzinfo=TZ_PLUS2),
        )
        await store.write_batch(
            [],
            [
                GatewaySession(session_id="s", total_steps=2, step_counts={"m": 2}),
                GatewaySession(session_id="s", created_at=datetime(2025, 1, 1, tzinfo=UTC), **last),
            ],
        )
        gs = await store.load_gateway_session("s")
        assert gs is not None
        assert (gs.status, gs.total_steps, gs.step_counts, gs.close_reason) == (
            "closed",
            3,
            {"m/é": 3, "n": 0},
            "done ✓",
        )
        assert _aware(gs.created_at) in (datetime(2024, 1, 1), t0)
    finally:
        await store.close()


async def test_error_rolls_back_whole_batch_and_raises(store_url: str) -> None:
    import sqlite3

    store = Store(store_url)
    await store.init()
    try:
        ok = SessionStep(session_id="s", seq=1, step_id=1, llm_model="m", endpoint="e")
        await store.write_batch([ok], [GatewaySession(session_id="s", total_steps=1)])
        dup = SessionStep(
            record_id=ok.record_id, session_id="s", seq=3, step_id=3, llm_model="m", endpoint="e"
        )
        new = SessionStep(session_id="s", seq=2, step_id=2, llm_model="m", endpoint="e")
        with pytest.raises((sqlite3.IntegrityError, sa_exc.IntegrityError)):
            await store.write_batch(
                [new, dup],
                [
                    GatewaySession(session_id="s", total_steps=3),
                    GatewaySession(session_id="other", total_steps=1),
                ],
            )
        assert [s.seq for s in await store.trajectory("s")] == [1]
        gs = await store.load_gateway_session("s")
        assert gs is not None and gs.total_steps == 1
        assert await store.load_gateway_session("other") is None
        await store.write_batch([new], [GatewaySession(session_id="s", total_steps=2)])
        assert [s.seq for s in await store.trajectory("s")] == [1, 2]
        await store.update_job_session("nobody", status="x")
    finally:
        await store.close()
