"""The evaluator's trajectory built from recorded steps of the three endpoints the gateway
records (chat completions, Responses, Anthropic Messages): content, reasoning and tool calls
(always in the OpenAI chat shape), usage from the promoted columns, the final response."""

from __future__ import annotations

from typing import Any

from rollout.grading.trajectory import to_step, to_trajectory
from store import SessionStep
from tests.fake_upstream import anthropic_message, chat_completion, response_object

WEATHER = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
}


def row(seq: int, endpoint: str, response: Any, **kw: Any) -> SessionStep:
    return SessionStep(
        session_id="s1",
        seq=seq,
        step_id=seq,
        llm_model="m",
        endpoint=endpoint,
        response=response,
        messages=[{"role": "user", "content": "hi"}],
        **kw,
    )


def test_chat_step() -> None:
    step = to_step(
        row(
            1,
            "chat.completions",
            chat_completion("4", reasoning="2+2", tool_calls=[WEATHER]),
            prompt_tokens=5,
            completion_tokens=3,
            total_tokens=8,
            finish_reason="stop",
        )
    )
    assert (step.content, step.reasoning, step.tool_calls) == ("4", "2+2", [WEATHER])
    assert step.usage == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    assert (step.endpoint, step.finish_reason) == ("chat.completions", "stop")


def test_responses_step() -> None:
    response = response_object(
        output=[
            {
                "type": "reasoning",
                "id": "rs",
                "summary": [{"type": "summary_text", "text": "check the weather"}],
            },
            {
                "type": "message",
                "id": "m",
                "role": "assistant",
                "content": [
                    {"type": "output_text", "text": "Checking", "annotations": []},
                    {"type": "output_text", "text": " now.", "annotations": []},
                ],
            },
            {
                "type": "function_call",
                "id": "fc1",
                "call_id": "call_1",
                "name": "get_weather",
                "arguments": '{"city":"Paris"}',
            },
        ]
    )
    step = to_step(
        row(
            1,
            "responses",
            response,
            prompt_tokens=5,
            completion_tokens=3,
            total_tokens=8,
            finish_reason="completed",
        )
    )
    assert (step.content, step.reasoning) == ("Checking now.", "check the weather")
    assert step.tool_calls == [WEATHER]  # call_id as the id, the OpenAI chat shape
    assert step.response == response and step.finish_reason == "completed"


def test_anthropic_step() -> None:
    message = anthropic_message(
        blocks=[
            {"type": "thinking", "thinking": "The user wants the weather.", "signature": "sig"},
            {"type": "text", "text": "Checking now."},
            {
                "type": "tool_use",
                "id": "toolu_1",
                "name": "get_weather",
                "input": {"city": "Paris", "days": 2},
            },
        ],
        stop_reason="tool_use",
    )
    step = to_step(
        row(
            1,
            "messages",
            message,
            prompt_tokens=5,
            completion_tokens=3,
            total_tokens=8,
            finish_reason="tool_use",
        )
    )
    assert (step.content, step.reasoning) == ("Checking now.", "The user wants the weather.")
    assert step.tool_calls == [
        {
            "id": "toolu_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city":"Paris","days":2}'},
        }
    ]


def test_trajectory_across_endpoints_and_error_steps() -> None:
    rows = [
        row(
            3,
            "messages",
            anthropic_message("last words"),
            prompt_tokens=1,
            completion_tokens=1,
            total_tokens=2,
        ),
        row(1, "chat.completions", chat_completion("first")),
        row(2, "responses", response_object("second"), prompt_tokens=4, completion_tokens=2, total_tokens=6),
        row(
            4,
            "messages",
            {"type": "error", "error": {"type": "api_error", "message": "boom"}},
            status="error",
        ),
        row(5, "responses", {"raw_body": "<html>502</html>", "content_type": "text/html"}, status="error"),
        row(6, "messages", anthropic_message(blocks=[]), status="ok"),  # a synthetic-stop-like empty answer
    ]
    traj = to_trajectory("s1", rows)
    assert [(s.seq, s.endpoint, s.content) for s in traj.steps] == [
        (1, "chat.completions", "first"),
        (2, "responses", "second"),
        (3, "messages", "last words"),
        (4, "messages", None),
        (5, "responses", None),
        (6, "messages", None),
    ]
    assert all(s.tool_calls == [] and s.reasoning is None for s in traj.steps)
    assert traj.final_response == "last words"
