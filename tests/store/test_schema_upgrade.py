"""A database written by an older version: ``Store.init`` adds the columns it lacks (on SQLite and
on PostgreSQL)."""

from __future__ import annotations

import pytest

from store import SchemaError, Store
from tests.raw_sql import raw_sql


def _ts(store_url: str) -> str:
    return "TIMESTAMP WITH TIME ZONE" if store_url.startswith("postgres") else "DATETIME"


async def _columns(store_url: str, table: str) -> set[str]:
    if store_url.startswith("postgres"):
        rows = await raw_sql(
            store_url,
            "SELECT column_name AS name FROM information_schema.columns WHERE table_name = ?",
            table,
        )
    else:
        rows = await raw_sql(store_url, f"PRAGMA table_info({table})")
    return {r["name"] for r in rows}


async def test_init_adds_missing_columns_and_keeps_rows(store_url: str) -> None:
    # gateway_sessions as an older version made it: no closed_at, no completion_mode, no refunded_steps
    json_type = "JSON"
    await raw_sql(
        store_url,
        "CREATE TABLE gateway_sessions (session_id VARCHAR(128) PRIMARY KEY, "
        "status VARCHAR(32) NOT NULL, max_steps INTEGER NOT NULL, total_steps INTEGER NOT NULL, "
        f"step_counts {json_type}, job_id VARCHAR(128), env_name VARCHAR(128), "
        f"group_id VARCHAR(128), close_reason VARCHAR, created_at {_ts(store_url)}, "
        f"updated_at {_ts(store_url)})",
    )
    await raw_sql(
        store_url,
        "INSERT INTO gateway_sessions (session_id, status, max_steps, total_steps, step_counts) "
        "VALUES ('old', 'active', 5, 2, '{\"m\": 2}')",
    )
    store = Store(store_url)
    try:
        await store.init()
        await store.init()  # idempotent
        st = await store.load_gateway_session("old")
        assert st is not None
        assert (
            st.total_steps,
            st.max_steps,
            st.step_counts,
            st.closed_at,
            st.completion_mode,
            st.refunded_steps,
        ) == (2, 5, {"m": 2}, None, None, 0)
    finally:
        await store.close()
    assert {"closed_at", "completion_mode", "refunded_steps"} <= await _columns(store_url, "gateway_sessions")


async def test_missing_not_null_column_without_default_is_a_clear_error(store_url: str) -> None:
    await raw_sql(
        store_url, "CREATE TABLE gateway_sessions (session_id VARCHAR(128) PRIMARY KEY)"
    )  # no status
    store = Store(store_url)
    try:
        with pytest.raises(SchemaError, match="gateway_sessions has no column status"):
            await store.init()
    finally:
        await store.close()
