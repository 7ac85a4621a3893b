"""The scripted policy behind the real gateway, driven by the real SDKs: every protocol, streamed
and not, is recorded as steps whose response is the object the policy sent (a stream assembled)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.fake_upstream import FakeUpstream, Plan, ScriptedPolicy
from tests.gateway.conftest import Gateway, StartGateway, anthropic_routes

PLAN = Plan.write_answer({"n": 7})
BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}


async def play_chat(gw: Gateway, sid: str, stream: bool) -> None:
    c = gw.client(sid)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "task"}]
    kw: dict[str, Any] = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
    for _ in range(2):
        if stream:
            args, call_id, text = "", None, ""
            async for chunk in await c.chat.completions.create(
                model="m", messages=messages, tools=[BASH], **kw
            ):
                for ch in chunk.choices:
                    text += ch.delta.content or ""
                    for tc in ch.delta.tool_calls or []:
                        call_id = tc.id or call_id
                        args += (tc.function.arguments or "") if tc.function else ""
        else:
            r = await c.chat.completions.create(model="m", messages=messages, tools=[BASH])  # type: ignore
            text = r.choices[0].message.content or ""
            calls = r.choices[0].message.tool_calls or []
            call_id, args = (calls[0].id, calls[0].function.arguments) if calls else (None, "")  # type: ignore
        if call_id is None:
            return
        messages += [
            {
                "role": "assistant",
                "content": text,
                "tool_calls": [
                    {"id": call_id, "type": "function", "function": {"name": "bash", "arguments": args}}
                ],
            },
            {"role": "tool", "tool_call_id": call_id, "content": json.loads(args)["command"][:20]},
        ]


async def play_responses(gw: Gateway, sid: str, stream: bool) -> None:
    c = gw.client(sid)
    tool = {"type": "function", "name": "shell", "parameters": BASH["function"]["parameters"]}
    items: list[dict[str, Any]] = [{"role": "user", "content": "task"}]
    for _ in range(2):
        if stream:
            async with c.responses.stream(model="m", input=items, tools=[tool]) as s:  # type: ignore
                r = await s.get_final_response()
        else:
            r = await c.responses.create(model="m", input=items, tools=[tool])  # type: ignore
        calls = [o for o in r.output if o.type == "function_call"]
        if not calls:
            return
        items += [
            {
                "type": "function_call",
                "call_id": calls[0].call_id,
                "name": "shell",
                "arguments": calls[0].arguments,
            },
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": "ok"},
        ]


async def play_messages(gw: Gateway, sid: str, stream: bool) -> None:
    c = gw.anthropic(sid)
    tools = [{"name": "Bash", "input_schema": BASH["function"]["parameters"]}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "task"}]
    for _ in range(2):
        if stream:
            async with c.messages.stream(model="a", max_tokens=64, messages=messages, tools=tools) as s:  # type: ignore
                m = await s.get_final_message()
        else:
            m = await c.messages.create(model="a", max_tokens=64, messages=messages, tools=tools)  # type: ignore
        uses = [b for b in m.content if b.type == "tool_use"]
        if not uses:
            return
        messages += [
            {"role": "assistant", "content": m.model_dump()["content"]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "ok"}],
            },
        ]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("play", [play_chat, play_responses, play_messages])
async def test_policy_calls_are_recorded_as_sent(
    upstream: FakeUpstream, start_gateway: StartGateway, play: Any, stream: bool
) -> None:
    policy = ScriptedPolicy(PLAN, text_protocol=False)
    upstream.add_rule(policy)
    gw = await start_gateway(routes=anthropic_routes(upstream))
    await play(gw, "s1", stream)
    steps = await gw.wait_steps("s1", 2)
    assert [t.kind for t in policy.turns] == ["command", "final"]
    assert [t.session_id for t in policy.turns] == ["s1", "s1"]
    for step, turn in zip(steps, policy.turns, strict=True):
        assert (step.status, step.is_stream) == ("ok", stream)
        assert step.response == turn.reply
    assert steps[0].prompt_tokens == 100 and steps[1].prompt_tokens == 110
