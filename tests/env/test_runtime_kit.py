"""env/runtime_kit.py: the start request in, one result line out, failures as results."""

from __future__ import annotations

import asyncio
import io
import textwrap
from pathlib import Path

import pytest
from pydantic import ValidationError

from env.runtime_kit import chat_completion, emit_result, openai_client, read_start_request
from rollout.contract.protocol import SimulationStartResult
from tests.env.helpers import last_result, run_runtime_file, start_request
from tests.fake_upstream import FakeUpstream, Reply
from tests.fake_upstream import chat_completion as completion_body

FAILING_RUNTIME = textwrap.dedent("""
    from env.runtime_kit import run_runtime

    def main(req):
        print("stray print from", req.session_id)
        raise RuntimeError("boom in " + req.agent_name)

    run_runtime(main)
""")

SUCCEEDING_RUNTIME = textwrap.dedent("""
    from env.runtime_kit import run_runtime
    from rollout.contract.protocol import SimulationStartResult

    def main(req):
        print("stray print")
        return SimulationStartResult(session_id=req.session_id, status="succeeded", step_count=3,
                                     metrics={"cwd_ok": True})

    run_runtime(main)
""")


def _write(tmp_path: Path, source: str) -> Path:
    script = tmp_path / "runtime.py"
    script.write_text(source)
    return script


async def test_run_runtime_reports_an_exception_as_a_failed_result(tmp_path: Path) -> None:
    req = start_request("http://127.0.0.1:9/v1", {"question": "q"}, agent_name="demo")
    code, lines, err = await run_runtime_file(_write(tmp_path, FAILING_RUNTIME), req, tmp_path)
    assert code == 0
    assert len(lines) == 1  # the stray print went to stderr, not stdout
    result = last_result(lines)
    assert result.status == "failed"
    assert result.session_id == "sess-1"
    assert result.error_text == "RuntimeError: boom in demo"
    assert result.terminated is False
    assert "stray print from sess-1" in err
    assert "Traceback" in err


async def test_run_runtime_reports_an_unreadable_request_as_failed(tmp_path: Path) -> None:
    code, lines, _ = await run_runtime_file(
        _write(tmp_path, FAILING_RUNTIME), '{"session_id": "s-9"}', tmp_path
    )
    assert code == 0
    result = last_result(lines)
    assert result.status == "failed"
    assert result.session_id == "s-9"
    assert result.error_text is not None and result.error_text.startswith("ValidationError: ")


async def test_run_runtime_emits_main_result_as_one_line(tmp_path: Path) -> None:
    req = start_request("http://127.0.0.1:9/v1", {})
    code, lines, _ = await run_runtime_file(_write(tmp_path, SUCCEEDING_RUNTIME), req, tmp_path)
    assert code == 0
    assert lines == [
        SimulationStartResult(
            session_id="sess-1", status="succeeded", step_count=3, metrics={"cwd_ok": True}
        ).model_dump_json()
    ]


def test_read_start_request_and_emit_result_round_trip() -> None:
    req = start_request("http://h:1/v1", {"question": "2+2?"}, temperature=0.5, max_steps=3)
    assert read_start_request(io.StringIO(req.model_dump_json())) == req
    with pytest.raises(ValidationError):
        read_start_request(io.StringIO('{"job_id": "j"}'))
    out = io.StringIO()
    emit_result(SimulationStartResult(session_id="s", status="truncated"), out)
    assert out.getvalue().count("\n") == 1
    assert SimulationStartResult.model_validate_json(out.getvalue()).status == "truncated"


def test_openai_client_targets_the_session_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    req = start_request("http://127.0.0.1:8000/v1", {})
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    client = openai_client(req, max_retries=1)
    assert str(client.base_url) == "http://127.0.0.1:8000/v1/sessions/sess-1/"
    assert client.api_key == "sk-rollout"
    assert client.max_retries == 1
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    assert openai_client(req).api_key == "sk-test"


async def test_chat_completion_reads_the_gateway_stop_header() -> None:
    async with FakeUpstream() as up:
        up.script(
            None,
            [
                Reply.json(completion_body("hi")),
                Reply.json(completion_body(""), headers={"x-gateway-stop-reason": "max_steps"}),
            ],
        )
        client = openai_client(start_request(up.base_url, {}), max_retries=0)
        # The sync SDK runs in a thread so it does not block the fake upstream's loop.
        first, first_stop = await asyncio.to_thread(chat_completion, client, model="m", messages=[])
        second, second_stop = await asyncio.to_thread(chat_completion, client, model="m", messages=[])
    assert (first.choices[0].message.content, first_stop) == ("hi", None)
    assert (second.choices[0].message.content, second_stop) == ("", "max_steps")
    assert [r.path for r in up.requests] == ["/v1/sessions/sess-1/chat/completions"] * 2
