"""The training columns of ``session_steps`` (token ids, logprobs, policy version, prefix
continuity): added to an older database by ``Store.init``, stored exactly, NULL when unknown."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from sqlalchemy.dialects import sqlite
from sqlalchemy.schema import CreateTable

from store import SessionStep, Store, step_record

NEW = ("prompt_token_ids", "completion_token_ids", "completion_logprobs", "policy_version", "extends_prefix")


def _old_table_sql() -> str:
    """``session_steps`` as the version before these columns made it (today's DDL without them)."""
    ddl = str(CreateTable(SessionStep.__table__).compile(dialect=sqlite.dialect()))  # type: ignore[attr-defined]
    lines = [ln for ln in ddl.splitlines() if not any(ln.strip().startswith(n + " ") for n in NEW)]
    assert len(lines) == len(ddl.splitlines()) - len(NEW)
    return "\n".join(lines)


async def test_old_database_gets_the_columns_and_keeps_its_rows(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    con = sqlite3.connect(db)
    con.execute(_old_table_sql())
    con.execute(
        "INSERT INTO session_steps (record_id, session_id, seq, step_id, llm_model, endpoint, is_stream, "
        "status, is_terminal, is_truncated, is_session_completed, is_trainable) "
        "VALUES ('r0', 'old', 1, 1, 'm', 'chat.completions', 0, 'ok', 0, 0, 0, 1)"
    )
    con.commit()
    con.close()
    store = Store(f"sqlite:///{db}")
    try:
        await store.init()
        row = step_record(
            session_id="old",
            seq=2,
            step_id=2,
            llm_model="m",
            endpoint="chat.completions",
            prompt_token_ids=[1001, 7, 0],
            completion_token_ids=[104, 1000],
            completion_logprobs=[-0.125, None],
            policy_version=12,
            extends_prefix=True,
        )
        await store.write_batch([row], [])
        assert store.commit_now(
            [
                step_record(
                    session_id="old",
                    seq=3,
                    step_id=3,
                    llm_model="m",
                    endpoint="chat.completions",
                    extends_prefix=False,
                )
            ],
            [],
        )
        steps = await store.trajectory("old")
    finally:
        await store.close()
    got = [tuple(getattr(s, n) for n in NEW) for s in steps]
    assert got == [
        (None, None, None, None, None),
        ([1001, 7, 0], [104, 1000], [-0.125, None], 12, True),
        (None, None, None, None, False),
    ]
    con = sqlite3.connect(db)
    nulls = con.execute(
        "SELECT seq FROM session_steps WHERE prompt_token_ids IS NULL ORDER BY seq"
    ).fetchall()
    assert nulls == [(1,), (3,)]  # unknown is SQL NULL, not the JSON text 'null'


async def test_sessions_spanning_policy_versions(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path}/v.db")
    try:
        await store.init()
        rows = [
            step_record(
                session_id=sid,
                seq=i + 1,
                step_id=i + 1,
                llm_model="m",
                endpoint="chat.completions",
                job_id=job,
                policy_version=v,
            )
            for job, sid, versions in (
                ("j", "one", [2, 2]),
                ("j", "two", [None, 2, 3]),
                ("j", "three", [4, 5]),
                ("other", "four", [1, 2]),
            )
            for i, v in enumerate(versions)
        ]
        await store.write_batch(rows, [])
        assert await store.policy_version_spans("j") == {"three": [4, 5], "two": [None, 2, 3]}
        assert await store.policy_versions("one") == [2]
        assert await store.policy_versions("two") == [None, 2, 3]
    finally:
        await store.close()
