"""The gateway stores each step as a delta on the session's last committed step (``telemetry.
step_deltas``, default on): the database holds each message once, and every read gives back the
exact request, messages and token ids."""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import pytest

from store import json_dumps
from tests.fake_upstream import (
    DEFAULT_TEXT,
    FakeUpstream,
    Reply,
    chat_completion,
    fake_prompt_ids,
    response_object,
    token_rule,
)
from tests.gateway.conftest import StartGateway, anthropic_routes


def history(turns: int) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}]
    for i in range(turns):
        msgs.append({"role": "user", "content": f"turn {i}: " + "y" * 200})
        msgs.append({"role": "assistant", "content": DEFAULT_TEXT})
    return msgs


@pytest.mark.parametrize("deltas", [True, False])
async def test_a_long_session_is_stored_once_and_read_in_full(
    start_gateway: StartGateway, upstream: FakeUpstream, deltas: bool
) -> None:
    upstream.add_rule(token_rule())
    gw = await start_gateway(routes={"m": {"capture": "tokens"}}, telemetry={"step_deltas": deltas})
    sent = []
    http = gw.http()
    for turn in range(6):
        messages = history(turn) + [{"role": "user", "content": f"turn {turn}: " + "y" * 200}]
        body = {"model": "m", "messages": messages, "stream": turn % 2 == 1}
        r = await http.post("/v1/sessions/s1/chat/completions", json=body)
        assert r.status_code == 200
        sent.append(messages)
    steps = await gw.wait_steps("s1", 6)
    for step, messages in zip(steps, sent, strict=True):
        assert json_dumps(step.messages) == json_dumps(messages)
        assert step.request["messages"] == messages and step.request["return_token_ids"] is True
        assert step.prompt_token_ids == fake_prompt_ids(messages)
        assert step.encoding is None
    assert [s.extends_prefix for s in steps] == [None, True, True, True, True, True]
    rows = gw.sql(
        "SELECT seq, messages, request, response, prompt_token_ids, completion_token_ids, "
        "completion_logprobs, encoding, packed FROM session_steps ORDER BY seq"
    )
    stored = sum(
        len(r["packed"] or b"") + sum(len(r[c] or "") for c in ("messages", "request", "prompt_token_ids"))
        for r in rows
    )
    full = sum(
        len(json_dumps(s.messages)) + len(json_dumps(s.request)) + len(json_dumps(s.prompt_token_ids))
        for s in steps
    )
    if not deltas:
        assert stored == full and all(r["encoding"] is None and r["packed"] is None for r in rows)
        return
    assert all(r["packed"] is not None and r["messages"] is None for r in rows)  # compressed, every one
    last = stored_values(rows[-1])
    assert last["messages"] == sent[-1][-1:]  # only the new question: the answer sent back is a reference
    assert last["request"]["messages"] is None  # rebuilt from the messages
    enc = json.loads(rows[-1]["encoding"])
    assert enc[:4] == [3, 1, 2 * 5, 1]  # format 3, base: the step before, its 10 messages and its answer kept
    assert enc[6] == len(steps[-2].prompt_token_ids) + len(steps[-2].completion_token_ids)
    assert stored < full / 4


def stored_values(row: dict[str, Any]) -> dict[str, Any]:
    """The values a stored row holds of the columns a format-3 row may compress: unpacked from
    ``packed`` (zlib of their JSON list), else read from the columns."""
    names = (
        "messages",
        "request",
        "response",
        "prompt_token_ids",
        "completion_token_ids",
        "completion_logprobs",
    )
    if row["packed"] is not None:
        return dict(zip(names, json.loads(zlib.decompress(row["packed"])), strict=True))
    return {c: None if row[c] is None else json.loads(row[c]) for c in names}


async def test_every_protocol_reads_back_the_same_with_and_without_deltas(
    start_gateway: StartGateway, upstream: FakeUpstream, tmp_path: Path
) -> None:
    gws = [
        await start_gateway(
            routes=anthropic_routes(upstream),
            telemetry={"step_deltas": d},
            db_url=f"sqlite://{tmp_path}/{d}.db",
        )
        for d in (True, False)
    ]
    user = [{"role": "user", "content": "u" * 300}]
    turns: list[tuple[str, dict[str, Any]]] = []
    for k in range(3):
        history = [
            m
            for i in range(k)
            for m in (
                {"role": "user", "content": f"{i}" * 300},
                {"role": "assistant", "content": DEFAULT_TEXT},
            )
        ]
        turns.append(("/chat/completions", {"model": "m", "messages": history + user}))
        items = [{"type": "message", "role": m["role"], "content": m["content"]} for m in history + user]
        turns.append(("/responses", {"model": "m", "instructions": "be brief", "input": items}))
        turns.append(
            (
                "/v1/messages",
                {
                    "model": "a",
                    "max_tokens": 8,
                    "system": "be brief",
                    "messages": history + user,
                    "stream": k == 2,
                },
            )
        )
    for gw in gws:
        http = gw.http()
        for path, body in turns:
            sid = {"/chat/completions": "c", "/responses": "r", "/v1/messages": "a"}[path]
            r = await http.post(f"/v1/sessions/{sid}{path}", json=body)
            assert r.status_code == 200, r.text
    for sid in ("c", "r", "a"):
        with_deltas, full = [await gw.wait_steps(sid, 3) for gw in gws]
        for a, b in zip(with_deltas, full, strict=True):
            for col in ("messages", "request", "response", "prompt_token_ids"):
                assert json_dumps(getattr(a, col)) == json_dumps(getattr(b, col)), (sid, a.seq, col)
        rows = gws[0].sql("SELECT encoding FROM session_steps WHERE session_id = ? ORDER BY seq", sid)
        assert all(r["encoding"] is not None for r in rows[1:]), sid  # later steps are deltas


async def test_the_answer_sent_back_is_a_reference_on_every_protocol(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    """An agent that sends each answer back as it got it (chat: ``choices[0].message``; Messages:
    ``role`` + ``content``; Responses: the ``output`` items, a reasoning item among them) has each
    message stored once; an answer sent back changed (its reasoning dropped) is stored in full."""
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "think"}]}
    message = response_object()["output"][0]
    upstream.script(
        "/v1/responses", [Reply.json(response_object(output=[reasoning, message])) for _ in range(3)]
    )
    upstream.script("/v1/chat/completions", [Reply.json(chat_completion(reasoning="hmm")) for _ in range(3)])
    gw = await start_gateway(routes=anthropic_routes(upstream))
    http = gw.http()
    sent: dict[str, list[list[Any]]] = {"c": [], "r": [], "a": []}
    history: dict[str, list[Any]] = {"c": [], "r": [], "a": []}
    for k in range(3):
        user = {"role": "user", "content": f"question {k} " + "q" * 300}
        for sid, path in (("c", "/chat/completions"), ("r", "/responses"), ("a", "/v1/messages")):
            conv = [*history[sid], user]
            body: dict[str, Any] = {
                "model": "a" if sid == "a" else "m",
                "max_tokens": 8,
                "system": "be brief",
                "messages": conv,
            }
            if sid == "c":
                body = {"model": "m", "messages": [{"role": "system", "content": "be brief"}, *conv]}
            elif sid == "r":
                body = {"model": "m", "instructions": "be brief", "input": conv}
            r = await http.post(f"/v1/sessions/{sid}{path}", json=body)
            assert r.status_code == 200, r.text
            got = r.json()
            if sid == "c":
                answer = [got["choices"][0]["message"]]
            elif sid == "r":
                answer = got["output"]
            else:
                answer = [{"role": got["role"], "content": got["content"]}]
            if sid == "c" and k == 1:  # the client drops the reasoning: no longer the answer as received
                answer = [{"role": "assistant", "content": answer[0]["content"]}]
            history[sid] = [*conv, *answer]
            sent[sid].append(body.get("messages", body.get("input")))
    for sid, n_answer in (("c", 1), ("r", 2), ("a", 1)):
        steps = await gw.wait_steps(sid, 3)
        for step, conv in zip(steps, sent[sid], strict=True):
            assert json_dumps(step.request.get("messages", step.request.get("input"))) == json_dumps(conv)
            assert step.messages[0] == {"role": "system", "content": "be brief"}
        rows = gw.sql("SELECT * FROM session_steps WHERE session_id = ? ORDER BY seq", sid)
        for r in rows[1:]:
            enc = json.loads(r["encoding"])
            stored = stored_values(r)["messages"]
            if sid == "c" and r["seq"] == 3:  # the answer sent back without its reasoning: stored
                assert enc[2:4] == [4, 0] and stored[0] == {"role": "assistant", "content": DEFAULT_TEXT}
                assert len(stored) == 2
            else:
                assert enc[3] == n_answer, (sid, r["seq"], enc)
                assert len(stored) == 1 and stored[0]["content"].startswith(f"question {r['seq'] - 1} ")
