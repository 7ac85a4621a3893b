"""The evaluation write (``store.launcher_rows.write_evaluation``): the end of a session in a job
(``Store.finish_job_session``) and a regrade (``Store.record_regrade``) both go through it, and
each leaves the same reward on the session row and on the session's last step. Run on SQLite and
on PostgreSQL (``store_url``); the rows are read back with plain SQL, below the Store."""

from __future__ import annotations

import json
from typing import Any

import pytest

from store import GatewaySession, JobEnvironment, SessionResult, SessionStep, Store, launcher_rows
from tests.raw_sql import raw_sql


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


async def _tables(url: str, sid: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The session's ``job_environments`` row and its steps (seq order), as stored."""
    (row,) = await raw_sql(
        url,
        "SELECT reward, eval_status, eval_reason, eval_history, finished "
        "FROM job_environments WHERE env_id = ?",
        sid,
    )
    steps = await raw_sql(
        url,
        "SELECT seq, reward, step_reward, is_terminal, meta_json FROM session_steps "
        "WHERE session_id = ? ORDER BY seq",
        sid,
    )
    row["eval_history"] = _json(row["eval_history"])
    for st in steps:
        st["meta_json"] = _json(st["meta_json"])
    return row, steps


@pytest.fixture
def evaluation_writes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool]]:
    """``(session id, keep_previous)`` of every call of the evaluation write, which still runs."""
    calls: list[tuple[str, bool]] = []
    real = launcher_rows.write_evaluation

    def spy(conn: Any, session_id: str, **kw: Any) -> Any:
        calls.append((session_id, kw.get("keep_previous", False)))
        return real(conn, session_id, **kw)

    monkeypatch.setattr(launcher_rows, "write_evaluation", spy)
    return calls


async def test_job_finish_and_regrade_write_one_reward_to_both_tables(
    store_url: str, evaluation_writes: list[tuple[str, bool]]
) -> None:
    st = Store(store_url)
    await st.init()
    try:
        await st.add_job_sessions(
            [
                JobEnvironment(
                    session_id=sid, job_id="j", env_name="e", case_id=sid, llm_model="m", group_id=f"g-{sid}"
                )
                for sid in ("s1", "s2")
            ]
        )
        await st.write_batch(
            [
                SessionStep(
                    session_id="s1",
                    seq=k,
                    step_id=k,
                    llm_model="m",
                    endpoint="chat.completions",
                    meta_json={"route": "m", "k": k},
                )
                for k in (1, 2, 3)
            ],
            [GatewaySession(session_id="s1", total_steps=3)],
        )

        # the job's end of a session
        first = {"status": "scored", "score": 7.5}
        await st.finish_job_session(
            "s1",
            SessionResult(
                status="succeeded", reward=7.5, eval_status="scored", eval_reason="first", evaluation=first
            ),
        )
        assert evaluation_writes == [("s1", False)]
        row, steps = await _tables(store_url, "s1")
        assert (row["reward"], row["eval_status"], row["eval_reason"], row["eval_history"]) == (
            7.5,
            "scored",
            "first",
            None,
        )
        assert bool(row["finished"])
        assert [(s["reward"], s["step_reward"], bool(s["is_terminal"])) for s in steps] == [
            (None, None, False),
            (None, None, False),
            (7.5, 7.5, True),
        ]
        assert steps[2]["meta_json"] == {"route": "m", "k": 3, "evaluation": first}
        assert [s["meta_json"] for s in steps[:2]] == [{"route": "m", "k": 1}, {"route": "m", "k": 2}]

        # a regrade: the same write, the previous evaluation kept on both tables
        second = {"status": "scored", "score": 2.0, "regraded_at": "t"}
        previous = await st.record_regrade(
            "s1",
            reward=2.0,
            eval_status="scored",
            eval_reason="second",
            eval_detail={"raw_repr": "2"},
            eval_meta=second,
        )
        assert evaluation_writes == [("s1", False), ("s1", True)]
        row, steps = await _tables(store_url, "s1")
        assert (row["reward"], row["eval_status"], row["eval_reason"]) == (2.0, "scored", "second")
        assert previous is not None and row["eval_history"] == [previous]
        assert (previous["reward"], previous["eval_status"], previous["eval_reason"]) == (
            7.5,
            "scored",
            "first",
        )
        assert [(s["reward"], s["step_reward"]) for s in steps] == [(None, None), (None, None), (2.0, 2.0)]
        assert steps[2]["meta_json"] == {
            "route": "m",
            "k": 3,
            "evaluation": second,
            "evaluation_history": [first],
        }

        # a session without steps: the session row alone; an unknown session: KeyError, nothing written
        await st.finish_job_session(
            "s2", SessionResult(status="succeeded", reward=1.0, evaluation={"status": "scored"})
        )
        row, steps = await _tables(store_url, "s2")
        assert (row["reward"], steps) == (1.0, [])
        for write in (
            lambda: st.finish_job_session("nope", SessionResult(status="succeeded", reward=1.0)),
            lambda: st.record_regrade(
                "nope", reward=1.0, eval_status="scored", eval_reason=None, eval_detail=None, eval_meta={}
            ),
        ):
            with pytest.raises(KeyError, match="no session 'nope'"):
                await write()
        assert evaluation_writes == [
            ("s1", False),
            ("s1", True),
            ("s2", False),
            ("nope", False),
            ("nope", True),
        ]
        assert await raw_sql(store_url, "SELECT env_id FROM job_environments ORDER BY env_id") == [
            {"env_id": "s1"},
            {"env_id": "s2"},
        ]
    finally:
        await st.close()
