"""Steps stored as deltas (:mod:`store.stepcodec`): what is written is only what the session's last
committed step did not hold, and every read rebuilds each value exactly (the same JSON text)."""

from __future__ import annotations

import copy
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from store import Store, json_dumps, step_record
from store.engine import make_engine
from store.queries import ViewerQueries
from store.stepcodec import StepDecodeError, StepEncoder, decode_rows

SYS = {"role": "system", "content": "be brief"}


def conv(n: int, *, edit: int | None = None) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [SYS]
    for i in range(n):
        msgs.append({"role": "user", "content": f"question {i} " + "x" * 50 + ("!" if edit == i else "")})
        msgs.append({"role": "assistant", "content": f"answer {i}", "tool_calls": None})
    return msgs


def row(sid: str, seq: int, messages: list[Any], prompt: list[int] | None = None,
        completion: list[int] | None = None, **kw: Any) -> dict[str, Any]:
    request = {"model": "m", "messages": messages, "temperature": 0.5}
    return step_record(session_id=sid, seq=seq, step_id=seq, llm_model="m", endpoint="chat.completions",
                       messages=messages, request=request, response={"choices": [{"message": {"content": "a"}}]},
                       prompt_token_ids=prompt, completion_token_ids=completion, **kw)


ORIGINALS = [
    row("s", 1, conv(0) + [{"role": "user", "content": "q"}], list(range(100)), [7, 8, 9]),
    row("s", 2, conv(1), [*range(100), 7, 8, 9, 5, 5], [1]),           # extends: prompt + completion kept
    row("s", 3, conv(2), [*range(100), 7, 8, 4, 5, 5, 1, 2], [3]),     # token drift inside step 2's completion
    row("s", 4, conv(2, edit=0), None, None),                         # history rewritten, tokens unknown
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
    assert encs[0] == [2, 0, 0, 0, 1]  # no base: the messages once, not twice
    assert stored[0]["request"] == {"model": "m", "messages": None, "temperature": 0.5}
    assert stored[0]["messages"] == ORIGINALS[0]["messages"]
    assert encs[1] == [2, 1, 1, 0, 3, 0, 103]  # the same request apart from its messages: not stored
    assert stored[1]["request"] is None
    assert stored[1]["messages"] == conv(1)[1:] and stored[1]["prompt_token_ids"] == [5, 5]
    assert encs[2] == [2, 1, 3, 0, 3, 0, 64]  # token drift: whole blocks kept
    assert stored[2]["prompt_token_ids"] == [*range(64, 100), 7, 8, 4, 5, 5, 1, 2]
    assert encs[3] == [2, 1, 1, 0, 3]  # the first user message edited; tokens unknown
    assert encs[4] == [2, 1, 0, 0, 3]  # nothing in common but the request's other fields
    assert encs[5] == [2, 1, 0, 0, 3, 0, 3] and stored[5]["prompt_token_ids"] == [4]
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
    assert stored[1]["encoding"] == [2, 1, 1, 1, 3] and stored[1]["messages"] == [{"role": "tool", "content": "out"}]
    decode_rows(stored)
    assert stored[1]["messages"] == second["messages"] and stored[1]["request"] == second["request"]


def test_only_committed_steps_are_bases() -> None:
    enc = StepEncoder()
    first = copy.deepcopy(ORIGINALS[0])
    enc.encode(first)  # never committed (refused by the store, dropped)
    second = copy.deepcopy(ORIGINALS[1])
    enc.committed(enc.encode(second))
    assert second["encoding"] == [2, 0, 0, 0, 1] and second["messages"] == ORIGINALS[1]["messages"]
    stored = encode_all(StepEncoder(), ORIGINALS[:2])
    with pytest.raises(StepDecodeError, match="not in the store"):
        decode_rows(stored[1:])  # its base is gone


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
    raw = con.execute("SELECT messages, encoding FROM session_steps WHERE seq = 2").fetchone()
    assert raw[0] == json_dumps(conv(1)[1:]) and raw[1] == "[2, 1, 1, 0, 3, 0, 103]"
