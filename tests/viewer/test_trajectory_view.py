"""Steps as the viewer shows them: messages of the three protocols, answers, what is new at each
step, divergence in a group, and the start request without hidden fields."""

from __future__ import annotations

from typing import Any

from rollout.servers.viewer.trajectory_view import divergence, message_of, start_request_view, step_views
from tests.fake_upstream import anthropic_message, chat_completion


def step(seq: int, messages: list[Any], response: Any, endpoint: str = "chat.completions") -> dict[str, Any]:
    return {"seq": seq, "messages": messages, "response": response, "endpoint": endpoint, "meta_json": None}


def test_chat_messages_tool_calls_and_results() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
    m = message_of({"role": "assistant", "content": "", "tool_calls": [call], "reasoning_content": "think"})
    assert [(p.kind, p.title) for p in m.parts] == [("reasoning", ""), ("tool_call", "bash · c1")]
    assert m.parts[1].text == '{\n  "command": "ls"\n}'
    tool = message_of({"role": "tool", "tool_call_id": "c1", "content": "a\nb"})
    assert (tool.role, tool.parts[0].kind, tool.parts[0].text, tool.parts[0].lines) == (
        "tool",
        "tool_result",
        "a\nb",
        2,
    )


def test_responses_and_anthropic_shapes() -> None:
    fc = message_of({"type": "function_call", "name": "bash", "call_id": "x", "arguments": "{}"})
    out = message_of({"type": "function_call_output", "call_id": "x", "output": "done"})
    msg = message_of({"role": "user", "content": [{"type": "input_text", "text": "hi"}]})
    assert (fc.role, fc.parts[0].kind, out.parts[0].text, msg.parts[0].text) == (
        "assistant",
        "tool_call",
        "done",
        "hi",
    )
    blocks = message_of(
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "42"}]},
                {"type": "tool_use", "id": "t2", "name": "calc", "input": {"x": 1}},
            ],
        }
    )
    assert [(p.kind, p.text) for p in blocks.parts] == [
        ("tool_result", "42"),
        ("tool_call", '{\n  "x": 1\n}'),
    ]
    views = step_views([step(1, [], anthropic_message(model="m"), endpoint="messages")])
    assert [p.kind for p in views[0].answer] == ["text"]


def test_new_messages_and_divergence() -> None:
    first = [{"role": "user", "content": "q"}]
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    second = first + [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c", "content": "r"},
    ]
    a = step_views(
        [step(1, first, chat_completion(None, tool_calls=[call])), step(2, second, chat_completion("A"))]
    )
    b = step_views(
        [step(1, first, chat_completion(None, tool_calls=[call])), step(2, second, chat_completion("B"))]
    )
    c = step_views([step(1, first, chat_completion(None, tool_calls=[call]))])
    assert (a[0].new_from, a[1].new_from) == (0, 2)
    assert [m.role for m in a[1].messages[a[1].new_from :]] == ["tool"]
    rewritten = step_views(
        [
            step(1, second, chat_completion("A")),
            step(2, first + [{"role": "user", "content": "summary"}], chat_completion("B")),
        ]
    )
    assert rewritten[1].new_from == 1  # the agent trimmed its history: shown from the first changed message
    assert divergence([a, a]) == (None, [None, None])
    assert divergence([a, b, c]) == (2, [None, 2, 2])


def test_start_request_without_hidden_fields() -> None:
    row = {
        "env_id": "s",
        "job_id": "j",
        "env_name": "e",
        "case_id": "1",
        "sample_index": 0,
        "group_id": "g",
        "llm_model": "m",
        "max_steps": None,
        "env_params": {"p": 1, "dataset": {"q": "?", "answer": "42"}},
    }
    view = start_request_view(row, ["answer"])
    assert view["env_params"] == {"p": 1, "dataset": {"q": "?"}} and view["max_steps"] == -1
    unknown = start_request_view(row, None)
    assert "42" not in str(unknown) and unknown["env_params"]["dataset"].startswith("(not shown")
    assert row["env_params"]["dataset"]["answer"] == "42"  # the row itself is left as it was
