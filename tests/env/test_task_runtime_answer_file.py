"""env.task_runtime with ``answer_file: false`` (a Harbor task: its tests grade the workspace): the
session's status says how the agent loop ended, never whether an answer file exists, and an
outage still reaches the launcher as one (``error_class``)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import env.task_runtime as task_runtime
from rollout.contract.protocol import SimulationStartRequest


def run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, params: dict[str, Any], **loop: Any) -> Any:
    outcome = SimpleNamespace(
        steps=2,
        tool_calls=1,
        format_errors=0,
        stop_reason="done",
        finished=True,
        truncated=False,
        error=None,
        error_class=None,
    )
    for k, v in loop.items():
        setattr(outcome, k, v)
    monkeypatch.setattr(task_runtime, "run_agent", lambda *a, **kw: outcome)
    monkeypatch.setattr(task_runtime, "openai_client", lambda req: None)
    monkeypatch.chdir(tmp_path)
    req = SimulationStartRequest(
        job_id="j",
        session_id="s",
        agent_name="a",
        agent_id="a",
        group_id="g",
        gateway_base_url="http://x",
        model="m",
        env_params={**params, "dataset": {"instruction": "do it"}},
    )
    return task_runtime.main(req)


def test_without_an_answer_file_the_loop_decides(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    off = {"answer_file": False}
    done = run(monkeypatch, tmp_path, off)
    assert (done.status, done.error_text, done.error_class) == ("succeeded", None, None)
    assert run(monkeypatch, tmp_path, off, truncated=True, finished=False).status == "truncated"
    down = run(
        monkeypatch, tmp_path, off, error="the gateway did not answer", error_class="gateway_unreachable"
    )
    assert (down.status, down.error_class) == ("failed", "gateway_unreachable")
    # the default still asks for outputs/answer.json
    asked = run(monkeypatch, tmp_path, {})
    assert (asked.status, asked.error_text) == ("failed", "outputs/answer.json is missing")


def test_a_fifo_or_a_folder_as_the_answer_file_is_refused_without_blocking(tmp_path: Path) -> None:
    import os

    (tmp_path / "outputs").mkdir()
    os.mkfifo(tmp_path / "outputs" / "answer.json")  # a blocking read would hold the session to its timeout
    assert task_runtime.check_answer(tmp_path) == "outputs/answer.json is not a regular file"
    os.unlink(tmp_path / "outputs" / "answer.json")
    (tmp_path / "outputs" / "answer.json").write_text('{"a": 1}')
    assert task_runtime.check_answer(tmp_path) is None
