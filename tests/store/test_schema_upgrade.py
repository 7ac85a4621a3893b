"""A database written by an older version: ``Store.init`` adds the columns it lacks."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from store import Store
from store.repo import SchemaError


async def test_init_adds_missing_columns_and_keeps_rows(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    con = sqlite3.connect(db)
    # gateway_sessions as an older version made it: no closed_at, no completion_mode
    con.execute("CREATE TABLE gateway_sessions (session_id VARCHAR(128) PRIMARY KEY, status VARCHAR(32) NOT NULL, "
                "max_steps INTEGER NOT NULL, total_steps INTEGER NOT NULL, step_counts JSON, job_id VARCHAR(128), "
                "env_name VARCHAR(128), group_id VARCHAR(128), close_reason VARCHAR, created_at DATETIME, "
                "updated_at DATETIME)")
    con.execute("INSERT INTO gateway_sessions (session_id, status, max_steps, total_steps, step_counts) "
                "VALUES ('old', 'active', 5, 2, '{\"m\": 2}')")
    con.commit()
    con.close()
    store = Store(f"sqlite:///{db}")
    try:
        await store.init()
        await store.init()  # idempotent
        st = await store.load_gateway_session("old")
        assert st is not None
        assert (st.total_steps, st.max_steps, st.step_counts, st.closed_at, st.completion_mode) == (2, 5, {"m": 2},
                                                                                                    None, None)
    finally:
        await store.close()
    cols = {r[1] for r in sqlite3.connect(db).execute("PRAGMA table_info(gateway_sessions)")}
    assert {"closed_at", "completion_mode"} <= cols


async def test_missing_not_null_column_without_default_is_a_clear_error(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE gateway_sessions (session_id VARCHAR(128) PRIMARY KEY)")  # no status (NOT NULL)
    con.commit()
    con.close()
    store = Store(f"sqlite:///{db}")
    try:
        with pytest.raises(SchemaError, match="gateway_sessions has no column status"):
            await store.init()
    finally:
        await store.close()
