"""env/workspace/runtime.py run as a real subprocess in a workspace against the scripted fake upstream."""

from __future__ import annotations

import json
from pathlib import Path

from env.bash_agent import TOOLS_SYSTEM_PROMPT as SYSTEM_PROMPT
from env.bash_tool import BASH_TOOL_SPEC
from tests.env.helpers import ENV_ROOT, last_result, run_runtime_file, start_request
from tests.fake_upstream import FakeUpstream, Reply, chat_completion

RUNTIME = ENV_ROOT / "workspace" / "runtime.py"
CASE = {"id": "demo", "instruction": 'Count the lines of data.txt into outputs/answer.json as {"lines": N}.'}
WRITE_ANSWER = 'mkdir -p outputs && echo {\\"lines\\": $(wc -l < data.txt)} > outputs/answer.json && cat outputs/answer.json'


def _bash(call_id: str, arguments: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": "bash", "arguments": arguments}}


def _tool_turn(*calls: dict) -> Reply:
    return Reply.json(chat_completion(None, tool_calls=list(calls), finish_reason="tool_calls"))


def _workspace(tmp_path: Path) -> Path:
    (tmp_path / "data.txt").write_text("a\nb\nc\n")
    return tmp_path


async def test_agent_loop_runs_tools_and_recovers_from_malformed_arguments(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    async with FakeUpstream() as up:
        up.script(
            None,
            [
                _tool_turn(
                    _bash("call_1", '{"command": "ls'), _bash("call_2", '{"command": "wc -l < data.txt"}')
                ),
                _tool_turn(_bash("call_3", json.dumps({"command": WRITE_ANSWER}))),
                Reply.json(chat_completion("Done: 3 lines.")),
            ],
        )
        req = start_request(up.base_url, CASE, max_steps=8, temperature=0.2)
        code, lines, _ = await run_runtime_file(RUNTIME, req, ws)
    assert code == 0
    result = last_result(lines)
    assert (result.status, result.step_count, result.truncated, result.terminated) == (
        "succeeded",
        3,
        False,
        True,
    )
    assert result.error_text is None
    assert result.metrics == {
        "steps": 3,
        "tool_calls": 3,
        "format_errors": 0,
        "answer_present": True,
        "stop_reason": "answered",
    }
    assert json.loads((ws / "outputs" / "answer.json").read_text()) == {"lines": 3}

    first, second, third = (r.json for r in up.requests)
    assert first["messages"] == [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": CASE["instruction"]},
    ]
    assert first["tools"] == [BASH_TOOL_SPEC]
    assert first["temperature"] == 0.2
    assert first["max_tokens"] == 512
    assistant, bad, good = second["messages"][2:]
    assert assistant["role"] == "assistant"
    assert [c["id"] for c in assistant["tool_calls"]] == ["call_1", "call_2"]
    assert assistant["tool_calls"][0]["function"]["arguments"] == '{"command": "ls'
    assert bad["role"] == "tool" and bad["tool_call_id"] == "call_1"
    assert bad["content"].startswith("error: tool arguments are not valid JSON")
    assert good == {"role": "tool", "tool_call_id": "call_2", "content": "[exit code 0]\n3\n"}
    assert third["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "call_3",
        "content": '[exit code 0]\n{"lines": 3}\n',
    }


async def test_step_budget_truncates_the_loop(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    async with FakeUpstream() as up:
        up.script(
            None,
            [_tool_turn(_bash("c1", '{"command": "true"}')), _tool_turn(_bash("c2", '{"command": "true"}'))],
        )
        _, lines, _ = await run_runtime_file(RUNTIME, start_request(up.base_url, CASE, max_steps=2), ws)
    result = last_result(lines)
    assert len(up.requests) == 2
    assert (result.status, result.truncated, result.terminated) == ("failed", True, False)
    assert result.error_text == "outputs/answer.json is missing"
    assert result.metrics == {
        "steps": 2,
        "tool_calls": 2,
        "format_errors": 0,
        "answer_present": False,
        "stop_reason": "budget",
    }


async def test_gateway_budget_stop_ends_the_loop_as_truncated(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    async with FakeUpstream() as up:
        up.script(
            None,
            [
                _tool_turn(_bash("c1", json.dumps({"command": WRITE_ANSWER}))),
                Reply.json(chat_completion(""), headers={"x-gateway-stop-reason": "max_steps"}),
            ],
        )
        _, lines, _ = await run_runtime_file(RUNTIME, start_request(up.base_url, CASE), ws)
    result = last_result(lines)
    assert (result.status, result.truncated, result.step_count) == ("succeeded", True, 1)
    assert result.metrics["stop_reason"] == "gateway_stop"


async def test_model_that_never_calls_tools_fails_without_answer(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    async with FakeUpstream() as up:
        up.script(None, [Reply.json(chat_completion("The answer is 3."))])
        _, lines, _ = await run_runtime_file(RUNTIME, start_request(up.base_url, CASE), ws)
    result = last_result(lines)
    assert "temperature" not in up.requests[0].json
    assert (result.status, result.truncated, result.terminated) == ("failed", False, True)
    assert result.error_text == "outputs/answer.json is missing"
    assert result.metrics == {
        "steps": 1,
        "tool_calls": 0,
        "format_errors": 0,
        "answer_present": False,
        "stop_reason": "answered",
    }


async def test_api_error_stops_the_loop_and_is_reported(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    (ws / "outputs").mkdir()
    (ws / "outputs" / "answer.json").write_text("{not json")
    async with FakeUpstream() as up:
        up.script(
            None,
            [
                Reply.json(
                    {"error": {"message": "context too long", "type": "invalid_request_error"}}, status=400
                )
            ],
        )
        _, lines, _ = await run_runtime_file(RUNTIME, start_request(up.base_url, CASE), ws)
    result = last_result(lines)
    assert result.status == "failed"
    assert result.metrics["stop_reason"] == "error"
    assert result.error_text is not None
    first, second = result.error_text.split("; ")
    assert first.startswith("BadRequestError: ") and "context too long" in first
    assert second.startswith("outputs/answer.json is unreadable or not JSON: ")
