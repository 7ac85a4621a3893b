"""``extends_prefix``: whether a step's prompt starts with the previous step's prompt + completion
(token ids when known, else the chat messages), so a trainer knows which steps merge into one
training sequence. First step: null; history kept: true; rewritten, reasoning dropped, compacted:
false."""

from __future__ import annotations

from typing import Any

import pytest

import gateway.continuity as continuity
from gateway.continuity import PrefixTracker
from store.stepcodec import message_digests, token_chain
from tests.fake_upstream import DEFAULT_TEXT, FakeUpstream, Reply, chat_completion, token_rule
from tests.gateway.conftest import StartGateway

SYSTEM = {"role": "system", "content": "be brief"}
U1 = {"role": "user", "content": "first"}
A1 = {"role": "assistant", "content": DEFAULT_TEXT}


async def turns(gw: Any, sid: str, conversations: list[list[dict[str, Any]]], model: str = "m") -> list[Any]:
    http = gw.http()
    for messages in conversations:
        r = await http.post(
            f"/v1/sessions/{sid}/chat/completions", json={"model": model, "messages": messages}
        )
        assert r.status_code == 200, r.text
    return await gw.wait_steps(sid, len(conversations))


async def test_token_mode(start_gateway: StartGateway, upstream: FakeUpstream) -> None:
    upstream.add_rule(token_rule())
    gw = await start_gateway(routes={"m": {"capture": "tokens"}})
    steps = await turns(
        gw,
        "s1",
        [
            [SYSTEM, U1],
            [SYSTEM, U1, A1, {"role": "user", "content": "second"}],  # history kept
            [SYSTEM, U1, {"role": "assistant", "content": "hello from FAKE"}],  # an answer rewritten
            [SYSTEM, U1, {"role": "assistant", "content": "hello from FAKE"}, A1],  # extends the last one
            [{"role": "user", "content": "summary of it all"}],  # compaction
        ],
    )
    assert all(s.prompt_token_ids is not None for s in steps)
    assert [s.extends_prefix for s in steps] == [None, True, False, True, False]


async def test_messages_mode_without_tokens(start_gateway: StartGateway, upstream: FakeUpstream) -> None:
    gw = await start_gateway()
    # the openai SDK echoes assistant messages with null fields: they do not count
    echoed = {**A1, "refusal": None, "tool_calls": None, "function_call": None, "audio": None}
    steps = await turns(
        gw,
        "s1",
        [
            [SYSTEM, U1],
            [SYSTEM, U1, echoed, {"role": "user", "content": "second"}],
            [SYSTEM, U1, echoed, {"role": "user", "content": "second (edited)"}],
            [{"role": "system", "content": "other"}, U1],
        ],
    )
    assert all(s.prompt_token_ids is None for s in steps)
    assert [s.extends_prefix for s in steps] == [None, True, False, False]


async def test_dropped_reasoning_and_changed_tools_break_the_prefix(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    upstream.script(
        "/v1/chat/completions", [Reply.json(chat_completion("ans", reasoning="think")) for _ in range(3)]
    )
    gw = await start_gateway()
    kept = {"role": "assistant", "content": "ans", "reasoning_content": "think"}
    dropped = {"role": "assistant", "content": "ans"}
    http = gw.http()
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    for messages, t in (
        ([U1], tools),
        ([U1, kept, U1], tools),
        ([U1, kept, U1, dropped, U1], tools),
        ([U1], tools),
        ([U1, kept, U1], None),
    ):
        r = await http.post(
            "/v1/sessions/s1/chat/completions", json={"model": "m", "messages": messages, "tools": t}
        )
        assert r.status_code == 200
    steps = await gw.wait_steps("s1", 5)
    assert [s.extends_prefix for s in steps] == [None, True, False, False, False]


async def test_error_steps_are_not_the_previous_step(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    upstream.script(
        "/v1/chat/completions",
        [Reply.json(chat_completion(DEFAULT_TEXT)), Reply.json({"error": {"message": "boom"}}, status=500)],
    )
    gw = await start_gateway(routes={"m": {"retry": {"max_attempts": 1}}})
    http = gw.http()
    nxt = [SYSTEM, U1, A1, {"role": "user", "content": "2"}]
    for messages in ([SYSTEM, U1], nxt, nxt):
        await http.post("/v1/sessions/s1/chat/completions", json={"model": "m", "messages": messages})
    steps = await gw.wait_steps("s1", 3)
    assert [(s.status, s.extends_prefix) for s in steps] == [("ok", None), ("error", True), ("ok", True)]


def test_tracker_unknowns() -> None:
    t = PrefixTracker()
    kw: dict[str, Any] = {"ok": True, "messages": None, "answer_message": None, "tools": None}

    def see(seq: int, prompt: list[int] | None, completion: list[int] | None = None) -> bool | None:
        return t.observe("s", seq, prompt_ids=prompt, tokens=token_chain(prompt, completion), **kw)

    assert see(2, [1], [9]) is None  # no earlier step known (a restart)
    assert see(3, [1, 9, 5], [9]) is True
    assert see(1, [1], [9]) is None  # a new attempt starts the session again
    assert see(2, None) is None  # nothing comparable
    assert see(3, [1, 8], [9]) is None  # the previous (seq 2) had no tokens
    assert see(4, [1, 8, 9]) is True
    assert see(5, [1, 8, 9, 3]) is None  # the previous step's completion ids are unknown
    long = list(range(300))  # longer than a block of the token fingerprints
    assert see(6, long, [7]) is None
    assert see(7, [*long, 7, 1], [2]) is True
    assert see(8, [*long[:-1], 0, 7, 1, 2], [5]) is False  # differs in the ids after the last whole block
    assert see(9, [1, *long[1:-1], 0, 7, 1, 2, 5, 6], [5]) is False  # differs in the first block
    assert see(10, [1, *long[1:-1], 0, 7, 1, 2, 5, 6, 5]) is True
    t.drop("s")
    assert len(t) == 0


def test_the_exact_digests_of_the_encoder_give_the_same_answers_and_hash_less(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the step encoder's exact message digests, a history sent back exactly is not hashed
    again, and every answer is the one the full canonical check gives: an exact copy, an echo
    with null fields (canonically equal, not exactly), an edit, a tools change, an error step."""
    echoed = {**A1, "refusal": None, "tool_calls": None}
    u2, u3 = {"role": "user", "content": "second"}, {"role": "user", "content": "third"}
    script: list[tuple[list[dict[str, Any]], Any, bool]] = [
        ([SYSTEM, U1], None, True),
        ([SYSTEM, U1, A1, u2], None, True),  # exact: True
        ([SYSTEM, U1, A1, u2, A1, u3], None, False),  # exact, an error step: True, not remembered
        ([SYSTEM, U1, A1, u2, echoed, u3], None, True),  # canonical only: True
        ([SYSTEM, U1, A1, u2, echoed, u3, A1, u2], [{"type": "function"}], True),  # tools changed: False
        ([SYSTEM, U1, A1, u2, echoed, u3, A1, u2, A1], [{"type": "function"}], True),  # True again
        ([SYSTEM, {"role": "user", "content": "edited"}], [{"type": "function"}], True),  # False
    ]
    hashed: list[int] = []
    real = continuity._message_bytes

    def counting(m: Any) -> bytes:
        hashed[-1] += 1
        return real(m)

    results = []
    for digests in (False, True):
        tracker = PrefixTracker()
        got = []
        hashed.append(0)
        monkeypatch.setattr(continuity, "_message_bytes", counting)
        for seq, (messages, tools, ok) in enumerate(script, 1):
            got.append(
                tracker.observe(
                    "s",
                    seq,
                    ok=ok,
                    prompt_ids=None,
                    tokens=None,
                    messages=messages,
                    answer_message=A1 if ok else None,
                    tools=tools,
                    digests=message_digests(messages) if digests else None,
                )
            )
        results.append(got)
    assert results[0] == results[1] == [None, True, True, True, False, True, False]
    assert hashed[0] == sum(len(m) + 1 for m, _, ok in script if ok) + len(script[2][0])
    # per step: the messages after the exact history (all of them when it is not exact) + the answer
    assert hashed[1] == (2 + 1) + (1 + 1) + 1 + (6 + 1) + (1 + 1) + (0 + 1) + (2 + 1)
