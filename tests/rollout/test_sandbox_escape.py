"""A malicious runtime, run by the real launcher (real gateway, fake upstream as the model), tries to
read what a session must never see and to reach the network. In the sandbox it gets nothing and its
gateway calls still work; with ``--sandbox none`` the same probes succeed (so they can fail), and
the table and records say so."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
from pathlib import Path

import yaml

from tests.fake_upstream import DEFAULT_TEXT, FakeUpstream
from tests.rollout.sandbox_helpers import require_bwrap
from tests.test_launcher import gateway_config, launch

REPO = Path(__file__).resolve().parents[2]
ANSWER = "HIDDEN-ANSWER-7f3a"
EXPECTED = "EXPECTED-SECRET-9c1d"
SECRET = "LAUNCHER-SECRET-52be"

PROBE = r"""
import glob, json, os, socket, sys
from pathlib import Path

req = json.loads(sys.stdin.read())
row = req["env_params"]["dataset"]
env_dir = Path(req["metadata"]["env_dir"])
found = {}

def read(path):
    try:
        return Path(path).read_text()[:200]
    except OSError as e:
        return type(e).__name__

found["row_keys"] = sorted(row)
found["other_env_expected"] = read(env_dir.parent / "victim" / "tasks" / "t1" / "expected.json")
found["repo_task_expected"] = read(row["repo_task"])
found["own_dataset"] = read(env_dir / "data" / "cases.jsonl")
found["db"] = read(row["db"])
found["secret_in_environ"] = [k for k, v in os.environ.items() if row["secret_value"] in v]
found["proc1_environ"] = read("/proc/1/environ").split("\0")
found["secret_in_any_proc"] = []
for f in glob.glob("/proc/[0-9]*/environ"):
    if row["secret_value"] in read(f):
        found["secret_in_any_proc"].append(f)
# the host path of this workspace (from the mount table), then its siblings: other sessions' workspaces
src = [line.split()[3] for line in open("/proc/self/mountinfo") if line.split()[4] == os.getcwd()]
found["workspace_parent"] = sorted(os.listdir(Path(src[0]).parent)) if src and Path(src[0]).parent.exists() \
    else "FileNotFoundError"
found["tmp_rollout"] = glob.glob("/tmp/rollout-*")
# any reachable file holding the hidden answer or the expected answer (system and interpreter folders skipped)
Path("control.txt").write_text(row["expected_marker"])  # a positive control: the walk must find this one
hits = []
skip = ("/proc", "/sys", "/dev", "/usr", "/root/.pyenv", sys.prefix, sys.base_prefix)
for top, dirs, files in os.walk("/") if os.getcwd() == "/workspace" else ():  # not the whole host unsandboxed
    if top.startswith(skip) and top != "/":
        dirs[:] = []
        continue
    for name in files:
        p = os.path.join(top, name)
        try:
            if os.path.getsize(p) < 2_000_000:
                data = open(p, "rb").read()
                if row["answer_marker"].encode() in data or row["expected_marker"].encode() in data:
                    hits.append(p)
        except OSError:
            pass
found["marker_hits"] = hits
try:
    (env_dir / "runtime.py").write_text("overwritten")
    found["write_code"] = "written"
except OSError as e:
    found["write_code"] = type(e).__name__
found["interfaces"] = [name for _, name in socket.if_nameindex()]
s = socket.socket()
s.settimeout(10)
try:
    s.connect(("127.0.0.1", row["host_port"]))
    found["host_loopback"] = "connected"
except OSError as e:
    found["host_loopback"] = type(e).__name__
finally:
    s.close()
found["uid"] = os.getuid()
# a sysctl, written back unchanged: the kernel lets the host's root write it by file mode alone
try:
    pattern = open("/proc/sys/kernel/core_pattern").read()
    with open("/proc/sys/kernel/core_pattern", "w") as f:
        f.write(pattern)
    found["sysctl"] = "written"
except OSError as e:
    found["sysctl"] = type(e).__name__

import openai
client = openai.OpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"], max_retries=0)
found["gateway_answer"] = client.chat.completions.create(
    model=req["model"], messages=[{"role": "user", "content": "hi"}]).choices[0].message.content
found["gateway_url"] = req["gateway_base_url"]
stream = client.chat.completions.create(model=req["model"], messages=[{"role": "user", "content": "hi"}], stream=True)
found["streamed"] = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
import http.client, urllib.parse
base = urllib.parse.urlsplit(req["gateway_base_url"])
def post(path):
    c = http.client.HTTPConnection(base.hostname, base.port, timeout=30)
    c.request("POST", path, body=json.dumps({"model": req["model"], "messages": [{"role": "user", "content": "x"}]}),
              headers={"content-type": "application/json"})
    r = c.getresponse()
    body = r.read()
    c.close()
    return r.status
found["sessionless_call"] = post("/v1/chat/completions")
found["other_session_call"] = post("/v1/sessions/someone-else/chat/completions")
found["close_own_session"] = post(base.path + "/close")
print(json.dumps({"session_id": req["session_id"], "status": "succeeded", "metrics": found}))
"""


def _envs(root: Path, db: Path, port: int) -> Path:
    evil = root / "evil"
    (evil / "data").mkdir(parents=True)
    (evil / "runtime.py").write_text(PROBE)
    repo_task = sorted((REPO / "env" / "workspace" / "tasks").glob("*/expected.json"))[0]
    row = {
        "id": "attack",
        "answer": ANSWER,
        "repo_task": str(repo_task),
        "db": str(db),
        "secret_value": SECRET,
        "answer_marker": ANSWER,
        "expected_marker": EXPECTED,
        "host_port": port,
    }
    (evil / "data" / "cases.jsonl").write_text(json.dumps(row) + "\n")
    (evil / "env.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "evil",
                "dataset": {"path": "data/cases.jsonl", "id_field": "id", "hidden_fields": ["answer"]},
                "runtime": {"command": ["{python}", "{env_dir}/runtime.py"], "timeout_s": 120},
            }
        )
    )
    task = root / "victim" / "tasks" / "t1"
    task.mkdir(parents=True)
    (task / "instruction.md").write_text("do it")
    (task / "expected.json").write_text(json.dumps({"answer": EXPECTED}))
    (root / "victim" / "env.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "victim",
                "dataset": {"format": "task_dirs", "path": "tasks"},
                "runtime": {"command": ["{python}", "-c", "pass"]},
            }
        )
    )
    return repo_task


async def _attack(tmp_path: Path, *extra: str) -> tuple[dict, dict, str, int, list[str]]:  # type: ignore[type-arg]
    connections: list[int] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    db, out = tmp_path / "trajs.db", tmp_path / "out.jsonl"
    _envs(tmp_path / "envs", db, port)
    try:
        async with FakeUpstream() as up:
            cfg = gateway_config(tmp_path / "gw.yaml", up.base_url, db)
            code, stdout, stderr = await launch(
                "--agent-root",
                str(tmp_path / "envs"),
                "--env",
                "evil",
                "--gateway-config",
                str(cfg),
                "--llm-model",
                "fake",
                "--db-path",
                f"sqlite://{db}",
                "--job-id",
                "attack",
                "--out",
                str(out),
                *extra,
                cwd=tmp_path,
                env={**os.environ, "ROLLOUT_TEST_SECRET": SECRET},
            )
            upstream = [r.path for r in up.requests]
    finally:
        server.close()
        await server.wait_closed()
    assert code == 0, stderr
    record = json.loads(out.read_text())
    con = sqlite3.connect(db)
    try:
        (result,) = con.execute("SELECT result FROM job_environments WHERE job_id = 'attack'").fetchone()
    finally:
        con.close()
    return json.loads(result)["metrics"], record, stdout + stderr, len(connections), upstream


async def test_malicious_runtime_gets_nothing_in_the_sandbox(tmp_path: Path) -> None:
    require_bwrap()
    found, record, output, host_connections, upstream = await _attack(tmp_path)
    assert record["sandbox"] == "bwrap" and record["status"] == "succeeded"
    assert found["row_keys"] == [
        "answer_marker",
        "db",
        "expected_marker",
        "host_port",
        "id",
        "repo_task",
        "secret_value",
    ]  # the hidden field was never sent
    assert found["other_env_expected"] == "FileNotFoundError"
    assert found["repo_task_expected"] == "FileNotFoundError"
    assert found["own_dataset"] == "FileNotFoundError"
    assert found["db"] == "FileNotFoundError"
    assert found["secret_in_environ"] == [] and found["secret_in_any_proc"] == []
    proc1 = {kv.split("=", 1)[0] for kv in found["proc1_environ"] if kv}
    assert proc1 <= {
        "PATH",
        "LANG",
        "LANGUAGE",
        "TERM",
        "TZ",
        "HOME",
        "TMPDIR",
        "PYTHONUNBUFFERED",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONPATH",
        "OPENAI_BASE_URL",
        "OPENAI_API_KEY",
        "ANTHROPIC_BASE_URL",
        "ANTHROPIC_API_KEY",
        "GATEWAY_BASE_URL",
        "GATEWAY_API_KEY",
        "ROLLOUT_LOG_LEVEL",
        "NO_COLOR",
        "COLUMNS",
    } | {k for k in proc1 if k.startswith("LC_")}
    assert found["workspace_parent"] == "FileNotFoundError" and found["tmp_rollout"] == []
    assert found["marker_hits"] == ["/workspace/control.txt"]
    assert found["write_code"] == "OSError"  # read-only file system
    assert found["interfaces"] == ["lo"]
    assert found["host_loopback"] == "ConnectionRefusedError" and host_connections == 0
    assert found["uid"] == 65534
    assert found["sysctl"] == "OSError"  # read-only file system, even when the launcher runs as root
    # the gateway is reachable through the bridge, and the call was recorded for this session
    assert found["gateway_answer"] == DEFAULT_TEXT
    assert found["gateway_url"] == f"http://127.0.0.1:41800/v1/sessions/{record['session_id']}"
    assert found["streamed"] == DEFAULT_TEXT  # a streamed answer through the bridge too
    assert record["step_count"] == 2 and record["trajectory"][0]["content"] == DEFAULT_TEXT
    # only its own session is reachable: no sessionless (unrecorded) call, no other session, no close
    assert (found["sessionless_call"], found["other_session_call"], found["close_own_session"]) == (
        403,
        403,
        403,
    )
    assert len([r for r in upstream if r.endswith("/chat/completions")]) == 2
    assert "WITHOUT a sandbox" not in output


async def test_without_the_sandbox_the_same_probes_succeed_and_it_is_reported(tmp_path: Path) -> None:
    found, record, output, host_connections, _ = await _attack(tmp_path, "--sandbox", "none")
    assert record["sandbox"] == "none"
    assert EXPECTED in found["other_env_expected"]
    assert ANSWER in found["own_dataset"]
    assert found["secret_in_environ"] == ["ROLLOUT_TEST_SECRET"]
    assert found["host_loopback"] == "connected" and host_connections == 1
    assert found["gateway_answer"] == DEFAULT_TEXT
    assert found["sessionless_call"] == 200  # unsandboxed, the model can be used off the record
    assert (
        "warning: 1 session ran WITHOUT a sandbox (--sandbox none or the env's runtime.sandbox: none): "
        "evil (1)." in output
    )
