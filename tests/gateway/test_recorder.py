"""The telemetry writer's two ways to commit: at once when it is idle, queued otherwise."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from gateway.metrics import Metrics
from gateway.recorder import TelemetryWriter
from store import Store, step_record


@pytest.fixture
def db_url(store_url: str) -> str:
    """This module runs on both backends (SQLite, and PostgreSQL with shared sessions)."""
    return store_url


def _step(seq: int) -> dict[str, object]:
    return step_record(session_id="s", seq=seq, step_id=seq, llm_model="m", endpoint="chat.completions")


async def test_idle_writer_commits_at_once_and_a_busy_one_queues(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    store = Store(f"sqlite:///{db}")
    await store.init()
    writer = TelemetryWriter(store, Metrics(), strict=True, batch_max=16, queue_max=100)
    writer.start()
    try:
        fut = writer.enqueue(_step(1), None)
        assert fut is not None and fut.done() and fut.exception() is None  # committed inside enqueue
        lock = sqlite3.connect(db, isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")  # another writer holds the DB: enqueue cannot commit at once
        fut2 = writer.enqueue(_step(2), None)
        fut3 = writer.enqueue(_step(3), None)  # queued behind it, in order
        assert fut2 is not None and fut3 is not None and not fut2.done()
        await asyncio.sleep(0.2)
        assert not fut2.done()
        lock.execute("ROLLBACK")
        lock.close()
        await asyncio.wait_for(asyncio.gather(fut2, fut3), 5)
        rows = sqlite3.connect(db).execute("SELECT seq FROM session_steps ORDER BY seq").fetchall()
        assert rows == [(1,), (2,), (3,)]
    finally:
        await writer.stop()
        await store.close()
