"""store.search: the full-text index of the steps, on SQLite (FTS5) and PostgreSQL (tsvector), built
from steps stored as the gateway stores them (deltas, packed), kept in step as sessions grow,
move to an earlier attempt or disappear; every word of a query must match; query syntax of the
user's never reaches the engine. Also the viewer's list neighbours and groups (store.queries)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from store import JobEnvironment, Store, step_record
from store.engine import make_engine, parse_db_url
from store.queries import SessionFilter, ViewerQueries
from store.search import MARK_END, MARK_START, StepSearch, fts5_query, index_path, step_texts
from store.stepcodec import StepEncoder

SYSTEM = {"role": "system", "content": "You read logs."}


def _steps(sid: str, job: str, turns: list[tuple[str, str]], enc: StepEncoder) -> list[dict[str, Any]]:
    """One session's steps as the gateway writes them: each step re-sends the whole history."""
    rows, history = [], [SYSTEM]
    for seq, (user, answer) in enumerate(turns, start=1):
        history = [*history, {"role": "user", "content": user}]
        row = step_record(
            session_id=sid,
            seq=seq,
            step_id=seq,
            llm_model="m",
            endpoint="chat.completions",
            job_id=job,
            env_name="e",
            messages=list(history),
            request={"model": "m", "messages": list(history)},
            response={"choices": [{"message": {"role": "assistant", "content": answer}}]},
        )
        enc.committed(enc.encode(row))
        rows.append(row)
        history = [*history, {"role": "assistant", "content": answer}]
    return rows


@pytest.fixture
async def store(store_url: str):  # type: ignore[no-untyped-def]
    s = Store(store_url)
    await s.init()
    await s.add_job_sessions(
        [
            JobEnvironment(
                session_id=f"s{i}",
                job_id=("j1", "j2")[i % 2],
                env_name="e",
                case_id=f"c{i // 2}",
                llm_model="m",
                group_id=f"g{i // 2}",
                sample_index=i % 2,
            )
            for i in range(4)
        ]
    )
    enc = StepEncoder()
    await s.write_batch(
        _steps(
            "s0",
            "j1",
            [("count the failed logins", "reading auth.log"), ("tool output: 42 lines", "ANSWER-42")],
            enc,
        )
        + _steps("s1", "j2", [("count the failed logins", "ANSWER-7")], enc)
        + _steps("s2", "j1", [('say "quoted" OR NOT * col:x', "done")], enc),
        [],
    )
    yield s
    await s.close()


@pytest.fixture
async def index(store: Store, store_url: str):  # type: ignore[no-untyped-def]
    engine = make_engine(parse_db_url(store_url), writer=False)
    search = StepSearch(engine)
    await search.ensure()
    yield search
    await search.close()
    await engine.dispose()


async def _hits(index: StepSearch, words: str, **kw: Any) -> list[tuple[str, int]]:
    return [(h.session_id, h.seq) for h in (await index.search(words, **kw)).hits]


async def test_search_finds_every_word_in_one_step_of_packed_delta_steps(index: StepSearch) -> None:
    assert await index.pending() == 3
    assert await index.refresh() == 0 and await index.pending() == 0
    assert sorted(await _hits(index, "failed logins")) == [("s0", 1), ("s1", 1)]
    assert await _hits(index, "answer-42") == [("s0", 2)]  # the answer of step 2, case ignored
    assert await _hits(index, "42 lines") == [("s0", 2)]  # a message new at step 2
    assert await _hits(index, "failed answer-7") == [("s1", 1)]  # every word, in one step
    assert await _hits(index, "failed nowhere") == []
    assert await _hits(index, "failed logins", job_id="j2") == [("s1", 1)]
    assert await _hits(index, "   ") == []
    snippet = (await index.search("answer-42")).hits[0].snippet
    assert MARK_START in snippet and MARK_END in snippet
    assert snippet.replace(MARK_START, "").replace(MARK_END, "") == "tool output: 42 lines\nANSWER-42"


async def test_a_repeated_history_is_indexed_once(index: StepSearch) -> None:
    await index.refresh()
    # step 2 of s0 re-sends "count the failed logins": only step 1 holds it
    assert sorted(await _hits(index, "count")) == [("s0", 1), ("s1", 1)]


async def test_query_syntax_of_the_user_is_plain_words(index: StepSearch) -> None:
    await index.refresh()
    assert await _hits(index, 'say "quoted" OR NOT * col:x') == [("s2", 1)]
    assert await _hits(index, "NOT") == [("s2", 1)]
    assert await _hits(index, '"') == []
    assert fts5_query('a "b" c*') == '"a" """b""" "c*"'


async def test_refresh_follows_new_moved_and_removed_steps(
    index: StepSearch, store: Store, store_url: str
) -> None:
    await index.refresh()
    enc = StepEncoder()
    await store.write_batch(_steps("s3", "j2", [("brand new words zebra", "ok")], enc), [])
    assert await index.pending() == 1 and await _hits(index, "zebra") == []
    await index.refresh()
    assert await _hits(index, "zebra") == [("s3", 1)]
    engine = make_engine(parse_db_url(store_url), writer=True)
    try:
        async with engine.begin() as conn:  # a retry moves the steps to an earlier attempt's id
            await conn.execute(text("UPDATE session_steps SET session_id = 's3~a1' WHERE session_id = 's3'"))
        await store.write_batch(_steps("s3", "j2", [("second attempt yak", "ok")], StepEncoder()), [])
        assert await index.pending() == 2
        await index.refresh()
        assert await _hits(index, "zebra") == [("s3~a1", 1)] and await _hits(index, "yak") == [("s3", 1)]
        async with engine.begin() as conn:
            await conn.execute(text("DELETE FROM session_steps WHERE session_id = 's3~a1'"))
        await index.refresh()
        assert await _hits(index, "zebra") == [] and await index.pending() == 0
    finally:
        await engine.dispose()


async def test_refresh_in_parts_says_what_is_left(index: StepSearch) -> None:
    assert await index.refresh(max_sessions=2) == 1
    assert len(await _hits(index, "failed")) + len(await _hits(index, "quoted")) == 2
    page = await index.search("failed")
    assert page.pending == 1
    assert await index.refresh(max_sessions=2) == 0 and (await index.search("failed")).pending == 0


def test_step_texts_new_messages_and_answer_only() -> None:
    rows = [
        {
            "messages": [SYSTEM, {"role": "user", "content": "hi\x02there\x00"}],
            "response": {
                "choices": [
                    {
                        "message": {
                            "role": "assistant",
                            "content": None,
                            "tool_calls": [
                                {
                                    "id": "call_9",
                                    "type": "function",
                                    "function": {"name": "grep", "arguments": '{"p": 1}'},
                                }
                            ],
                        }
                    }
                ]
            },
        },
        {
            "messages": [
                SYSTEM,
                {"role": "user", "content": "hi\x02there\x00"},
                {"role": "tool", "tool_call_id": "call_9", "content": "result"},
            ],
            "response": {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "text", "text": "bye"}],
            },
        },
    ]
    first, second = step_texts(rows)
    assert first == 'You read logs.\nhi there \ngrep\n{"p": 1}'
    assert second == "result\nbye"
    assert "call_9" not in first + second and "assistant" not in first + second


async def test_neighbours_follow_the_list_order_and_filters(store: Store, store_url: str) -> None:
    await store.update_job_session("s0", finished=True, status="succeeded", reward=10.0, eval_status="scored")
    await store.update_job_session("s2", finished=True, status="failed", reward=2.0, eval_status="scored")
    engine = make_engine(parse_db_url(store_url), writer=False)
    q = ViewerQueries(engine)
    try:
        assert await q.neighbours("j1", SessionFilter(), "s0") == {
            "prev": None,
            "next": "s2",
            "position": 1,
            "total": 2,
        }
        assert await q.neighbours("j1", SessionFilter(), "s2") == {
            "prev": "s0",
            "next": None,
            "position": 2,
            "total": 2,
        }
        assert await q.neighbours("j1", SessionFilter(), "s2", sort="score") == {
            "prev": None,
            "next": "s0",
            "position": 1,
            "total": 2,
        }
        assert await q.neighbours("j1", SessionFilter(status="failed"), "s2") == {
            "prev": None,
            "next": None,
            "position": 1,
            "total": 1,
        }
        assert await q.neighbours("j1", SessionFilter(status="failed"), "s0") is None
        assert await q.neighbours("j2", SessionFilter(), "s0") is None
        groups = await q.groups("j1")
        assert groups.total == 2
        assert [(g["group_id"], g["n"], g["passes"], g["scored"], g["mean_score"]) for g in groups.rows] == [
            ("g0", 1, 1, 1, 10.0),
            ("g1", 1, 0, 1, 2.0),
        ]
    finally:
        await engine.dispose()


async def test_on_sqlite_the_index_is_a_file_of_its_own(index: StepSearch, store_url: str) -> None:
    await index.refresh()
    if not store_url.startswith("sqlite"):
        assert index.index_file is None  # PostgreSQL: two tables of the store
        return
    store_file = Path(store_url.removeprefix("sqlite://"))
    assert index.index_file == store_file.with_name("store.search.db") and index.index_file.is_file()
    con = sqlite3.connect(store_file)
    try:
        tables = {r[0] for r in con.execute("select name from sqlite_master where type = 'table'")}
    finally:
        con.close()
    assert "session_steps" in tables and not any(t.startswith("step_search") for t in tables)
    assert index_path(Path("/x/env_trajs.db")) == Path("/x/env_trajs.search.db")


async def test_a_refresh_that_need_not_wait_skips_a_running_one(index: StepSearch) -> None:
    async with index._lock:  # another refresh (the viewer's start) is running
        assert await index.refresh(wait=False) is None
    assert await index.pending() == 3
    assert await index.refresh(wait=False) == 0 and await index.pending() == 0


async def test_a_lone_surrogate_in_a_step_is_indexed_and_the_rest_still_found(
    index: StepSearch, store: Store
) -> None:
    """A message holding ``"\\ud800"`` (a JSON escape no UTF-8 carries): indexed with U+FFFD in its
    place; every other step is still found, and so is that one by its other words."""
    enc = StepEncoder()
    await store.write_batch(_steps("s3", "j1", [("odd \ud800 failed logins", "ANSWER-\udfff-9")], enc), [])
    assert await index.refresh() == 0 and await index.pending() == 0
    assert sorted(await _hits(index, "failed logins")) == [("s0", 1), ("s1", 1), ("s3", 1)]
    (hit,) = (await index.search("odd")).hits
    assert "odd \ufffd failed logins" in hit.snippet.replace(MARK_START, "").replace(MARK_END, "")
    assert (await index.search("\ud800 odd")).hits == [hit]  # a query holding one too
