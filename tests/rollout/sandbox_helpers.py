"""Shared by the sandbox tests: bubblewrap must work here (a test fails, not skips, under CI=true)
and a temporary env made from a runtime source and its config."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from rollout.contract.protocol import SimulationStartRequest
from rollout.core.envs import EnvConfig, load_env_config
from rollout.sandbox.bwrap import SandboxUnavailable, Support
from rollout.sandbox.runner import sandbox_support


def require_bwrap() -> Support:
    """This machine's sandbox support; skips the test when bubblewrap cannot run here, except
    under ``CI=true`` where that is a failure (CI installs bubblewrap)."""
    try:
        return sandbox_support()
    except SandboxUnavailable as e:
        if os.environ.get("CI") == "true":
            pytest.fail(f"bubblewrap is required under CI: {e}")
        pytest.skip(f"bubblewrap unavailable: {e}")


def make_env(
    root: Path,
    name: str,
    runtime: str,
    rows: list[dict[str, Any]] | None = None,
    runtime_cfg: dict[str, Any] | None = None,
    hidden: list[str] | None = None,
) -> EnvConfig:
    """``root/name/`` with ``runtime.py``, ``data/cases.jsonl`` and ``env.yaml``; returns its config."""
    d = root / name
    (d / "data").mkdir(parents=True)
    (d / "runtime.py").write_text(runtime)
    (d / "data" / "cases.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows or [{"id": "0"}]))
    cfg = {
        "name": name,
        "dataset": {"path": "data/cases.jsonl", "id_field": "id", "hidden_fields": hidden or []},
        "runtime": {"command": ["{python}", "{env_dir}/runtime.py"], "timeout_s": 120, **(runtime_cfg or {})},
    }
    (d / "env.yaml").write_text(yaml.safe_dump(cfg))
    return load_env_config(d / "env.yaml")


def request(
    sid: str = "s1", gateway: str = "http://127.0.0.1:9/v1/sessions", **params: Any
) -> SimulationStartRequest:
    """A start request for session ``sid`` (the gateway URL needs no server unless the runtime calls it)."""
    return SimulationStartRequest(
        job_id="j",
        session_id=sid,
        agent_name="t",
        agent_id="t-0",
        group_id="g",
        gateway_base_url=f"{gateway}/{sid}",
        model="m",
        env_params=params,
    )


@dataclass
class ToolCallRun:
    """What ``workspace_tool_call_run`` left: the launcher's exit code and output, the one JSONL
    record, the model calls the fake upstream answered, and the store's path."""

    code: int
    stdout: str
    stderr: str
    record: dict[str, Any]
    calls: int
    db: Path


async def workspace_tool_call_run(
    tmp_path: Path, command: str, job_id: str, *flags: str, then: str | None = "done"
) -> ToolCallRun:
    """One bundled ``workspace`` session through the real launcher, gateway and sandbox, graded,
    whose scripted model makes one bash tool call running ``command``, then answers ``then``
    (None: no second answer is scripted)."""
    from tests.fake_upstream import FakeUpstream, Reply, chat_completion  # noqa: PLC0415
    from tests.test_launcher import gateway_config, launch  # noqa: PLC0415

    repo = Path(__file__).resolve().parents[2]
    tool_call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "bash", "arguments": json.dumps({"command": command})},
    }
    replies = [Reply.json(chat_completion(None, tool_calls=[tool_call], finish_reason="tool_calls"))]
    if then is not None:
        replies.append(Reply.json(chat_completion(then)))
    db, out = tmp_path / "trajs.db", tmp_path / "out.jsonl"
    async with FakeUpstream() as up:
        up.script("/v1/chat/completions", replies)
        cfg = gateway_config(tmp_path / "gw.yaml", up.base_url, db)
        code, stdout, stderr = await launch(
            "--agent-root",
            str(repo / "env"),
            "--env",
            "workspace",
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
            job_id,
            "--out",
            str(out),
            *flags,
            cwd=tmp_path,
        )
        calls = len([r for r in up.requests if r.path.endswith("/chat/completions")])
    records = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    assert len(records) == 1, (code, stderr)
    return ToolCallRun(code, stdout, stderr, records[0], calls, db)


def process_parents() -> dict[int, int]:
    """Every running process's parent pid, by pid (read from ``/proc``)."""
    out: dict[int, int] = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        out[int(name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return out
