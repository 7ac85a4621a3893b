"""Steps stored as deltas (:mod:`store.stepcodec`): what is written is only what the session's last
committed step did not hold, and every read rebuilds each value exactly (the same JSON text)."""

from __future__ import annotations

import copy
import json
import sqlite3
import zlib
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

import store.batch_writer as store_batch_writer
import store.engine as store_engine
from store import Store, json_dumps, step_record
from store.engine import make_engine, make_sync_sqlite_engine
from store.queries import ViewerQueries
from store.stepcodec import StepDecodeError, StepEncoder, decode_rows

SYS = {"role": "system", "content": "be brief"}


def conv(n: int, *, edit: int | None = None) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [SYS]
    for i in range(n):
        msgs.append({"role": "user", "content": f"question {i} " + "x" * 50 + ("!" if edit == i else "")})
        msgs.append({"role": "assistant", "content": f"answer {i}", "tool_calls": None})
    return msgs


def row(
    sid: str,
    seq: int,
    messages: list[Any],
    prompt: list[int] | None = None,
    completion: list[int] | None = None,
    **kw: Any,
) -> dict[str, Any]:
    request = {"model": "m", "messages": messages, "temperature": 0.5}
    return step_record(
        session_id=sid,
        seq=seq,
        step_id=seq,
        llm_model="m",
        endpoint="chat.completions",
        messages=messages,
        request=request,
        response={"choices": [{"message": {"content": "a"}}]},
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        **kw,
    )


ORIGINALS = [
    row("s", 1, conv(0) + [{"role": "user", "content": "q"}], list(range(100)), [7, 8, 9]),
    row("s", 2, conv(1), [*range(100), 7, 8, 9, 5, 5], [1]),  # extends: prompt + completion kept
    row("s", 3, conv(2), [*range(100), 7, 8, 4, 5, 5, 1, 2], [3]),  # token drift inside step 2's completion
    row("s", 4, conv(2, edit=0), None, None),  # history rewritten, tokens unknown
    row("s", 5, [{"role": "user", "content": "summary"}], [9, 9], [1]),  # compaction
    row("s", 6, conv(3, edit=0), [9, 9, 1, 4], [2]),
]


def encode_all(enc: StepEncoder, originals: list[dict[str, Any]]) -> list[dict[str, Any]]:
    stored = []
    for r in originals:
        r = copy.deepcopy(r)
        enc.committed(enc.encode(r))
        stored.append(r)
    return stored


def test_encode_stores_only_what_is_new_and_decode_rebuilds_it() -> None:
    stored = encode_all(StepEncoder(), ORIGINALS)
    # [version, seq - base seq, messages kept, answer items sent back, request mode, from, prompt ids kept],
    # trailing zeros left out
    encs = [r["encoding"] for r in stored]
    assert encs[0] == [3, 0, 0, 0, 1]  # no base: the messages once, not twice
    assert stored[0]["request"] == {"model": "m", "messages": None, "temperature": 0.5}
    assert stored[0]["messages"] == ORIGINALS[0]["messages"]
    assert encs[1] == [3, 1, 1, 0, 3, 0, 103]  # the same request apart from its messages: not stored
    assert stored[1]["request"] is None
    assert stored[1]["messages"] == conv(1)[1:] and stored[1]["prompt_token_ids"] == [5, 5]
    assert encs[2] == [3, 1, 3, 0, 3, 0, 64]  # token drift: whole blocks kept
    assert stored[2]["prompt_token_ids"] == [*range(64, 100), 7, 8, 4, 5, 5, 1, 2]
    assert encs[3] == [3, 1, 1, 0, 3]  # the first user message edited; tokens unknown
    assert encs[4] == [3, 1, 0, 0, 3]  # nothing in common but the request's other fields
    assert encs[5] == [3, 1, 0, 0, 3, 0, 3] and stored[5]["prompt_token_ids"] == [4]
    decode_rows(stored)
    for got, want in zip(stored, ORIGINALS, strict=True):
        for col in ("messages", "request", "prompt_token_ids", "completion_token_ids"):
            assert json_dumps(got[col]) == json_dumps(want[col]), (want["seq"], col)
        assert got["encoding"] is None
    stored[1]["messages"][0]["content"] = "changed"  # each rebuilt row owns its objects
    assert stored[2]["messages"][0]["content"] == "be brief"


def test_the_answer_sent_back_is_not_stored_again() -> None:
    answer = {"role": "assistant", "content": "a", "tool_calls": [{"id": "t", "function": {"name": "f"}}]}
    first = row("s", 1, [SYS])
    first["response"] = {"choices": [{"message": answer}]}
    second = row("s", 2, [SYS, answer, {"role": "tool", "content": "out"}])
    stored = encode_all(StepEncoder(), [first, second])
    assert stored[1]["encoding"] == [3, 1, 1, 1, 3] and stored[1]["messages"] == [
        {"role": "tool", "content": "out"}
    ]
    decode_rows(stored)
    assert stored[1]["messages"] == second["messages"] and stored[1]["request"] == second["request"]


def test_only_committed_steps_are_bases() -> None:
    enc = StepEncoder()
    first = copy.deepcopy(ORIGINALS[0])
    enc.encode(first)  # never committed (refused by the store, dropped)
    second = copy.deepcopy(ORIGINALS[1])
    enc.committed(enc.encode(second))
    assert second["encoding"] == [3, 0, 0, 0, 1] and second["messages"] == ORIGINALS[1]["messages"]
    stored = encode_all(StepEncoder(), ORIGINALS[:2])
    with pytest.raises(StepDecodeError, match="not in the store"):
        decode_rows(stored[1:])  # its base is gone


def test_a_base_recorded_later_is_named_backwards() -> None:
    """Parallel calls of a session: step 3 committed before step 2 was encoded, so step 2's base is
    step 3 (the encoding holds seq - base seq = -1) and rebuilds from it."""
    enc = StepEncoder()
    first, third, second = (
        copy.deepcopy(ORIGINALS[0]),
        row("s", 3, conv(0) + [{"role": "user", "content": "q"}]),
        row("s", 2, conv(0) + [{"role": "user", "content": "q"}, {"role": "user", "content": "r"}]),
    )
    wants = [copy.deepcopy(r) for r in (first, third, second)]
    for r in (first, third, second):
        enc.committed(enc.encode(r))
    assert third["encoding"] == [3, 2, 2, 0, 3] and second["encoding"] == [3, -1, 2, 0, 3]
    assert second["messages"] == [{"role": "user", "content": "r"}]
    decode_rows([first, second, third])
    for got, want in zip((first, third, second), wants, strict=True):
        assert json_dumps(got["messages"]) == json_dumps(want["messages"])
        assert json_dumps(got["request"]) == json_dumps(want["request"])


async def test_rows_read_back_in_full_through_every_read(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    store = Store(f"sqlite:///{db}")
    engine: AsyncEngine | None = None
    try:
        await store.init()
        stored = encode_all(StepEncoder(), ORIGINALS)
        await store.write_batch(stored[:3], [])
        assert store.commit_now(stored[3:], [])
        traj = await store.trajectory("s")
        assert [s.seq for s in traj] == [1, 2, 3, 4, 5, 6]
        for got, want in zip(traj, ORIGINALS, strict=True):
            assert json_dumps(got.messages) == json_dumps(want["messages"])
            assert json_dumps(got.request) == json_dumps(want["request"])
            assert got.prompt_token_ids == want["prompt_token_ids"] and got.encoding is None
        engine = make_engine(store.url, writer=False)
        q = ViewerQueries(engine)
        assert [r["messages"] for r in await q.steps("s")] == [r["messages"] for r in ORIGINALS]
        one = await q.step("s", 3)
        assert one is not None and one["request"] == ORIGINALS[2]["request"]
        assert (await q.steps_of(["s"]))["s"][5]["prompt_token_ids"] == [9, 9, 1, 4]
        moved = await store.reset_for_retry("s", 1)  # an earlier attempt keeps its steps, as deltas
        assert moved == 6
        again = await q.earlier_attempt_steps("s")
        assert [r["messages"] for r in again] == [r["messages"] for r in ORIGINALS]
    finally:
        if engine is not None:
            await engine.dispose()
        await store.close()
    con = sqlite3.connect(db)
    raw = con.execute(
        "SELECT messages, request, response, prompt_token_ids, encoding, packed FROM session_steps "
        "WHERE seq = 2"
    ).fetchone()
    con.close()
    # the new messages, the response and the new token ids, compressed; the columns NULL
    assert raw[:4] == (None, None, None, None) and raw[4] == "[3, 1, 1, 0, 3, 0, 103]"
    assert json.loads(zlib.decompress(raw[5])) == [
        conv(1)[1:],
        None,
        ORIGINALS[1]["response"],
        [5, 5],
        [1],
        None,
    ]


def test_rows_of_the_first_format_still_decode() -> None:
    """Rows written with encoding version 1 (``[1, base seq, kept, answer, request mode,
    conversation key, from, prompt ids kept]``) read back as they did."""
    answer = {"role": "assistant", "content": "a1"}
    first = row("s", 1, [SYS, {"role": "user", "content": "q1"}], [1, 2, 3], [4])
    first["response"] = {"choices": [{"message": answer}]}
    want = row(
        "s",
        2,
        [SYS, {"role": "user", "content": "q1"}, answer, {"role": "user", "content": "q2"}],
        [1, 2, 3, 4, 5],
        [6],
    )
    stored_first = {
        **first,
        "request": {"model": "m", "messages": None, "temperature": 0.5},
        "encoding": [1, None, 0, 0, 1, 0, 0, 0],
    }
    stored_second = {
        **want,
        "messages": [{"role": "user", "content": "q2"}],
        "request": None,
        "prompt_token_ids": [5],
        "encoding": [1, 1, 2, 1, 3, 0, 0, 4],
    }
    rows = [stored_second, stored_first]  # any order
    decode_rows(rows)
    assert json_dumps(stored_second["messages"]) == json_dumps(want["messages"])
    assert json_dumps(stored_second["request"]) == json_dumps(want["request"])
    assert stored_second["prompt_token_ids"] == [1, 2, 3, 4, 5] and stored_second["encoding"] is None
    assert json_dumps(stored_first["request"]) == json_dumps(first["request"])


@pytest.mark.parametrize(
    "encoding",
    [[4, 1, 0], [3, None], [3, 0, 0, 0, 0, 0, 0, 0], [1, None, 0, 0, 1], [2], [2, None, 1], ["2", 1]],
)
def test_an_encoding_of_another_format_is_refused(encoding: list[Any]) -> None:
    stored = row("s", 1, [SYS])
    stored["encoding"] = encoding
    with pytest.raises(StepDecodeError, match="encoding this version cannot read"):
        decode_rows([stored])


def protocol_rows(
    endpoint: str, answers: list[list[dict[str, Any]]], responses: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """A session of ``endpoint`` (``responses``: instructions + input items; ``messages``: system
    + messages) whose step k+1 sends back ``answers[k]`` then a new user message."""
    key, lead = ("input", 1) if endpoint == "responses" else ("messages", 1 if endpoint == "messages" else 0)
    conversation: list[Any] = [SYS, {"role": "user", "content": "u0"}]
    rows = []
    for k, response in enumerate(responses):
        request = {"model": "m", key: conversation[lead:], "max_tokens": 9}
        rows.append(
            step_record(
                session_id="s",
                seq=k + 1,
                step_id=k + 1,
                llm_model="m",
                endpoint=endpoint,
                messages=conversation,
                request=request,
                response=response,
            )
        )
        if k < len(answers):
            conversation = [*conversation, *answers[k], {"role": "user", "content": f"u{k + 1}"}]
    return rows


REASONING = {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "plan"}]}
OUT_MESSAGE = {
    "type": "message",
    "id": "msg_1",
    "status": "completed",
    "role": "assistant",
    "content": [{"type": "output_text", "text": "done", "annotations": []}],
}
CALL = {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "sh", "arguments": "{}"}
BLOCKS = [{"type": "thinking", "thinking": "hm", "signature": "sig"}, {"type": "text", "text": "done"}]


@pytest.mark.parametrize(
    ("endpoint", "responses", "answers", "answer_counts"),
    [
        (
            "chat.completions",
            [{"choices": [{"message": {"role": "assistant", "content": "a", "reasoning_content": "r"}}]}] * 3,
            [
                [{"role": "assistant", "content": "a", "reasoning_content": "r"}],
                [{"role": "assistant", "content": "a"}],
            ],
            [1, 0],
        ),  # the second answer sent back without its reasoning: stored
        (
            "responses",
            [{"object": "response", "output": [REASONING, OUT_MESSAGE, CALL]}] * 3,
            [[REASONING, OUT_MESSAGE, CALL], [REASONING, {**OUT_MESSAGE, "status": None}, CALL]],
            [3, 1],
        ),  # one item changed: the items before it are references, the rest stored
        (
            "messages",
            [{"type": "message", "role": "assistant", "content": BLOCKS, "stop_reason": "end_turn"}] * 3,
            [[{"role": "assistant", "content": BLOCKS}], [{"content": BLOCKS, "role": "assistant"}]],
            [1, 0],
        ),  # the same keys in another order: another JSON text, stored
    ],
)
def test_the_answer_sent_back_is_a_reference_on_every_protocol(
    endpoint: str,
    responses: list[dict[str, Any]],
    answers: list[list[dict[str, Any]]],
    answer_counts: list[int],
) -> None:
    originals = protocol_rows(endpoint, answers, responses)
    stored = encode_all(StepEncoder(), originals)
    assert [r["encoding"][3] for r in stored[1:]] == answer_counts
    for r, a, n in zip(stored[1:], answers, answer_counts, strict=True):
        assert json_dumps(r["messages"]) == json_dumps([*a[n:], originals[r["seq"] - 1]["messages"][-1]])
        assert r["request"] is None  # the conversation is rebuilt from the messages, the rest from the base
    decode_rows(stored)
    for got, want in zip(stored, originals, strict=True):
        for col in ("messages", "request", "response"):
            assert json_dumps(got[col]) == json_dumps(want[col]), (endpoint, want["seq"], col)


@pytest.fixture
def page_size_8k(monkeypatch: pytest.MonkeyPatch) -> int:
    """The store's page size set to 8 KiB (not SQLite's default), so a test sees it applied."""
    for module in (store_engine, store_batch_writer):
        monkeypatch.setattr(module, "SQLITE_PAGE_SIZE", 8192)
    return 8192


async def test_a_new_file_gets_the_stores_page_size_and_an_older_file_keeps_its_own(
    tmp_path: Path, page_size_8k: int
) -> None:
    old = tmp_path / "old.db"
    con = sqlite3.connect(old)
    con.execute("PRAGMA page_size=16384")
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("CREATE TABLE legacy (x)")  # a file made with other pages
    con.close()
    for path, page in ((tmp_path / "new.db", page_size_8k), (old, 16384)):
        store = Store(f"sqlite:///{path}")
        try:
            await store.init()
            stored = encode_all(StepEncoder(), ORIGINALS)
            assert store.commit_now(stored[:2], [])
            await store.write_batch(stored[2:], [])
            traj = await store.trajectory("s")
            assert [json_dumps(s.messages) for s in traj] == [json_dumps(r["messages"]) for r in ORIGINALS]
        finally:
            await store.close()
        con = sqlite3.connect(path)
        assert con.execute("PRAGMA page_size").fetchone()[0] == page, path
        assert con.execute("SELECT count(*) FROM session_steps").fetchone()[0] == 6
        con.close()


async def test_every_protocol_and_the_first_format_read_back_exactly_on_both_backends(store_url: str) -> None:
    """Sessions of the three protocols stored as deltas, and one stored in the first format,
    read back through the store with every value as written (SQLite and PostgreSQL)."""
    sessions = {
        "chat": protocol_rows(
            "chat.completions",
            [[{"role": "assistant", "content": "a"}]] * 2,
            [{"choices": [{"message": {"role": "assistant", "content": "a"}}]}] * 3,
        ),
        "resp": protocol_rows(
            "responses",
            [[REASONING, OUT_MESSAGE, CALL]] * 2,
            [{"object": "response", "output": [REASONING, OUT_MESSAGE, CALL]}] * 3,
        ),
        "msgs": protocol_rows(
            "messages",
            [[{"role": "assistant", "content": BLOCKS}]] * 2,
            [{"type": "message", "role": "assistant", "content": BLOCKS}] * 3,
        ),
    }
    written = []
    for sid, originals in sessions.items():
        for r in originals:
            r["session_id"] = sid
        written += encode_all(StepEncoder(), originals)
    assert [r["encoding"][3] for r in written if r["seq"] > 1] == [1, 1, 3, 3, 1, 1]
    answer = {"role": "assistant", "content": "a1"}
    v1_first = row("old", 1, [SYS], [1, 2], [3])
    v1_first["response"] = {"choices": [{"message": answer}]}
    v1_want = row("old", 2, [SYS, answer, {"role": "user", "content": "q"}], [1, 2, 3, 4], [5])
    v1_stored = {
        **v1_want,
        "messages": [{"role": "user", "content": "q"}],
        "request": None,
        "prompt_token_ids": [4],
        "encoding": [1, 1, 1, 1, 3, 0, 0, 3],
    }
    store = Store(store_url)
    try:
        await store.init()
        await store.write_batch([*written, v1_first, v1_stored], [])
        for sid, originals in [*sessions.items(), ("old", [v1_first, v1_want])]:
            traj = await store.trajectory(sid)
            assert [s.seq for s in traj] == [r["seq"] for r in originals]
            for got, want in zip(traj, originals, strict=True):
                for col in ("messages", "request", "response", "prompt_token_ids"):
                    assert json_dumps(getattr(got, col)) == json_dumps(want[col]), (sid, want["seq"], col)
                assert got.encoding is None
    finally:
        await store.close()


def test_the_sync_engine_creates_the_stores_page_size_too(tmp_path: Path, page_size_8k: int) -> None:
    """The launcher's sync engine (``store.group``) may be the first to open a new file."""
    engine = make_sync_sqlite_engine(tmp_path / "sync.db", writer=True)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE t (x)")
            assert conn.exec_driver_sql("PRAGMA page_size").scalar() == page_size_8k
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    finally:
        engine.dispose()
