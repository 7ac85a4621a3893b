"""The bundled envs run unchanged in the sandbox (the default): through the real launcher and
gateway, the fake upstream as the model, each runtime starts, reaches its session and is graded."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml

from tests.fake_upstream import DEFAULT_TEXT, FakeUpstream, Reply, chat_completion
from tests.rollout.sandbox_helpers import require_bwrap, workspace_tool_call_run
from tests.test_launcher import gateway_config, launch

REPO = Path(__file__).resolve().parents[2]


async def test_bundled_envs_run_in_the_sandbox_by_default(tmp_path: Path) -> None:
    require_bwrap()
    db, out = tmp_path / "trajs.db", tmp_path / "out.jsonl"
    async with FakeUpstream() as up:
        cfg = gateway_config(tmp_path / "gw.yaml", up.base_url, db)
        code, stdout, stderr = await launch(
            "--agent-root",
            str(REPO / "env"),
            "--gateway-config",
            str(cfg),
            "--llm-model",
            "fake",
            "--db-path",
            f"sqlite://{db}",
            "--enable-evaluation",
            "--limit",
            "1",
            "--job-id",
            "bundled",
            "--out",
            str(out),
            cwd=tmp_path,
        )
    assert code == 0, stderr
    assert "sandbox: bubblewrap" in stderr and "WITHOUT a sandbox" not in stdout
    all_records = [json.loads(line) for line in out.read_text().splitlines()]
    basics = [r for r in all_records if r["env_name"] == "basics"]
    harbor = [r for r in all_records if r["env_name"] == "harbor_tasks"]
    scripts = [r for r in all_records if r["env_name"] == "scripts"]
    records = {
        r["env_name"]: r for r in all_records if r["env_name"] not in ("basics", "harbor_tasks", "scripts")
    }
    assert set(records) == {"gsm8k", "workspace"}
    # harbor_tasks: the text protocol too (2 steps of format errors); graded by the task's own tests,
    # run in their verifier sandbox on the untouched workspace: reward 0
    [h] = harbor
    assert (h["sandbox"], h["status"], h["step_count"], h["eval_status"], h["score"]) == (
        "bwrap",
        "truncated",
        2,
        "scored",
        0.0,
    ), h
    assert h["reason"].startswith("verifier reward 0: read from reward.json"), h["reason"]
    # basics: its env-level group_size (4 samples); a reply without a fenced block is a format
    # error that still counts as a step, so each sample uses its 3 steps and writes nothing: its
    # budget ran out without an answer, so it is truncated (and graded: 0)
    assert len(basics) == 4 and len({r["group_id"] for r in basics}) == 1
    for r in basics:
        assert (r["sandbox"], r["status"], r["outcome"], r["step_count"], r["score"]) == (
            "bwrap",
            "truncated",
            "truncated",
            3,
            0.0,
        )
        assert r["trajectory"][1]["messages"][-1]["content"].startswith(
            "Format error: your reply had no ```bash"
        )
    # scripts: the same text protocol, one sample (its group_size), its files written by its runtime
    [sc] = scripts
    assert (sc["sandbox"], sc["status"], sc["step_count"], sc["eval_status"], sc["score"]) == (
        "bwrap",
        "truncated",
        3,
        "scored",
        0.0,
    ), sc
    for r in records.values():
        assert r["sandbox"] == "bwrap"
        assert r["step_count"] == 1 and r["trajectory"][0]["content"] == DEFAULT_TEXT
        assert (r["eval_status"], r["score"]) == ("scored", 0.0)
    assert (records["gsm8k"]["status"], records["gsm8k"]["error"]) == ("succeeded", None)
    # the model never called a tool, so the agent wrote no answer: a normal failed session
    assert (records["workspace"]["status"], records["workspace"]["error"]) == (
        "failed",
        "outputs/answer.json is missing",
    )


async def test_workspace_agent_tools_run_in_the_sandbox_and_the_grader_sees_their_work(
    tmp_path: Path,
) -> None:
    require_bwrap()
    task = sorted((REPO / "env" / "workspace" / "tasks").iterdir())[0]
    answer = json.dumps(json.loads((task / "expected.json").read_text()))
    command = (
        f"test ! -e {task}/expected.json && id -u && pwd && ls && mkdir -p outputs && "
        f"printf '%s' '{answer}' > outputs/answer.json"
    )
    run = await workspace_tool_call_run(tmp_path, command, "tools")
    assert run.code == 0, run.stderr
    r = run.record
    assert (r["sandbox"], r["status"], r["eval_status"], r["score"], r["step_count"]) == (
        "bwrap",
        "succeeded",
        "scored",
        10.0,
        2,
    )
    # the tool ran inside: as the sandbox user, in /workspace, with the task's files and not its expected.json
    tool_result = r["trajectory"][1]["messages"][-1]["content"]
    assert tool_result.startswith("[exit code 0]\n65534\n/workspace\n"), tool_result
    assert set(tool_result.splitlines()[3:]) == {p.name for p in (task / "files").iterdir()}


async def test_basics_text_protocol_runs_the_task_script_in_the_sandbox(tmp_path: Path) -> None:
    require_bwrap()
    # the bundled basics env, on its run_script task only
    shutil.copytree(REPO / "env" / "basics" / "tasks" / "run_script", tmp_path / "tasks" / "run_script")
    cfg_yaml = yaml.safe_load((REPO / "env" / "basics" / "env.yaml").read_text())
    cfg_yaml["dataset"]["path"] = str(tmp_path / "tasks")
    (tmp_path / "basics").mkdir()
    (tmp_path / "basics" / "env.yaml").write_text(yaml.safe_dump(cfg_yaml))
    db, out = tmp_path / "trajs.db", tmp_path / "out.jsonl"
    run = "Sure.\n```bash\ntest ! -e expected.json && ./solve.sh\n```"
    submit = "```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"
    async with FakeUpstream() as up:
        up.script(
            "/v1/chat/completions", [Reply.json(chat_completion(run)), Reply.json(chat_completion(submit))]
        )
        cfg = gateway_config(tmp_path / "gw.yaml", up.base_url, db)
        code, _, stderr = await launch(
            "--agent-root",
            str(REPO / "env"),
            "--agent-config",
            str(tmp_path / "basics" / "env.yaml"),
            "--gateway-config",
            str(cfg),
            "--llm-model",
            "fake",
            "--db-path",
            f"sqlite://{db}",
            "--enable-evaluation",
            "--rl-group-size",
            "1",
            "--job-id",
            "text",
            "--out",
            str(out),
            cwd=tmp_path,
        )
        bodies = [r.json for r in up.requests if r.path.endswith("/chat/completions")]
    assert code == 0, stderr
    (r,) = map(json.loads, out.read_text().splitlines())
    assert (r["sandbox"], r["status"], r["step_count"], r["eval_status"], r["score"]) == (
        "bwrap",
        "succeeded",
        2,
        "scored",
        10.0,
    )
    assert r["reason"] == "all 1 expected keys match"
    # the block ran inside the sandbox and its output came back as a user message
    assert r["trajectory"][1]["messages"][-1] == {
        "role": "user",
        "content": "<returncode>0</returncode>\n<output>\nwrote outputs/answer.json\n</output>",
    }
    # the env's params: text protocol (no tools offered), its own temperature and max_tokens
    assert len(bodies) == 2
    assert all("tools" not in b and b["temperature"] == 0.5 and b["max_tokens"] == 96 for b in bodies)
