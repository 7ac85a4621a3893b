"""One launcher per job, through the CLI: while a launcher runs a job, a second one on it (``--resume``
included) is refused with one line naming the first and changes nothing; once the first is killed
(SIGKILL: no cleanup), ``--resume`` takes the job over and finishes it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from pathlib import Path

import pytest
import yaml

from tests.fake_upstream import FakeUpstream
from tests.test_launcher import REPO, gateway_config, launch, rows

RUNTIME = """
import pathlib, time
from env.runtime_kit import chat_completion, openai_client, run_runtime
from rollout.contract.protocol import SimulationStartResult

HOLD = pathlib.Path(__file__).parent / "hold"

def main(req):
    while HOLD.exists():
        time.sleep(0.05)
    client = openai_client(req, max_retries=0)
    chat_completion(client, model=req.model, messages=[{"role": "user", "content": "hi"}])
    return SimulationStartResult(session_id=req.session_id, status="succeeded", step_count=1)

run_runtime(main)
"""


def held_env(root: Path) -> Path:
    env_dir = root / "held"
    (env_dir / "data").mkdir(parents=True)
    (env_dir / "runtime.py").write_text(RUNTIME)
    (env_dir / "data" / "cases.jsonl").write_text(json.dumps({"id": "a"}) + "\n")
    (env_dir / "env.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "held",
                "dataset": {"format": "jsonl", "path": "data/cases.jsonl", "id_field": "id"},
                "runtime": {"command": ["{python}", "{env_dir}/runtime.py"], "timeout_s": 120},
                "max_steps": 3,
            }
        )
    )
    (env_dir / "hold").touch()
    return env_dir


async def test_a_second_launcher_on_a_running_job_is_refused_and_a_killed_ones_job_is_taken_over(
    tmp_path: Path,
) -> None:
    env_root = tmp_path / "envs"
    env_dir = held_env(env_root)
    db = tmp_path / "trajs.db"
    async with FakeUpstream() as up:
        cfg = gateway_config(tmp_path / "gw.yaml", up.base_url, db)
        common = [
            "--agent-root",
            str(env_root),
            "--gateway-config",
            str(cfg),
            "--llm-model",
            "fake",
            "--db-path",
            f"sqlite://{db}",
            "--job-id",
            "jl",
        ]
        first = await asyncio.create_subprocess_exec(
            sys.executable,
            str(REPO / "launcher.py"),
            *common,
            "--no-progress",
            cwd=str(tmp_path),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        try:
            for _ in range(1200):  # its session is running (held by the runtime)
                await asyncio.sleep(0.1)
                try:
                    if rows(db, "SELECT status FROM job_environments") == [("running",)]:
                        break
                except Exception:  # the tables are not made yet
                    continue
            else:
                first.kill()
                _, first_err = await first.communicate()
                pytest.fail(f"the first launcher's session never started: {first_err.decode()[-2000:]}")
            for extra in (["--resume"], []):
                code, _, err = await launch(*common, *extra, "--out", str(tmp_path / "2.jsonl"), cwd=tmp_path)
                assert code == 1, err
                assert (
                    f"error: job jl is running in another launcher (pid {first.pid} on host "
                    f"{socket.gethostname()}, started "
                ) in err
            assert rows(db, "SELECT status, attempts FROM job_environments") == [("running", 1)]
            assert rows(db, "SELECT count(*) FROM session_attempts") == [(0,)]
            assert up.requests == []
            first.send_signal(signal.SIGKILL)  # no cleanup: its lock row stays
            await asyncio.wait_for(first.wait(), 30)  # reaped, as its shell would
        finally:
            if first.returncode is None:
                first.kill()
                await first.wait()
        assert rows(db, "SELECT pid FROM job_locks") == [(first.pid,)]
        (env_dir / "hold").unlink()
        code, _, err = await launch(*common, "--resume", "--out", str(tmp_path / "3.jsonl"), cwd=tmp_path)
        assert code == 0, err
    assert rows(db, "SELECT status, finished FROM job_environments") == [("succeeded", 1)]
    assert rows(db, "SELECT count(*) FROM job_locks") == [(0,)]  # released at the end
    assert len(up.requests) == 1
