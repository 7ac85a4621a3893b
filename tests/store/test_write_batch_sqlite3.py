"""``Store.write_batch`` on SQLite: the plain-``sqlite3`` fast path (one connection, one worker
thread) stores exactly what the SQLAlchemy ORM stores, commits or rolls back a batch as a whole,
and leaves no thread behind after ``close()``."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from store import GatewaySession, SessionStep, Store

TZ_PLUS2 = timezone(timedelta(hours=2))
STEP_EXCLUDED = ("record_id", "session_id")


def _step_kwargs(i: int) -> list[dict[str, Any]]:
    """Step rows covering every kind of value a column holds."""
    return [
        dict(
            seq=1,
            step_id=1,
            llm_model="m/é",
            endpoint="chat.completions",
            is_stream=True,
            status="ok",
            status_code=200,
            env_name="env",
            group_id="g",
            job_id="j",
            messages=[{"role": "user", "content": 'héllo ☃ 😀 \u2028 "q" \\ \n'}],
            request={
                "model": "m",
                "messages": [[1, [2, [3, None]]], {"a": {"b": [True, False]}}],
                "temperature": 0.7,
            },
            response={
                "choices": [{"message": {"content": "日本語"}}],
                "x": float("nan"),
                "y": [float("inf"), float("-inf"), 1e-310, 1.5],
            },
            finish_reason="stop",
            prompt_tokens=12,
            completion_tokens=9,
            total_tokens=21,
            latency_ms=1.25,
            ttft_ms=0.5,
            step_reward=-3.0,
            reward=1e300,
            meta_json={"route": "r", "n": None},
            is_terminal=True,
            is_truncated=False,
            is_session_completed=True,
            is_trainable=False,
            created_at=datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=UTC),
        ),
        # None everywhere it may be; JSON None; a non-UTC aware datetime
        dict(
            seq=2,
            step_id=2,
            llm_model="m",
            endpoint="responses",
            messages=None,
            request=None,
            response=None,
            meta_json=None,
            created_at=datetime(2024, 6, 30, 23, 59, 59, 999999, tzinfo=TZ_PLUS2),
        ),
        # JSON scalars and empty containers; a naive datetime; year < 1000
        dict(
            seq=3,
            step_id=3,
            llm_model="m",
            endpoint="e",
            messages=[],
            request={},
            response="plain",
            meta_json={},
            status_code=0,
            latency_ms=0.0,
            created_at=datetime(999, 1, 1, 0, 0, 0),
        ),
        dict(
            seq=4,
            step_id=4,
            llm_model="m",
            endpoint="e",
            messages=0,
            request=False,
            response=-1.5,
            created_at=datetime(2030, 12, 31, 12, 0, 0, 1),
        ),
    ]


def _fields(obj: Any, excluded: tuple[str, ...]) -> dict[str, Any]:
    return {k: v for k, v in obj.model_dump().items() if k not in excluded}


def _raw(db: Path, table: str, where: str, arg: str) -> list[dict[str, Any]]:
    con = sqlite3.connect(db)
    try:
        con.row_factory = sqlite3.Row
        rows = con.execute(
            f"SELECT *, typeof(created_at) AS t_created FROM {table} WHERE {where} = ? ORDER BY rowid", (arg,)
        ).fetchall()
        return [dict(r) for r in rows]
    finally:
        con.close()


async def _orm_add(store: Store, *objs: Any) -> None:
    async with AsyncSession(store.writer, expire_on_commit=False) as s, s.begin():
        s.add_all(objs)


def _fast_path_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("store-writer")]


async def test_fast_path_rows_equal_orm_rows(tmp_path: Path) -> None:
    db = tmp_path / "eq.db"
    store = Store(f"sqlite://{db}")
    await store.init()
    try:
        kws = _step_kwargs(0)
        await store.write_batch([SessionStep(session_id="fast", **kw) for kw in kws], [])
        assert _fast_path_threads(), "write_batch did not use the sqlite3 worker thread"
        await _orm_add(store, *[SessionStep(session_id="orm", **kw) for kw in kws])

        fast, orm = await store.trajectory("fast"), await store.trajectory("orm")
        assert len(fast) == len(orm) == len(kws)
        for f, o in zip(fast, orm, strict=True):
            assert _fields(f, STEP_EXCLUDED) == _fields(o, STEP_EXCLUDED)
        # spot checks of what SQLAlchemy makes of the values (and so the fast path too)
        assert fast[0].response["x"] == "nan" and fast[0].response["y"][:2] == ["inf", "-inf"]
        assert fast[0].messages == kws[0]["messages"] and fast[0].request == kws[0]["request"]
        assert (fast[0].is_stream, fast[0].is_trainable) == (True, False)
        assert fast[1].created_at == datetime(
            2024, 6, 30, 23, 59, 59, 999999
        )  # tzinfo dropped, not converted

        raw_fast, raw_orm = (
            _raw(db, "session_steps", "session_id", "fast"),
            _raw(db, "session_steps", "session_id", "orm"),
        )
        for f, o in zip(raw_fast, raw_orm, strict=True):
            assert {k: v for k, v in f.items() if k not in STEP_EXCLUDED} == {
                k: v for k, v in o.items() if k not in STEP_EXCLUDED
            }
        assert raw_fast[0]["is_stream"] == 1 and raw_fast[0]["is_trainable"] == 0
        assert raw_fast[0]["created_at"] == "2024-01-02 03:04:05.000006"
        assert raw_fast[2]["created_at"] == "0999-01-01 00:00:00.000000"
        # the JSON columns' None: whatever SQLAlchemy stores (JSON(none_as_null=False): the text 'null')
        assert raw_fast[1]["messages"] == raw_orm[1]["messages"]
    finally:
        await store.close()


async def test_fast_path_session_upsert_equals_orm(tmp_path: Path) -> None:
    db = tmp_path / "gs.db"
    store = Store(f"sqlite://{db}")
    await store.init()
    t0 = datetime(2024, 1, 1, tzinfo=UTC)
    try:
        first = GatewaySession(session_id="fast", total_steps=1, created_at=t0, updated_at=t0)
        mid = GatewaySession(session_id="fast", total_steps=2, step_counts={"m": 2})
        last_kw: dict[str, Any] = dict(
            status="closed",
            max_steps=5,
            total_steps=3,
            step_counts={"m/é": 3, "n": 0},
            job_id="j",
            env_name="e",
            group_id="g",
            close_reason="done ✓",
            completion_mode="auto",
            updated_at=datetime(2024, 1, 3, tzinfo=TZ_PLUS2),
            closed_at=datetime(2024, 1, 3, 1, 2, 3, 4, tzinfo=UTC),
        )
        await store.write_batch([], [first])
        # the last snapshot of a session in a batch wins; created_at of the existing row is kept
        await store.write_batch(
            [], [mid, GatewaySession(session_id="fast", created_at=datetime(2025, 1, 1), **last_kw)]
        )
        await _orm_add(store, GatewaySession(session_id="orm", created_at=t0, **last_kw))
        fast, orm = await store.load_gateway_session("fast"), await store.load_gateway_session("orm")
        assert fast is not None and orm is not None
        assert _fields(fast, ("session_id",)) == _fields(orm, ("session_id",))
        assert fast.created_at == datetime(2024, 1, 1) and fast.total_steps == 3
        (rf,), (ro,) = (
            _raw(db, "gateway_sessions", "session_id", "fast"),
            _raw(db, "gateway_sessions", "session_id", "orm"),
        )
        assert {k: v for k, v in rf.items() if k != "session_id"} == {
            k: v for k, v in ro.items() if k != "session_id"
        }
        # a session without step_counts: JSON None as SQLAlchemy stores it
        await store.write_batch([], [GatewaySession(session_id="fast2", created_at=t0, updated_at=t0)])
        await _orm_add(store, GatewaySession(session_id="orm2", created_at=t0, updated_at=t0))
        (rf,), (ro,) = (
            _raw(db, "gateway_sessions", "session_id", "fast2"),
            _raw(db, "gateway_sessions", "session_id", "orm2"),
        )
        assert {k: v for k, v in rf.items() if k != "session_id"} == {
            k: v for k, v in ro.items() if k != "session_id"
        }
    finally:
        await store.close()


async def test_close_stops_the_worker_thread_and_store_reopens(tmp_path: Path) -> None:
    before = {t.ident for t in threading.enumerate()}
    store = Store(f"sqlite://{tmp_path}/c.db")
    await store.init()
    await store.write_batch([SessionStep(session_id="x", seq=1, step_id=1, llm_model="m", endpoint="e")], [])
    assert _fast_path_threads()
    await store.close()
    assert not _fast_path_threads()
    # like a disposed engine, a closed store can be used (and closed) again
    await store.write_batch([SessionStep(session_id="x", seq=2, step_id=2, llm_model="m", endpoint="e")], [])
    assert [s.seq for s in await store.trajectory("x")] == [1, 2]
    await store.close()
    await asyncio.sleep(0.05)
    leftover = [t for t in threading.enumerate() if t.ident not in before and not t.daemon and t.is_alive()]
    assert leftover == []


async def test_commit_now_commits_inline_unless_the_lock_is_taken(tmp_path: Path) -> None:
    """``commit_now``: committed on the loop thread when the DB is free; when another connection
    holds the write lock it gives up at once (False, nothing written: the loop is never
    blocked), and ``write_batch`` then waits in the worker thread until the lock is released."""
    db = tmp_path / "x.db"
    store = Store(f"sqlite:///{db}")
    await store.init()
    try:
        assert store.commit_now(
            [SessionStep(session_id="a", seq=1, step_id=1, llm_model="m", endpoint="e")], []
        )

        lock = sqlite3.connect(db, isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")
        step2 = SessionStep(session_id="a", seq=2, step_id=2, llm_model="m", endpoint="e")
        assert store.commit_now([step2], []) is False
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        tick_task = asyncio.ensure_future(ticker())
        write = asyncio.ensure_future(store.write_batch([step2], []))
        async with asyncio.timeout(30):
            while ticks < 10:  # the event loop keeps running while the write waits
                await asyncio.sleep(0.01)
        assert not write.done()  # waiting for the lock, in the worker thread
        assert _fast_path_threads()
        lock.execute("ROLLBACK")
        lock.close()
        await asyncio.wait_for(write, 30)
        tick_task.cancel()
        rows = sqlite3.connect(db).execute("SELECT seq FROM session_steps ORDER BY seq").fetchall()
        assert rows == [(1,), (2,)]
    finally:
        await store.close()
