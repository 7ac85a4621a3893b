"""env/gsm8k/runtime.py run as a real subprocess against the scripted fake upstream."""

from __future__ import annotations

from pathlib import Path

from env.gsm8k.runtime import SYSTEM_PROMPT
from tests.env.helpers import ENV_ROOT, last_result, run_runtime_file, start_request
from tests.fake_upstream import FakeUpstream, Reply, chat_completion

RUNTIME = ENV_ROOT / "gsm8k" / "runtime.py"
CASE = {"question": "Tom has 3 apples and buys 4 more. How many apples does he have?"}


async def test_one_call_with_prompt_and_extracted_answer(tmp_path: Path) -> None:
    async with FakeUpstream() as up:
        up.script(None, [Reply.json(chat_completion("3 + 4 = 7\n#### 7"))])
        req = start_request(
            up.base_url, CASE, env_params={"dataset": CASE, "max_tokens": 64}, temperature=0.7
        )
        code, lines, _ = await run_runtime_file(RUNTIME, req, tmp_path)
    assert code == 0
    result = last_result(lines)
    assert (result.status, result.step_count, result.truncated) == ("succeeded", 1, False)
    assert result.metrics == {
        "extracted_answer": "7",
        "completion_text": "3 + 4 = 7\n#### 7",
        "finish_reason": "stop",
        "gateway_stop_reason": None,
    }
    assert len(up.requests) == 1
    assert up.requests[0].path == "/v1/sessions/sess-1/chat/completions"
    assert up.requests[0].json == {
        "model": "m",
        "messages": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": CASE["question"]},
        ],
        "max_tokens": 64,
        "temperature": 0.7,
    }


async def test_no_temperature_is_omitted_and_cut_answer_is_truncated(tmp_path: Path) -> None:
    async with FakeUpstream() as up:
        up.script(None, [Reply.json(chat_completion("Let me count: 3, then", finish_reason="length"))])
        code, lines, _ = await run_runtime_file(RUNTIME, start_request(up.base_url, CASE), tmp_path)
    result = last_result(lines)
    assert "temperature" not in up.requests[0].json
    assert up.requests[0].json["max_tokens"] == 256
    assert (result.status, result.truncated, result.terminated) == ("succeeded", True, False)
    assert result.metrics["extracted_answer"] == "3"


async def test_gateway_budget_stop_is_truncated(tmp_path: Path) -> None:
    async with FakeUpstream() as up:
        up.script(None, [Reply.json(chat_completion(""), headers={"x-gateway-stop-reason": "max_steps"})])
        _, lines, _ = await run_runtime_file(RUNTIME, start_request(up.base_url, CASE), tmp_path)
    result = last_result(lines)
    assert (result.status, result.truncated, result.step_count) == ("succeeded", True, 0)
    assert result.metrics["extracted_answer"] is None
    assert result.metrics["gateway_stop_reason"] == "max_steps"


async def test_upstream_error_becomes_a_failed_result(tmp_path: Path) -> None:
    async with FakeUpstream() as up:
        up.script(
            None,
            [Reply.json({"error": {"message": "bad model", "type": "invalid_request_error"}}, status=404)],
        )
        code, lines, _ = await run_runtime_file(RUNTIME, start_request(up.base_url, CASE), tmp_path)
    result = last_result(lines)
    assert code == 0
    assert result.status == "failed"
    assert result.error_text is not None and result.error_text.startswith("NotFoundError: ")
    assert "bad model" in result.error_text
