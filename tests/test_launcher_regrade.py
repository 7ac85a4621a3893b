"""``launcher.py --regrade``: the bundled workspace env run for real (scripted fake model solving a
task with its bash tool), then graded again from the store by the bundled grader and by a changed
one, with no model call; a missing kept workspace, exit codes and flag errors."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from tests.fake_upstream import FakeUpstream, Reply, chat_completion
from tests.test_launcher import REPO, gateway_config, launch, rows

TASK = "csv_sales_by_region"  # the first bundled workspace task (sorted), so --limit 1 runs it
EXPECTED = json.loads((REPO / "env" / "workspace" / "tasks" / TASK / "expected.json").read_text())
WRITE = f"mkdir -p outputs && cat > outputs/answer.json <<'EOF'\n{json.dumps(EXPECTED)}\nEOF"

CHANGED_GRADER = """
import json
import sqlite3
from pathlib import Path

def evaluate(request, spec, trajectory):
    ws = Path(request.workspace)
    answer = json.loads((ws / "outputs" / "answer.json").read_text())
    return {"score": 5, "reason": f"{sorted(answer)} {sorted(p.name for p in ws.iterdir())}"}
"""


def records(path: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_regrade_bundled_workspace_env_without_the_model(tmp_path: Path) -> None:
    db = tmp_path / "trajs.db"
    async with FakeUpstream() as up:
        up.script(
            None,
            [
                Reply.json(
                    chat_completion(
                        None,
                        finish_reason="tool_calls",
                        tool_calls=[
                            {
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": "bash", "arguments": json.dumps({"command": WRITE})},
                            }
                        ],
                    )
                ),
                Reply.json(chat_completion("Done.")),
            ],
        )
        cfg = gateway_config(tmp_path / "gw.yaml", up.base_url, db)
        code, _, err = await launch(
            "--agent-root",
            str(REPO / "env"),
            "--env",
            "workspace",
            "--limit",
            "1",
            "--gateway-config",
            str(cfg),
            "--llm-model",
            "fake",
            "--db-path",
            f"sqlite://{db}",
            "--enable-evaluation",
            "--job-id",
            "jw",
            "--out",
            str(tmp_path / "run.jsonl"),
            cwd=tmp_path,
        )
        assert code == 0, err
        [run] = records(tmp_path / "run.jsonl")
        assert (run["case_id"], run["status"], run["score"]) == (TASK, "succeeded", 10.0)
        assert run["reason"] == "all 3 expected keys match"
        calls = len(up.requests)
        assert calls == 2
        started = rows(db, "SELECT attempts, started_at FROM job_environments")

        # the bundled grader again: the restored workspace grades exactly as the live one did
        common = ["--regrade", "--job-id", "jw", "--db-path", f"sqlite://{db}"]
        code, out, err = await launch(
            *common,
            "--agent-root",
            str(REPO / "env"),
            "--out",
            str(tmp_path / "r1.jsonl"),
            cwd=tmp_path,
            progress=True,
        )
        assert code == 0, err
        assert "regrade jw: 1/1 sessions\n" in err and "\r" not in err  # no terminal: plain lines
        [r1] = records(tmp_path / "r1.jsonl")
        assert (r1["score"], r1["eval_status"], r1["reason"]) == (10.0, "scored", "all 3 expected keys match")
        assert "workspace" in out and "pass@1" in out
        assert "regrade of job jw: 1 session regraded (0 changed), 0 not regraded" in out

        # a changed grader (same env name, another agent root) sees the whole final workspace
        fixed = tmp_path / "envs" / "workspace"
        fixed.mkdir(parents=True)
        (fixed / "rule_evaluator.py").write_text(CHANGED_GRADER)
        code, out, err = await launch(
            *common,
            "--agent-root",
            str(tmp_path / "envs"),
            "--env",
            "workspace",
            "--out",
            str(tmp_path / "r2.jsonl"),
            cwd=tmp_path,
        )
        assert code == 0, err
        [r2] = records(tmp_path / "r2.jsonl")
        assert (r2["score"], r2["reason"]) == (
            5.0,
            "['order_count', 'top_customer', 'total_by_region'] ['outputs', 'sales.csv']",
        )
        assert "1 session regraded (1 changed)" in out
        [(reward, history)] = rows(db, "SELECT reward, eval_history FROM job_environments")
        assert reward == 5.0
        assert [(h["eval_status"], h["reward"]) for h in json.loads(history)] == [
            ("scored", 10.0),
            ("scored", 10.0),
        ]

        # a grader still broken (it fails on the untouched start too): said on stderr, exit code 2
        broken = tmp_path / "broken" / "workspace"
        broken.mkdir(parents=True)
        (broken / "rule_evaluator.py").write_text(
            "def evaluate(request, spec, trajectory):\n    raise KeyError('x')\n"
        )
        code, out, err = await launch(
            *common, "--agent-root", str(broken.parent), "--out", str(tmp_path / "rb.jsonl"), cwd=tmp_path
        )
        assert code == 2, err
        assert "error: the grader is still broken (workspace 1): it failed on the case's untouched" in err, (
            err
        )
        fixed_again = await launch(
            *common,
            "--agent-root",
            str(tmp_path / "envs"),
            "--out",
            str(tmp_path / "r2b.jsonl"),
            cwd=tmp_path,
        )
        assert fixed_again[0] == 0, fixed_again[2]

        # without its kept workspace a session is reported and keeps its evaluation: exit code 2
        con = sqlite3.connect(db)
        con.execute("DELETE FROM session_workspaces")
        con.commit()
        con.close()
        code, out, err = await launch(
            *common, "--agent-root", str(REPO / "env"), "--out", str(tmp_path / "r3.jsonl"), cwd=tmp_path
        )
        assert code == 2, err
        assert "0 sessions regraded (0 changed), 1 not regraded (previous evaluation kept)" in out
        assert (
            f"workspace: 1 cannot be regraded (no_workspace): no kept workspace (the run did not archive it) "
            f"[{TASK}#0]" in out
        )
        assert rows(db, "SELECT reward, eval_status FROM job_environments") == [(5.0, "scored")]

        # no regrade called the model or ran the runtime again
        assert len(up.requests) == calls
        assert rows(db, "SELECT attempts, started_at FROM job_environments") == started
        assert rows(db, "SELECT count(*) FROM session_steps") == [(2,)]


async def test_regrade_flag_errors(tmp_path: Path) -> None:
    db = tmp_path / "none.db"
    code, _, err = await launch("--regrade", cwd=tmp_path)
    assert code == 1 and "--regrade needs --job-id" in err
    code, _, err = await launch("--regrade", "--job-id", "j", "--llm-model", "x", "--resume", cwd=tmp_path)
    assert code == 1 and "--llm-model, --resume cannot be used with it" in err
    code, _, err = await launch("--regrade", "--job-id", "j", "--pool-size", "0", cwd=tmp_path)
    assert code == 1 and "--pool-size" in err
    code, _, err = await launch(
        "--regrade", "--job-id", "nosuch", "--db-path", f"sqlite://{db}", cwd=tmp_path
    )
    assert code == 1 and f"agent root env is not a directory (in {tmp_path})" in err  # said before the store
    flags = [
        "--regrade",
        "--job-id",
        "nosuch",
        "--db-path",
        f"sqlite://{db}",
        "--agent-root",
        str(REPO / "env"),
    ]
    code, _, err = await launch(*flags, cwd=tmp_path)
    assert code == 1 and f"no trajectory store at {db} (pass the job's --db-path)" in err, err
    assert not db.exists()  # a regrade never makes a store
    sqlite3.connect(db).close()
    code, _, err = await launch(*flags, cwd=tmp_path)
    assert code == 1 and "no job 'nosuch'" in err, err
