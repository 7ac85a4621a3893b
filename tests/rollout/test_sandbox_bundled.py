"""The bundled envs run unchanged in the sandbox (the default): through the real launcher and
gateway, the fake upstream as the model, each runtime starts, reaches its session and is graded."""

from __future__ import annotations

import json
from pathlib import Path

from tests.fake_upstream import DEFAULT_TEXT, FakeUpstream, Reply, chat_completion
from tests.rollout.sandbox_helpers import require_bwrap
from tests.test_launcher import gateway_config, launch

REPO = Path(__file__).resolve().parents[2]


async def test_bundled_envs_run_in_the_sandbox_by_default(tmp_path: Path) -> None:
    require_bwrap()
    db, out = tmp_path / "trajs.db", tmp_path / "out.jsonl"
    async with FakeUpstream() as up:
        cfg = gateway_config(tmp_path / "gw.yaml", up.base_url, db)
        code, stdout, stderr = await launch(
            "--agent-root", str(REPO / "env"), "--gateway-config", str(cfg), "--llm-model", "fake",
            "--db-path", f"sqlite://{db}", "--enable-evaluation", "--limit", "1", "--job-id", "bundled",
            "--out", str(out), cwd=tmp_path)
    assert code == 0, stderr
    assert "sandbox: bubblewrap" in stderr and "WITHOUT a sandbox" not in stdout
    records = {r["env_name"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert set(records) == {"gsm8k", "workspace"}
    for r in records.values():
        assert r["sandbox"] == "bwrap"
        assert r["step_count"] == 1 and r["trajectory"][0]["content"] == DEFAULT_TEXT
        assert (r["eval_status"], r["score"]) == ("scored", 0.0)
    assert (records["gsm8k"]["status"], records["gsm8k"]["error"]) == ("succeeded", None)
    # the model never called a tool, so the agent wrote no answer: a normal failed session
    assert (records["workspace"]["status"], records["workspace"]["error"]) == ("failed", "outputs/answer.json is missing")


async def test_workspace_agent_tools_run_in_the_sandbox_and_the_grader_sees_their_work(tmp_path: Path) -> None:
    require_bwrap()
    task = sorted((REPO / "env" / "workspace" / "tasks").iterdir())[0]
    answer = json.dumps(json.loads((task / "expected.json").read_text()))
    command = (f"test ! -e {task}/expected.json && id -u && pwd && ls && mkdir -p outputs && "
               f"printf '%s' '{answer}' > outputs/answer.json")
    tool_call = {"id": "call_1", "type": "function", "function": {"name": "bash",
                                                                   "arguments": json.dumps({"command": command})}}
    db, out = tmp_path / "trajs.db", tmp_path / "out.jsonl"
    async with FakeUpstream() as up:
        up.script("/v1/chat/completions", [Reply.json(chat_completion(None, tool_calls=[tool_call],
                                                                      finish_reason="tool_calls")),
                                           Reply.json(chat_completion("done"))])
        cfg = gateway_config(tmp_path / "gw.yaml", up.base_url, db)
        code, _, stderr = await launch(
            "--agent-root", str(REPO / "env"), "--env", "workspace", "--gateway-config", str(cfg),
            "--llm-model", "fake", "--db-path", f"sqlite://{db}", "--enable-evaluation", "--limit", "1",
            "--job-id", "tools", "--out", str(out), cwd=tmp_path)
    assert code == 0, stderr
    (r,) = map(json.loads, out.read_text().splitlines())
    assert (r["sandbox"], r["status"], r["eval_status"], r["score"], r["step_count"]) == \
        ("bwrap", "succeeded", "scored", 10.0, 2)
    # the tool ran inside: as the sandbox user, in /workspace, with the task's files and not its expected.json
    tool_result = r["trajectory"][1]["messages"][-1]["content"]
    assert tool_result.startswith("[exit code 0]\n65534\n/workspace\n"), tool_result
    assert set(tool_result.splitlines()[3:]) == {p.name for p in (task / "files").iterdir()}
