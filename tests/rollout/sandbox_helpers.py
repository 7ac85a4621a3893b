"""Shared by the sandbox tests: bubblewrap must work here (a test fails, not skips, under CI=true)
and a temporary env made from a runtime source and its config."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from rollout.envs import EnvConfig, load_env_config
from rollout.protocol import SimulationStartRequest
from rollout.runner import sandbox_support
from rollout.sandbox import SandboxUnavailable, Support


def require_bwrap() -> Support:
    """This machine's sandbox support; skips the test when bubblewrap cannot run here, except
    under ``CI=true`` where that is a failure (CI installs bubblewrap)."""
    try:
        return sandbox_support()
    except SandboxUnavailable as e:
        if os.environ.get("CI") == "true":
            pytest.fail(f"bubblewrap is required under CI: {e}")
        pytest.skip(f"bubblewrap unavailable: {e}")


def make_env(root: Path, name: str, runtime: str, rows: list[dict[str, Any]] | None = None,
             runtime_cfg: dict[str, Any] | None = None, hidden: list[str] | None = None) -> EnvConfig:
    """``root/name/`` with ``runtime.py``, ``data/cases.jsonl`` and ``env.yaml``; returns its config."""
    d = root / name
    (d / "data").mkdir(parents=True)
    (d / "runtime.py").write_text(runtime)
    (d / "data" / "cases.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows or [{"id": "0"}]))
    cfg = {"name": name, "dataset": {"path": "data/cases.jsonl", "id_field": "id", "hidden_fields": hidden or []},
           "runtime": {"command": ["{python}", "{env_dir}/runtime.py"], "timeout_s": 120, **(runtime_cfg or {})}}
    (d / "env.yaml").write_text(yaml.safe_dump(cfg))
    return load_env_config(d / "env.yaml")


def request(sid: str = "s1", gateway: str = "http://127.0.0.1:9/v1/sessions", **params: Any) -> SimulationStartRequest:
    """A start request for session ``sid`` (the gateway URL needs no server unless the runtime calls it)."""
    return SimulationStartRequest(job_id="j", session_id=sid, agent_name="t", agent_id="t-0", group_id="g",
                                  gateway_base_url=f"{gateway}/{sid}", model="m", env_params=params)
