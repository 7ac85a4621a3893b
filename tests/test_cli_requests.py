"""What each bundled agent CLI sends, pinned: the CLI (from the harness install cache) runs
headless through ``rollout.contract.harness_runtime`` straight against the scripted policy (no gateway,
no sandbox), and the shape of every request (method, path, query, header names, a few stable
header values, body keys, ``stream``, tool names) must equal the fixture
``tests/fixtures/cli_requests/<harness>.json``. A new CLI version that sends something new fails
here instead of changing silently. Secrets are never recorded (header names only). To record a
new version: ``ROLLOUT_UPDATE_CLI_FIXTURES=1 pytest tests/test_cli_requests.py``."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from rollout.contract.harness import HarnessUnavailable
from rollout.contract.protocol import SimulationStartRequest
from rollout.sandbox.harness_cache import cache_root, install, load_harness
from tests.fake_upstream import FakeRequest, FakeUpstream, Plan, ScriptedPolicy

FIXTURES = Path(__file__).with_name("fixtures") / "cli_requests"
API_KEY = "sk-cli-SECRET-0c4e7a"
# header values stable for a pinned CLI version (others vary per run or per machine, or are secret)
STABLE_HEADERS = (
    "accept",
    "anthropic-beta",
    "anthropic-version",
    "content-type",
    "originator",
    "x-app",
    "x-stainless-lang",
    "x-stainless-package-version",
)
CLIS: dict[str, tuple[bool | None, bool]] = {  # harness -> (text_protocol, submit)
    "claude-code": (False, False),
    "codex": (False, False),
    "mini-swe-agent": (None, True),
}

pytestmark = pytest.mark.harness


def tool_names(body: dict[str, Any]) -> list[str]:
    names = []
    for t in body.get("tools") or []:
        fn = t.get("function") if isinstance(t.get("function"), dict) else t
        names.append(str(fn.get("name") or t.get("type")))
    return sorted(names)


def shape(req: FakeRequest) -> dict[str, Any]:
    """The recorded shape of one request (module docstring)."""
    body = req.json if isinstance(req.json, dict) else None
    values = {k: req.headers[k] for k in STABLE_HEADERS if k in req.headers}
    if "user-agent" in req.headers:
        values["user-agent"] = req.headers["user-agent"].split(" ")[0]
    return {
        "method": req.method,
        "path": req.path,
        "query": req.query,
        "headers": sorted(req.headers),
        "header_values": values,
        "body_keys": sorted(body) if body is not None else None,
        "stream": body.get("stream") if body is not None else None,
        "tools": tool_names(body) if body is not None else None,
    }


async def run_cli(name: str, workspace: Path) -> tuple[list[FakeRequest], ScriptedPolicy, str]:
    loaded = load_harness(name)
    try:
        install_dir = install(loaded, cache_root()).install_dir
    except HarnessUnavailable as e:
        pytest.skip(f"harness {name} cannot be installed here: {e}")
    text_protocol, submit = CLIS[name]
    policy = ScriptedPolicy(Plan.write_answer({"ok": True}, submit=submit), text_protocol=text_protocol)
    async with FakeUpstream() as up:
        up.add_rule(policy)
        base = up.origin if loaded.harness.protocol == "anthropic_messages" else up.base_url
        req = SimulationStartRequest(
            job_id="j",
            session_id="s",
            agent_name="a",
            agent_id="a",
            group_id="g",
            gateway_base_url=base,
            model="policy",
            max_steps=8,
            env_params={"dataset": {"instruction": "Write the answer file."}},
        )
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "TERM")}
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "rollout.contract.harness_runtime",
            str(loaded.folder),
            str(install_dir),
            cwd=workspace,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**env, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "OPENAI_API_KEY": API_KEY},
        )
        out, err = await asyncio.wait_for(proc.communicate(req.model_dump_json().encode()), timeout=600)
        assert proc.returncode == 0, err.decode()[-3000:]
        result = json.loads(out.decode().splitlines()[-1])
        assert result["metrics"] == {"harness": name, "harness_exit": 0, "answer": {"ok": True}}, (
            err.decode()[-3000:]
        )
        return list(up.requests), policy, err.decode()


@pytest.mark.parametrize("name", sorted(CLIS))
async def test_cli_sends_what_its_fixture_records(name: str, tmp_path: Path) -> None:
    requests, policy, log = await run_cli(name, tmp_path)
    assert policy.errors == []
    got = {
        "harness": name,
        "version": load_harness(name).harness.version,
        "requests": [shape(r) for r in requests],
    }
    assert API_KEY not in json.dumps(got)
    path = FIXTURES / f"{name}.json"
    if os.environ.get("ROLLOUT_UPDATE_CLI_FIXTURES") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    assert got == json.loads(path.read_text()), f"{name} sends something new: compare with {path}"
    # the key the harness was given reached the model server as the CLI's credential
    auth = [
        r.headers.get("x-api-key") or r.headers.get("authorization", "").removeprefix("Bearer ")
        for r in requests
        if r.method == "POST"
    ]
    assert auth and set(auth) == {API_KEY}
