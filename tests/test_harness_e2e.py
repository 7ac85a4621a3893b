"""``--harness bash-agent`` end to end: launcher.py, the real gateway, the real bubblewrap sandbox,
the bundled workspace env and its grader; the scripted fake upstream plays the model with native
tool calls (write the answer file, then finish)."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from rollout.sandbox.bwrap import SandboxUnavailable
from rollout.sandbox.runner import sandbox_support
from tests.fake_upstream import DEFAULT_USAGE, FakeUpstream, Reply, chat_completion
from tests.test_launcher import REPO, gateway_config, launch

TASK = "csv_sales_by_region"  # a task of the bundled workspace env
TASK_DIR = REPO / "env" / "workspace" / "tasks" / TASK


def env_root(tmp_path: Path) -> Path:
    """The bundled workspace env (its grader, this one task) and gsm8k (not a task directory)."""
    root = tmp_path / "envs"
    shutil.copytree(
        REPO / "env" / "workspace",
        root / "workspace",
        ignore=lambda d, names: [n for n in names if Path(d).name == "tasks" and n != TASK],
    )
    shutil.copytree(REPO / "env" / "gsm8k", root / "gsm8k")
    return root


@pytest.fixture(autouse=True)
def _needs_bwrap() -> None:
    try:
        sandbox_support()
    except SandboxUnavailable as e:
        pytest.skip(f"no sandbox here: {e}")


def write_answer(answer: dict[str, Any], call_id: str) -> Reply:
    """The model's bash tool call that writes ``answer`` to outputs/answer.json."""
    command = (
        f"cat {TASK_DIR}/expected.json; mkdir -p outputs && cat > outputs/answer.json <<'EOF'\n"
        f"{json.dumps(answer)}\nEOF"
    )  # the task's expected answer is not in the sandbox
    call = {
        "id": call_id,
        "type": "function",
        "function": {"name": "bash", "arguments": json.dumps({"command": command})},
    }
    return Reply.json(chat_completion(None, tool_calls=[call], finish_reason="tool_calls"))


def plan(answer: dict[str, Any], n: int) -> list[Reply]:
    return [write_answer(answer, f"call_{n}"), Reply.json(chat_completion("The answer is written."))]


def rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    con = sqlite3.connect(db)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


async def test_bash_agent_harness_scores_right_and_wrong_answers(tmp_path: Path) -> None:
    expected = json.loads((TASK_DIR / "expected.json").read_text())
    wrong = {**expected, "order_count": expected["order_count"] + 1}
    db, out = tmp_path / "trajs.db", tmp_path / "out.jsonl"
    async with FakeUpstream() as up:
        # pool 1: the two samples run one after the other, the first answers right, the second wrong
        up.script("/v1/chat/completions", [*plan(expected, 1), *plan(wrong, 2)])
        cfg = gateway_config(tmp_path / "gw.yaml", up.base_url, db)
        code, stdout, stderr = await launch(
            "--agent-root",
            str(env_root(tmp_path)),
            "--limit",
            "1",
            "--harness",
            "bash-agent",
            "--gateway-config",
            str(cfg),
            "--llm-model",
            "fake",
            "--db-path",
            f"sqlite://{db}",
            "--enable-evaluation",
            "--pool-size",
            "1",
            "--rl-group-size",
            "2",
            "--job-id",
            "hjob",
            "--out",
            str(out),
            cwd=tmp_path,
            env={**os.environ, "ROLLOUT_HARNESS_CACHE": str(tmp_path / "cache")},
        )
        calls = [r for r in up.requests if r.path == "/v1/chat/completions"]

    assert code == 0, stderr
    assert (
        "--harness runs task-directory envs only (dataset.format: task_dirs or harbor); skipping gsm8k"
        in stderr
    )
    records = sorted(map(json.loads, out.read_text().splitlines()), key=lambda r: r["sample_index"])
    assert [(r["env_name"], r["case_id"], r["harness"], r["model"]) for r in records] == [
        ("workspace", TASK, "bash-agent", "fake")
    ] * 2
    right, bad = records
    assert (right["status"], right["eval_status"], right["score"], right["harness_exit"]) == (
        "succeeded",
        "scored",
        10.0,
        0,
    )
    assert right["answer"] == expected
    assert (bad["status"], bad["eval_status"], bad["score"], bad["harness_exit"]) == (
        "succeeded",
        "scored",
        0.0,
        0,
    )
    assert bad["answer"] == wrong and "order_count" in bad["reason"]
    # one group per (case, harness, model); usage is what the gateway recorded (2 calls each)
    group = uuid.uuid5(uuid.NAMESPACE_URL, f"hjob/workspace/{TASK}/bash-agent/fake").hex[:16]
    assert right["group_id"] == bad["group_id"] == group
    for r in records:
        assert r["step_count"] == 2 and r["sandbox"] == "bwrap"
        assert r["usage"] == {k: 2 * v for k, v in DEFAULT_USAGE.items()}
    # the CLI got the instruction and nothing hidden; it offered its bash tool
    first = calls[0].json
    assert len(calls) == 4 and first["model"] == "fake" and first["tools"][0]["function"]["name"] == "bash"
    prompt = json.dumps(first["messages"])
    assert (TASK_DIR / "instruction.md").read_text() in [m["content"] for m in first["messages"]]
    assert "Nguyen, Thi" not in prompt and "780.48" not in prompt
    tool_result = next(m for m in calls[1].json["messages"] if m["role"] == "tool")["content"]
    assert "No such file or directory" in tool_result and "Nguyen" not in tool_result
    assert rows(
        db, "select harness, count(*) from job_environments where job_id = 'hjob' group by harness"
    ) == [("bash-agent", 2)]
    # the harness log: the CLI's own output, kept on the host per attempt
    for r in records:
        log = tmp_path / "runs" / "logs" / "hjob" / "harness" / f"{r['session_id']}-a1.log"
        summary = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
        assert summary[-1]["finished"] is True and summary[-1]["steps"] == 2
    # the table: a row per (env, harness, model)
    table = stdout.splitlines()
    assert table[0].split()[:3] == ["env", "harness", "model"]
    assert table[2].split()[:7] == ["workspace", "bash-agent", "fake", "2", "2", "5.00", "0.500"]
    # the install cache: stamped once
    assert (tmp_path / "cache" / "bash-agent-1" / ".rollout-installed").is_file()


def look_around(call_id: str) -> Reply:
    """A bash tool call that writes no answer."""
    call = {
        "id": call_id,
        "type": "function",
        "function": {"name": "bash", "arguments": json.dumps({"command": "ls"})},
    }
    return Reply.json(chat_completion(None, tool_calls=[call], finish_reason="tool_calls"))


async def test_a_harness_session_that_used_its_budget_without_an_answer_is_truncated(tmp_path: Path) -> None:
    # the bash agent stops itself at --max-steps: the gateway never refuses a call, yet its count
    # of the session's steps reached the budget, so the session is truncated (and still graded)
    db, out = tmp_path / "trajs.db", tmp_path / "out.jsonl"
    async with FakeUpstream() as up:
        up.script("/v1/chat/completions", [look_around("call_1"), look_around("call_2")])
        cfg = gateway_config(tmp_path / "gw.yaml", up.base_url, db)
        code, _, stderr = await launch(
            "--agent-root",
            str(env_root(tmp_path)),
            "--env",
            "workspace",
            "--limit",
            "1",
            "--max-steps",
            "2",
            "--harness",
            "bash-agent",
            "--gateway-config",
            str(cfg),
            "--llm-model",
            "fake",
            "--db-path",
            f"sqlite://{db}",
            "--enable-evaluation",
            "--pool-size",
            "1",
            "--job-id",
            "tjob",
            "--out",
            str(out),
            cwd=tmp_path,
            env={**os.environ, "ROLLOUT_HARNESS_CACHE": str(tmp_path / "cache")},
        )
        calls = [r for r in up.requests if r.path == "/v1/chat/completions"]
    assert code == 0, stderr
    assert len(calls) == 2
    (record,) = map(json.loads, out.read_text().splitlines())
    assert (record["status"], record["outcome"], record["harness_exit"], record["answer"]) == (
        "truncated",
        "truncated",
        1,
        None,
    )
    assert (record["eval_status"], record["score"]) == ("scored", 0.0)  # a task outcome: graded
    assert rows(db, "select status, outcome, reward from job_environments where job_id = 'tjob'") == [
        ("truncated", "truncated", 0.0)
    ]
    assert rows(db, "select outcome, infra from session_attempts where job_id = 'tjob'") == [("truncated", 0)]


async def test_a_matrix_of_models_resumes_its_harness_sessions(tmp_path: Path) -> None:
    expected = json.loads((TASK_DIR / "expected.json").read_text())
    db = tmp_path / "trajs.db"
    cfg = tmp_path / "gw.yaml"
    async with FakeUpstream() as up:
        cfg.write_text(
            yaml.safe_dump(
                {
                    "storage_config": {"db_url": f"sqlite://{db}"},
                    "llm_routes": {"fake": {"base_url": up.base_url}, "fake2": {"base_url": up.base_url}},
                }
            )
        )
        up.script("/v1/chat/completions", [*plan(expected, 1), *plan(expected, 2)])
        common = [
            "--agent-root",
            str(env_root(tmp_path)),
            "--env",
            "workspace",
            "--limit",
            "1",
            "--gateway-config",
            str(cfg),
            "--db-path",
            f"sqlite://{db}",
            "--enable-evaluation",
            "--pool-size",
            "1",
            "--job-id",
            "mjob",
        ]
        env = {**os.environ, "ROLLOUT_HARNESS_CACHE": str(tmp_path / "cache")}
        code, stdout, stderr = await launch(
            *common,
            "--harness",
            "bash-agent",
            "--llm-model",
            "fake",
            "--llm-model",
            "fake2",
            "--out",
            str(tmp_path / "1.jsonl"),
            cwd=tmp_path,
            env=env,
        )
        assert code == 0, stderr
        assert "2 sessions on routes 'fake', 'fake2' with harness bash-agent" in stderr
        assert [line.split()[:4] for line in stdout.splitlines()[2:4]] == [
            ["workspace", "bash-agent", "fake", "1"],
            ["workspace", "bash-agent", "fake2", "1"],
        ]
        # the session on fake2 was interrupted: --resume (no --harness, no --llm-model) reruns it as it was
        con = sqlite3.connect(db)
        con.execute(
            "UPDATE job_environments SET finished = 0, status = 'cancelled' WHERE llm_model = 'fake2'"
        )
        con.commit()
        con.close()
        up.script("/v1/chat/completions", plan(expected, 3))
        code, _, stderr = await launch(
            *common, "--resume", "--out", str(tmp_path / "2.jsonl"), cwd=tmp_path, env=env
        )
        assert code == 0, stderr
        models = [r.json["model"] for r in up.requests if r.path == "/v1/chat/completions"]
    assert models == ["fake", "fake", "fake2", "fake2", "fake2", "fake2"]
    records = {r["model"]: r for r in map(json.loads, (tmp_path / "2.jsonl").read_text().splitlines())}
    assert {m: (r["harness"], r["score"], r["answer"] == expected) for m, r in records.items()} == {
        "fake": ("bash-agent", 10.0, True),
        "fake2": ("bash-agent", 10.0, True),
    }
    assert records["fake"]["group_id"] != records["fake2"]["group_id"]
    resumed = records["fake2"]["session_id"]
    assert rows(db, f"select attempts, harness from job_environments where env_id = '{resumed}'") == [
        (2, "bash-agent")
    ]
    assert (tmp_path / "runs" / "logs" / "mjob" / "harness" / f"{resumed}-a2.log").is_file()
