"""The real agent CLIs (``claude-code``, ``codex``, ``mini-swe-agent``) run unmodified by
launcher.py on the bundled workspace env, through the real gateway and the real bubblewrap
sandbox, with the scripted policy (:class:`tests.fake_upstream.ScriptedPolicy`) as the route's
upstream: the right plan scores 10, a wrong plan 0, and every call the CLI made is a step whose
recorded response is what the policy sent. The CLIs come from the harness install cache (the
first run installs them once); a harness whose package cannot be installed here is skipped,
saying why. Select with ``-m harness``."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from rollout.contract.harness import HarnessUnavailable
from rollout.sandbox.bwrap import SandboxUnavailable
from rollout.sandbox.harness_cache import cache_root, install, load_harness
from rollout.sandbox.runner import sandbox_support
from store.stepcodec import decode_rows
from tests.fake_upstream import FakeUpstream, Plan, ScriptedPolicy

REPO = Path(__file__).resolve().parents[1]
TASK = "csv_sales_by_region"  # a task of the bundled workspace env
TASK_DIR = REPO / "env" / "workspace" / "tasks" / TASK
ROUTE_KEY = "sk-route-SECRET-e2e-5d1f"

pytestmark = pytest.mark.harness

# harness -> (the route's api, ScriptedPolicy.text_protocol, plan ends with the submit command)
CLIS: dict[str, tuple[str, bool | None, bool]] = {
    "claude-code": ("anthropic", False, False),
    "codex": ("openai", False, False),
    "mini-swe-agent": ("openai", None, True),
}
# the CLI's own correlation headers every step keeps (meta_json.client_headers)
CLIENT_HEADERS = {
    "claude-code": {"x-claude-code-session-id"},
    "codex": {"session-id", "thread-id", "x-client-request-id", "x-codex-window-id"},
    "mini-swe-agent": set(),
}


def installed(name: str) -> None:
    """Install the harness into the shared cache (once per machine), or skip saying why not."""
    try:
        sandbox_support()
    except SandboxUnavailable as e:
        pytest.skip(f"no sandbox here: {e}")
    try:
        install(load_harness(name), cache_root())
    except HarnessUnavailable as e:
        pytest.skip(f"harness {name} cannot be installed here: {e}")


def env_root(tmp_path: Path) -> Path:
    """A copy of the bundled workspace env (its grader) holding only the task played."""
    root = tmp_path / "envs"
    shutil.copytree(
        REPO / "env" / "workspace",
        root / "workspace",
        ignore=lambda d, names: [n for n in names if Path(d).name == "tasks" and n != TASK],
    )
    return root


def gateway_config(path: Path, up: FakeUpstream, api: str, db: Path) -> Path:
    route = {"api_key": ROUTE_KEY, "base_url": up.base_url}
    if api == "anthropic":
        route = {**route, "api": "anthropic", "base_url": up.origin}
    path.write_text(
        yaml.safe_dump({"storage_config": {"db_url": f"sqlite://{db}"}, "llm_routes": {"policy": route}})
    )
    return path


async def launch(*args: str, cwd: Path) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(REPO / "launcher.py"),
        *args,
        "--no-progress",
        cwd=str(cwd),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO), "ROLLOUT_HARNESS_CACHE": str(cache_root())},
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=900)
    return proc.returncode or 0, out.decode(), err.decode()


_JSON_COLUMNS = (
    "messages",
    "request",
    "response",
    "prompt_token_ids",
    "completion_token_ids",
    "completion_logprobs",
    "meta_json",
    "encoding",
)


def steps_of(db: Path, sid: str) -> list[dict[str, Any]]:
    """The session's steps read with plain SQL, rebuilt as docs/storage.md tells such a reader to
    (deltas and compressed values: ``decode_rows`` on all the rows of the session)."""
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    try:
        rows = con.execute(
            "select session_id, seq, llm_model, endpoint, is_stream, status, packed, "
            f"{', '.join(_JSON_COLUMNS)} from session_steps where session_id = ? order by seq",
            (sid,),
        ).fetchall()
    finally:
        con.close()
    steps = [
        {**dict(r), **{c: None if r[c] is None else json.loads(r[c]) for c in _JSON_COLUMNS}} for r in rows
    ]
    decode_rows(steps)
    return [{**st, "meta": st["meta_json"] or {}} for st in steps]


@pytest.mark.parametrize("name", sorted(CLIS))
async def test_cli_harness_scores_the_right_plan_10_and_a_wrong_plan_0(name: str, tmp_path: Path) -> None:
    installed(name)
    api, text_protocol, submit = CLIS[name]
    expected = json.loads((TASK_DIR / "expected.json").read_text())
    wrong = {**expected, "order_count": expected["order_count"] + 1}
    right_plan, wrong_plan = (
        Plan.write_answer(expected, submit=submit),
        Plan.write_answer(wrong, submit=submit),
    )
    db, out = tmp_path / "trajs.db", tmp_path / "out.jsonl"
    async with FakeUpstream() as up:
        policy = ScriptedPolicy([right_plan, wrong_plan], text_protocol=text_protocol)
        up.add_rule(policy)
        cfg = gateway_config(tmp_path / "gw.yaml", up, api, db)
        # pool 1: the two samples run one after the other; the first session gets the right plan
        code, stdout, stderr = await launch(
            "--agent-root",
            str(env_root(tmp_path)),
            "--env",
            "workspace",
            "--harness",
            name,
            "--gateway-config",
            str(cfg),
            "--llm-model",
            "policy",
            "--db-path",
            f"sqlite://{db}",
            "--enable-evaluation",
            "--pool-size",
            "1",
            "--rl-group-size",
            "2",
            "--job-id",
            "cli",
            "--out",
            str(out),
            cwd=tmp_path,
        )

    assert code == 0, stderr[-4000:]
    assert policy.errors == []
    records = {r["session_id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert len(records) == 2 and set(policy.session_plans) == set(records)
    for sid, r in records.items():
        right = policy.session_plans[sid] is right_plan
        assert (r["harness"], r["model"], r["status"], r["eval_status"], r["harness_exit"], r["sandbox"]) == (
            name,
            "policy",
            "succeeded",
            "scored",
            0,
            "bwrap",
        ), r
        assert (r["score"], r["answer"]) == ((10.0, expected) if right else (0.0, wrong)), r
        # every call the CLI made is a step whose recorded response is what the policy sent
        turns = [t for t in policy.turns if t.session_id == sid]
        steps = steps_of(db, sid)
        assert [t.kind for t in turns if t.kind != "side"] == (
            ["command", "command"] if submit else ["command", "final"]
        ), turns
        assert len(steps) == len(turns) == r["step_count"]
        for step, turn in zip(steps, turns, strict=True):
            assert (step["status"], bool(step["is_stream"]), step["response"]) == (
                "ok",
                turn.stream,
                turn.reply,
            )
            assert set(step["meta"].get("client_headers") or {}) == CLIENT_HEADERS[name], step["meta"]
        # the CLI ran the command in the sandbox and fed its output back to the model
        plan = policy.session_plans[sid]
        answer_text = json.dumps(expected if right else wrong, sort_keys=True)
        assert answer_text in (turns[1].observation or ""), turns[1]
        assert turns[0].observation is None and plan.commands[0].startswith("mkdir -p outputs")
        # usage is the gateway's: the sum of what the policy reported
        usage = [t.reply.get("usage") or {} for t in turns]
        prompt = sum(u.get("prompt_tokens", u.get("input_tokens", 0)) for u in usage)
        assert r["usage"]["prompt_tokens"] == prompt
    table = stdout.splitlines()
    assert table[2].split()[:7] == ["workspace", name, "policy", "2", "2", "5.00", "0.500"]
    # the route's key never reaches the CLI or the records
    assert ROUTE_KEY not in out.read_text() and ROUTE_KEY not in stderr
