"""env/bash_agent.py: the text protocol, the auto protocol and the CLI, run as a real subprocess
against the scripted fake upstream."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from env.bash_agent import (
    AUTO_SYSTEM_PROMPT,
    SUBMIT_SENTINEL,
    TEXT_SYSTEM_PROMPT,
    LoopParams,
    bash_blocks,
    format_error,
    is_submit,
    observation,
    parse_protocol,
)
from env.bash_tool import BASH_TOOL_SPEC, BashResult
from tests.env.helpers import REPO
from tests.fake_upstream import FakeUpstream, Reply, chat_completion

INSTRUCTION = 'Count the lines of data.txt into outputs/answer.json as {"lines": N}.'
WRITE = 'mkdir -p outputs && echo "{\\"lines\\": $(wc -l < data.txt)}" > outputs/answer.json'


def _text(content: str, finish_reason: str = "stop") -> Reply:
    return Reply.json(chat_completion(content, finish_reason=finish_reason))


def _tool_turn(command: str, call_id: str = "c1") -> Reply:
    call = {
        "id": call_id,
        "type": "function",
        "function": {"name": "bash", "arguments": json.dumps({"command": command})},
    }
    return Reply.json(chat_completion(None, tool_calls=[call], finish_reason="tool_calls"))


async def _cli(
    up: FakeUpstream, ws: Path, *args: str, instruction: str = INSTRUCTION, base_url: str | None = None
) -> tuple[int, list[str], str]:
    """Run ``python -m env.bash_agent`` in ``ws``; (exit code, stdout lines, stderr)."""
    (ws / "task.md").write_text(instruction)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "OPENAI_API_KEY": "sk-test",
        "OPENAI_BASE_URL": base_url if base_url is not None else f"{up.base_url}/sessions/s1",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "env.bash_agent",
        "--model",
        "m",
        "--instruction-file",
        "task.md",
        *args,
        cwd=ws,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode().splitlines(), err.decode()


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    (tmp_path / "data.txt").write_text("a\nb\nc\n")
    return tmp_path


def test_bash_blocks_counts_closed_bash_and_sh_fences_only() -> None:
    assert bash_blocks("run:\n```bash\nls -l\n```\nthen") == ["ls -l"]
    assert bash_blocks("```sh\necho a\necho b\n```") == ["echo a\necho b"]
    assert bash_blocks("```bash\nls\n```\n```bash\npwd\n```") == ["ls", "pwd"]
    assert bash_blocks("```python\nprint(1)\n```") == []
    assert bash_blocks("```bash\nls -l") == []  # cut before the closing fence
    assert bash_blocks(None) == [] and bash_blocks("no code") == []


def test_submit_observation_and_format_error_texts() -> None:
    assert is_submit(BashResult(0, f"{SUBMIT_SENTINEL}\nextra\n", False))
    assert is_submit(BashResult(0, f"\n  {SUBMIT_SENTINEL}  \n", False))
    assert not is_submit(BashResult(0, f"x\n{SUBMIT_SENTINEL}\n", False))
    assert not is_submit(f"error: {SUBMIT_SENTINEL}")
    assert (
        observation(BashResult(3, "oops\n", False), 20)
        == "<returncode>3</returncode>\n<output>\noops\n</output>"
    )
    assert observation(BashResult(None, "", True), 5) == (
        "<returncode>timeout</returncode>\n<output>\n(killed after 5s)\n</output>"
    )
    assert format_error(0).startswith("Format error: your reply had no ```bash block.")
    assert format_error(2).startswith("Format error: your reply had 2 ```bash blocks.")
    assert f"echo {SUBMIT_SENTINEL}" in format_error(0)


def test_protocol_names_are_checked() -> None:
    assert parse_protocol("text") == "text"
    with pytest.raises(ValueError, match="protocol must be one of auto, tools, text, got 'bash'"):
        parse_protocol("bash")
    assert LoopParams.from_env_params({"protocol": "text", "max_tokens": 64}) == LoopParams(
        protocol="text", max_tokens=64
    )


async def test_text_protocol_runs_one_block_per_reply_and_submits(ws: Path) -> None:
    async with FakeUpstream() as up:
        up.script(
            None,
            [
                _text("I will look first.\n```bash\nwc -l < data.txt\n```"),
                _text("Two ways:\n```bash\nls\n```\nor\n```sh\npwd\n```"),
                _text("The answer is 3."),
                _text(f"```bash\n{WRITE}\n```"),
                _text(f"Done.\n```bash\necho {SUBMIT_SENTINEL}\n```"),
            ],
        )
        code, out, err = await _cli(
            up, ws, "--protocol", "text", "--temperature", "0.7", "--max-tokens", "64"
        )
    assert code == 0, err
    assert json.loads(out[-1]) == {
        "steps": 5,
        "tool_calls": 3,
        "format_errors": 2,
        "stop_reason": "submitted",
        "truncated": False,
        "error": None,
        "error_class": None,
        "finished": True,
        "protocol": "text",
    }
    assert json.loads((ws / "outputs" / "answer.json").read_text()) == {"lines": 3}
    bodies = [r.json for r in up.requests]
    assert all(
        "tools" not in b and b["temperature"] == 0.7 and b["max_tokens"] == 64 and b["model"] == "m"
        for b in bodies
    )
    assert up.requests[0].path == "/v1/sessions/s1/chat/completions"
    assert up.requests[0].headers["authorization"] == "Bearer sk-test"
    assert bodies[0]["messages"] == [
        {"role": "system", "content": TEXT_SYSTEM_PROMPT},
        {"role": "user", "content": INSTRUCTION},
    ]
    last = bodies[4]["messages"]
    assert [m["role"] for m in last] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    assert last[3] == {"role": "user", "content": "<returncode>0</returncode>\n<output>\n3\n</output>"}
    assert last[5]["content"] == format_error(2)
    assert last[7]["content"] == format_error(0)
    assert last[9]["content"] == "<returncode>0</returncode>\n<output>\n</output>"


async def test_text_protocol_stops_at_the_step_budget(ws: Path) -> None:
    async with FakeUpstream() as up:
        up.script(None, [_text("Hello!"), _text("```bash\nls\n```")])
        code, out, _ = await _cli(up, ws, "--protocol", "text", "--max-steps", "2")
    summary = json.loads(out[-1])
    assert code == 1
    assert (summary["steps"], summary["tool_calls"], summary["format_errors"]) == (2, 1, 1)
    assert (summary["stop_reason"], summary["truncated"], summary["finished"]) == ("budget", True, False)
    assert len(up.requests) == 2


async def test_auto_protocol_accepts_tool_calls_and_blocks_and_ends_on_a_plain_reply(ws: Path) -> None:
    async with FakeUpstream() as up:
        up.script(None, [_tool_turn("wc -l < data.txt"), _text(f"```bash\n{WRITE}\n```"), _text("All done.")])
        code, out, err = await _cli(up, ws)
    assert code == 0, err
    summary = json.loads(out[-1])
    assert (summary["steps"], summary["tool_calls"], summary["stop_reason"], summary["protocol"]) == (
        3,
        2,
        "answered",
        "auto",
    )
    assert json.loads((ws / "outputs" / "answer.json").read_text()) == {"lines": 3}
    first, second, third = (r.json for r in up.requests)
    assert first["tools"] == [BASH_TOOL_SPEC] and "temperature" not in first and first["max_tokens"] == 512
    assert first["messages"][0] == {"role": "system", "content": AUTO_SYSTEM_PROMPT}
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "c1", "content": "[exit code 0]\n3\n"}
    assert third["messages"][-1] == {
        "role": "user",
        "content": "<returncode>0</returncode>\n<output>\n</output>",
    }


async def test_tools_protocol_ignores_fenced_blocks_and_submit_by_tool_call_finishes(ws: Path) -> None:
    async with FakeUpstream() as up:
        up.script(None, [_tool_turn(f"echo {SUBMIT_SENTINEL}")])
        code, out, _ = await _cli(up, ws, "--protocol", "tools")
        assert (code, json.loads(out[-1])["stop_reason"]) == (0, "submitted")
        up.script(None, [_text("```bash\ntouch made.txt\n```")])
        code, out, _ = await _cli(up, ws, "--protocol", "tools")
    assert (code, json.loads(out[-1])["stop_reason"], json.loads(out[-1])["tool_calls"]) == (0, "answered", 0)
    assert not (ws / "made.txt").exists()


async def test_api_errors_map_to_exit_codes(ws: Path) -> None:
    async with FakeUpstream() as up:
        up.script(
            None,
            [Reply.json({"error": {"message": "bad request", "type": "invalid_request_error"}}, status=400)],
        )
        code, out, _ = await _cli(up, ws)
        summary = json.loads(out[-1])
        assert (code, summary["stop_reason"], summary["error_class"]) == (3, "error", None)
        assert summary["error"].startswith("BadRequestError: ") and "bad request" in summary["error"]
        up.script(None, [Reply.json({"error": {"message": "overloaded"}}, status=503)] * 3)
        code, out, _ = await _cli(up, ws)
    assert (code, json.loads(out[-1])["error_class"]) == (2, "upstream_unavailable")


async def test_gateway_stop_is_not_finished(ws: Path) -> None:
    async with FakeUpstream() as up:
        up.script(None, [Reply.json(chat_completion(""), headers={"x-gateway-stop-reason": "max_steps"})])
        code, out, _ = await _cli(up, ws, "--protocol", "text")
    summary = json.loads(out[-1])
    assert (code, summary["stop_reason"], summary["steps"], summary["truncated"]) == (
        1,
        "gateway_stop",
        0,
        True,
    )


async def test_usage_errors_exit_64_without_calling_the_model(ws: Path) -> None:
    async with FakeUpstream() as up:
        code, out, err = await _cli(up, ws, "--protocol", "bash")
        assert (code, out) == (64, []) and "invalid choice: 'bash'" in err
        code, out, err = await _cli(up, ws, base_url="")
        assert (code, out) == (64, []) and "OPENAI_BASE_URL is not set" in err
        code, out, err = await _cli(up, ws, "--instruction-file", "missing.md")
        assert (code, out) == (64, []) and "cannot read --instruction-file missing.md" in err
    assert up.requests == []
