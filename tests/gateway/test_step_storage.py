"""The gateway stores each step as a delta on the session's last committed step (``telemetry.
step_deltas``, default on): the database holds each message once, and every read gives back the
exact request, messages and token ids."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from store import json_dumps
from tests.fake_upstream import DEFAULT_TEXT, FakeUpstream, fake_prompt_ids, token_rule
from tests.gateway.conftest import StartGateway, anthropic_routes


def history(turns: int) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}]
    for i in range(turns):
        msgs.append({"role": "user", "content": f"turn {i}: " + "y" * 200})
        msgs.append({"role": "assistant", "content": DEFAULT_TEXT})
    return msgs


@pytest.mark.parametrize("deltas", [True, False])
async def test_a_long_session_is_stored_once_and_read_in_full(start_gateway: StartGateway, upstream: FakeUpstream,
                                                              deltas: bool) -> None:
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
    rows = gw.sql("SELECT seq, messages, request, prompt_token_ids, encoding FROM session_steps ORDER BY seq")
    stored = sum(len(r["messages"]) + len(r["request"]) + len(r["prompt_token_ids"]) for r in rows)
    full = sum(len(json_dumps(s.messages)) + len(json_dumps(s.request)) + len(json_dumps(s.prompt_token_ids))
               for s in steps)
    if not deltas:
        assert stored == full and all(r["encoding"] is None for r in rows)
        return
    last = rows[-1]
    assert json.loads(last["messages"]) == sent[-1][-1:]  # only the new question: the answer sent back is a reference
    assert json.loads(last["request"])["messages"] is None  # rebuilt from the messages
    assert json.loads(last["encoding"])[6] == len(steps[-2].prompt_token_ids) + len(steps[-2].completion_token_ids)
    assert stored < full / 2


async def test_every_protocol_reads_back_the_same_with_and_without_deltas(
        start_gateway: StartGateway, upstream: FakeUpstream, tmp_path: Path) -> None:
    gws = [await start_gateway(routes=anthropic_routes(upstream), telemetry={"step_deltas": d},
                               db_url=f"sqlite://{tmp_path}/{d}.db") for d in (True, False)]
    user = [{"role": "user", "content": "u" * 300}]
    turns: list[tuple[str, dict[str, Any]]] = []
    for k in range(3):
        history = [m for i in range(k) for m in ({"role": "user", "content": f"{i}" * 300},
                                                  {"role": "assistant", "content": DEFAULT_TEXT})]
        turns.append(("/chat/completions", {"model": "m", "messages": history + user}))
        items = [{"type": "message", "role": m["role"], "content": m["content"]} for m in history + user]
        turns.append(("/responses", {"model": "m", "instructions": "be brief", "input": items}))
        turns.append(("/v1/messages", {"model": "a", "max_tokens": 8, "system": "be brief",
                                       "messages": history + user, "stream": k == 2}))
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
