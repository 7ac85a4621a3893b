"""Group commit of the launcher's row writes (``store.group``) on a real SQLite store: concurrent
sessions' writes share transactions, every caller returns after its own write committed, and a
write that fails reaches only its own caller while the others in its transaction still commit."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from store import JobEnvironment, SessionAttempt, Store
from store import group as group_module


def _rows(n: int) -> list[JobEnvironment]:
    return [
        JobEnvironment(
            session_id=f"s{i}",
            job_id="j",
            env_name="e",
            case_id=str(i),
            llm_model="m",
            group_id="g",
            sample_index=0,
            env_params={},
            status="pending",
        )
        for i in range(n)
    ]


async def test_concurrent_writes_share_transactions_and_a_bad_one_fails_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches: list[int] = []
    real_commit = group_module.GroupCommit._commit

    async def counting(self: group_module.GroupCommit, batch: list) -> None:  # type: ignore[type-arg]
        batches.append(len(batch))
        await real_commit(self, batch)

    monkeypatch.setattr(group_module.GroupCommit, "_commit", counting)
    db = tmp_path / "t.db"
    store = Store(f"sqlite://{db}")
    await store.init()
    try:
        await store.add_job_sessions(_rows(40))
        writes = [store.update_job_session(f"s{i}", status="running", attempts=1) for i in range(40)]
        writes.insert(17, store.update_job_session("s3", status=None))  # fails in the database: NOT NULL
        with pytest.raises(ValueError, match="no column no_such_column"):  # refused before it is queued
            await store.update_job_session("s3", no_such_column=1)
        writes.append(
            store.record_attempt(
                SessionAttempt(
                    session_id="s5", attempt=1, job_id="j", status="succeeded", outcome="succeeded"
                )
            )
        )
        results = await asyncio.gather(*writes, return_exceptions=True)
    finally:
        await store.close()
    errors = [r for r in results if isinstance(r, BaseException)]
    assert len(errors) == 1 and "NOT NULL constraint failed: job_environments.status" in str(errors[0])
    assert results[-1] is True  # record_attempt's own result
    con = sqlite3.connect(db)
    try:
        assert con.execute(
            "SELECT count(*) FROM job_environments WHERE status = 'running' AND attempts = 1"
        ).fetchall() == [(40,)]
        assert con.execute("SELECT env_id, outcome FROM session_attempts").fetchall() == [("s5", "succeeded")]
    finally:
        con.close()
    # the 42 writes queued at once went into one transaction; it failed, so it was redone write
    # by write to find whose write it was
    assert batches == [42] + [1] * 42
