"""Format 3 (:mod:`store.stepcodec`): the store's writer compresses a step's own values into
``packed`` when that makes the row smaller, and every read gives back the exact JSON text of every
value; rows of formats 1 and 2 still read back; damaged bytes are a clear error naming the step."""

from __future__ import annotations

import copy
import json
import zlib
from typing import Any

import pytest

from store import JobEnvironment, SessionResult, Store, json_dumps, step_record
from store.feed import FeedQueries
from store.queries import ViewerQueries
from store.stepcodec import PACKED_COLUMNS, StepDecodeError, StepEncoder, decode_rows, pack
from tests.raw_sql import raw_sql

SYS = {"role": "system", "content": "You are an agent in a Linux shell."}
TEXT = "".join(
    f"line {i}: the quick brown fox jumps over the lazy dog, \u00e9t\u00e9 \u4e2d\u6587\n" for i in range(30)
)
COLUMNS = (
    "messages",
    "request",
    "response",
    "prompt_token_ids",
    "completion_token_ids",
    "completion_logprobs",
    "meta_json",
)


def _chat(k: int, tokens: bool) -> tuple[dict[str, Any], dict[str, Any], list[Any]]:
    answer = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"call_{k}",
                "type": "function",
                "function": {"name": "bash", "arguments": '{"command": "ls"}'},
            }
        ],
    }
    response = {
        "id": f"chatcmpl-{k}",
        "object": "chat.completion",
        "created": 1700000000 + k,
        "model": "m",
        "choices": [{"index": 0, "message": answer, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 10 * k, "completion_tokens": 3},
    }
    extra = {"completion_logprobs": [-0.1234567890123, None, -2.5e-07]} if tokens else {}
    return answer, response, [extra]


def session(
    sid: str, endpoint: str, *, tokens: bool, stream: bool = False, turns: int = 4
) -> list[dict[str, Any]]:
    """A session of ``endpoint`` whose agent sends each answer back, then a tool output of ~2 KB
    of text (the lone surrogate in turn 2 is stored with ``\\u`` escapes, exactly)."""
    conversation: list[Any] = [SYS, {"role": "user", "content": "start"}]
    rows, ids = [], list(range(40))
    for k in range(turns):
        output = f"[{k}] " + TEXT + ("\ud800" if k == 2 else "")
        kw: dict[str, Any] = {}
        if endpoint == "chat.completions":
            answer, response, [extra] = _chat(k, tokens)
            request = {"model": "m", "messages": conversation, "temperature": 0.7, "stream": stream}
            sent_back = [answer]
            tool = {"role": "tool", "tool_call_id": f"call_{k}", "content": output}
            if tokens:
                kw = {"prompt_token_ids": list(ids), "completion_token_ids": [7, 8, 9], **extra}
                ids = [*ids, 7, 8, 9, *range(100 + k, 140 + k)]
        elif endpoint == "responses":
            item = {
                "type": "message",
                "id": f"msg_{k}",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "next", "annotations": []}],
            }
            response = {"object": "response", "id": f"resp_{k}", "output": [item], "status": "completed"}
            request = {
                "model": "m",
                "instructions": SYS["content"],
                "input": conversation[1:],
                "stream": stream,
            }
            sent_back = [item]
            tool = {"type": "message", "role": "user", "content": output}
        else:  # Anthropic Messages
            blocks = [
                {"type": "thinking", "thinking": "hm", "signature": f"sig{k}"},
                {"type": "text", "text": "ok"},
            ]
            response = {
                "id": f"msg_{k}",
                "type": "message",
                "role": "assistant",
                "content": blocks,
                "stop_reason": "end_turn",
                "usage": {"input_tokens": 5, "output_tokens": 2},
            }
            request = {
                "model": "m",
                "system": SYS["content"],
                "messages": conversation[1:],
                "max_tokens": 64,
                "stream": stream,
            }
            sent_back = [{"role": "assistant", "content": blocks}]
            tool = {"role": "user", "content": output}
        rows.append(
            step_record(
                session_id=sid,
                seq=k + 1,
                step_id=k + 1,
                llm_model="m",
                endpoint=endpoint,
                is_stream=stream,
                messages=conversation,
                request=request,
                response=response,
                meta_json={"route": "m", "chunks": 3} if stream else {"route": "m"},
                **kw,
            )
        )
        conversation = [*conversation, *sent_back, tool]
    return rows


def encode(rows: list[dict[str, Any]], version: int = 3) -> list[dict[str, Any]]:
    enc, out = StepEncoder(version), []
    for r in rows:
        r = copy.deepcopy(r)
        enc.committed(enc.encode(r))
        out.append(r)
    return out


def text_of(row: Any) -> dict[str, str]:
    get = row.get if isinstance(row, dict) else lambda c: getattr(row, c)
    return {c: json_dumps(get(c)) for c in COLUMNS}


SESSIONS = [
    (endpoint, tokens, stream)
    for endpoint in ("chat.completions", "responses", "messages")
    for tokens in (False, True)
    if tokens is False or endpoint == "chat.completions"
    for stream in (False, True)
]


@pytest.mark.parametrize(("endpoint", "tokens", "stream"), SESSIONS)
def test_packed_rows_rebuild_every_value_exactly(endpoint: str, tokens: bool, stream: bool) -> None:
    originals = session("s", endpoint, tokens=tokens, stream=stream)
    stored = [dict(pack(r)) for r in encode(originals)]
    for r in stored:
        assert r["encoding"][0] == 3 and isinstance(r["packed"], bytes)
        assert all(r[c] is None for c in PACKED_COLUMNS)  # every value is in the compressed column
        assert r["meta_json"] == ({"chunks": 3} if stream else {})  # the route is llm_model: not stored
    # what is packed is the step's own part: the new messages only (the answer sent back is a reference)
    later = json.loads(zlib.decompress(stored[2]["packed"]))
    assert later[0] == originals[2]["messages"][-1:]
    assert later[2] == originals[2]["response"]
    assert later[3] == (list(range(101, 141)) if tokens else None)  # after the base's prompt + completion
    assert (
        sum(len(r["packed"]) for r in stored)
        < sum(len(json_dumps(r["messages"])) for r in encode(originals)) / 3
    )
    decode_rows(stored)
    for got, want in zip(stored, originals, strict=True):
        assert text_of(got) == text_of(want), want["seq"]
        assert got["encoding"] is None and got["packed"] is None


def test_a_tiny_row_stays_raw_and_reads_back() -> None:
    tiny = step_record(
        session_id="s",
        seq=1,
        step_id=1,
        llm_model="m",
        endpoint="chat.completions",
        messages=[{"role": "user", "content": "hi"}],
        request={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        response={"choices": []},
        meta_json={"route": "m"},
    )
    want = copy.deepcopy(tiny)
    [stored] = encode([tiny])
    assert stored["encoding"] == [
        3,
        0,
        0,
        0,
        9,
    ]  # request's messages from the messages; the route from llm_model
    assert pack(stored) is stored and stored["packed"] is None  # compressing would not make it smaller
    decode_rows([stored])
    assert text_of(stored) == text_of(want)


def test_format_2_rows_are_never_compressed() -> None:
    stored = encode(session("s", "chat.completions", tokens=True), version=2)
    assert [r["encoding"][0] for r in stored[1:]] == [2, 2, 2] and stored[0]["encoding"] == [2, 0, 0, 0, 1]
    assert all(pack(r) is r for r in stored)
    assert stored[0]["meta_json"] == {"route": "m"}


def test_damaged_packed_bytes_are_an_error_naming_the_step() -> None:
    stored = [dict(pack(r)) for r in encode(session("s", "chat.completions", tokens=True))]
    blob = bytearray(stored[2]["packed"])
    blob[len(blob) // 2] ^= 0xFF
    stored[2]["packed"] = bytes(blob)
    with pytest.raises(StepDecodeError, match=r"step 3 of session s: its packed values are damaged \(error"):
        decode_rows(copy.deepcopy(stored))
    stored[2]["packed"] = zlib.compress(b"[1, 2]")  # valid zlib, not the list of values
    with pytest.raises(
        StepDecodeError, match="step 3 of session s: its packed values are damaged .not a list of 6"
    ):
        decode_rows(copy.deepcopy(stored))
    del stored[2]["packed"]  # a reader that did not select the column
    with pytest.raises(
        StepDecodeError, match="step 3 of session s is stored compressed and was read without"
    ):
        decode_rows(stored)


async def test_every_format_reads_back_the_same_on_both_backends(store_url: str) -> None:
    """Each session stored in full, as format 2 and as format 3 (compressed and raw rows) in one
    store: every read (trajectory, viewer, feed) gives the same JSON text of every value, the
    original's; the evaluation write-back on a format-3 step keeps its route."""
    written, wants = [], {}
    for n, (endpoint, tokens, stream) in enumerate(SESSIONS):
        for version in (None, 2, 3):
            sid = f"{n}-{version}"
            originals = session(sid, endpoint, tokens=tokens, stream=stream)
            wants[sid] = originals
            written += (
                [copy.deepcopy(r) for r in originals] if version is None else encode(originals, version)
            )
    tiny = step_record(
        session_id="tiny",
        seq=1,
        step_id=1,
        llm_model="m",
        endpoint="chat.completions",
        messages=[],
        request={"model": "m"},
        response=None,
        meta_json={"route": "m"},
    )
    wants["tiny"] = [copy.deepcopy(tiny)]
    written += encode([tiny])
    store = Store(store_url)
    try:
        await store.init()
        await store.add_job_sessions(
            [
                JobEnvironment(
                    session_id=sid, job_id="j", env_name="e", case_id=sid, llm_model="m", group_id=sid
                )
                for sid in wants
            ]
        )
        await store.write_batch(written[: len(written) // 2], [])
        if not store.commit_now(written[len(written) // 2 :], []):
            await store.write_batch(written[len(written) // 2 :], [])
        raw = {
            (r["session_id"], r["seq"]): r
            for r in await raw_sql(
                store_url, "SELECT session_id, seq, encoding, packed, messages FROM session_steps"
            )
        }
        assert raw[("0-3", 2)]["packed"] is not None and raw[("0-3", 2)]["messages"] is None
        assert raw[("0-2", 2)]["packed"] is None and json.loads(raw[("0-2", 2)]["encoding"])[0] == 2
        assert raw[("0-None", 2)]["encoding"] is None and raw[("tiny", 1)]["packed"] is None
        assert json.loads(raw[("tiny", 1)]["encoding"]) == [3, 0, 0, 0, 8]
        for sid, originals in wants.items():
            traj = await store.trajectory(sid)
            assert [text_of(s) for s in traj] == [text_of(r) for r in originals], sid
            assert all(s.encoding is None and s.packed is None for s in traj)
        await store.finish_job_session(
            "0-3", SessionResult(reward=5.0, evaluation={"status": "scored"}, status="succeeded")
        )
        last = (await store.trajectory("0-3"))[-1]
        assert last.meta_json == {"route": "m", "evaluation": {"status": "scored"}} and last.reward == 5.0
    finally:
        await store.close()
    from sqlalchemy.ext.asyncio import AsyncEngine

    from store.engine import make_engine, parse_db_url

    engine: AsyncEngine = make_engine(parse_db_url(store_url), writer=False)
    try:
        viewer = ViewerQueries(engine)
        for sid in ("1-3", "6-3", "tiny"):
            assert [text_of(r) for r in await viewer.steps(sid)] == [text_of(r) for r in wants[sid]], sid
        step = await viewer.step("2-3", 3)
        assert step is not None and text_of(step) == text_of(wants["2-3"][2])
        feed = await FeedQueries(engine).steps_of_sessions(["2-3", "2-2"], with_request=True)
        for sid in ("2-3", "2-2"):
            for got, want in zip(feed[sid], wants[sid], strict=True):
                for c in (
                    "messages",
                    "request",
                    "response",
                    "prompt_token_ids",
                    "completion_token_ids",
                    "completion_logprobs",
                ):
                    assert json_dumps(got[c]) == json_dumps(want[c]), (sid, want["seq"], c)
                assert "packed" not in got and "encoding" not in got
    finally:
        await engine.dispose()


async def test_a_store_without_the_packed_column_gets_it_and_keeps_its_rows(store_url: str) -> None:
    """A database an older version wrote (format-2 rows, no ``packed`` column): ``Store.init``
    adds the column; the old rows and new format-3 rows of the same store read back exactly."""
    old = session("old", "chat.completions", tokens=True)
    new = session("new", "messages", tokens=False)
    store = Store(store_url)
    try:
        await store.init()
        await store.write_batch(encode(old, version=2), [])
    finally:
        await store.close()
    await raw_sql(store_url, "ALTER TABLE session_steps DROP COLUMN packed")
    store = Store(store_url)
    try:
        await store.init()
        await store.write_batch(encode(new), [])
        assert [text_of(s) for s in await store.trajectory("old")] == [text_of(r) for r in old]
        assert [text_of(s) for s in await store.trajectory("new")] == [text_of(r) for r in new]
    finally:
        await store.close()
    rows = await raw_sql(store_url, "SELECT session_id, packed FROM session_steps ORDER BY session_id, seq")
    assert [r["packed"] is None for r in rows] == [False] * 4 + [True] * 4  # new (compressed), then old


async def test_a_damaged_row_fails_the_read_of_its_session_with_its_name(store_url: str) -> None:
    store = Store(store_url)
    try:
        await store.init()
        await store.write_batch(encode(session("s", "responses", tokens=False)), [])
        await raw_sql(store_url, "UPDATE session_steps SET packed = ? WHERE seq = 2", b"not zlib at all")
        with pytest.raises(StepDecodeError, match="step 2 of session s: its packed values are damaged"):
            await store.trajectory("s")
    finally:
        await store.close()
