"""``--mode ray`` on a real Ray cluster started here: a head node without CPUs (so every session
runs on a worker node) and a worker node, the real launcher CLI and gateway, the fake upstream as
the model, bubblewrap sandboxes on the node. Includes killing the worker node's raylet while a
session runs on it: that attempt is a ``node_lost`` infrastructure failure, retried on the node
that replaces it, and the job finishes."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from rollout.core.envs import EnvConfigError, load_env_config
from rollout.jobs.options import JobOptions
from tests.fake_upstream import DEFAULT_TEXT, FakeUpstream, Reply, chat_completion
from tests.rollout.ray_cluster import RayCluster, ray_installed
from tests.rollout.sandbox_helpers import require_bwrap
from tests.test_launcher import gateway_config

LAUNCH_TIMEOUT_S = 900  # generous: a 2-core machine shared with other test runs


async def launch(*args: str, cwd: Path) -> tuple[int, str, str]:
    """Run launcher.py with ``args`` (plus ``--no-progress``) with this tree on PYTHONPATH."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(REPO / "launcher.py"),
        *args,
        "--no-progress",
        cwd=str(cwd),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=LAUNCH_TIMEOUT_S)
    except BaseException:
        proc.kill()
        await proc.wait()
        raise
    return proc.returncode or 0, out.decode(), err.decode()


REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayCluster]:
    ray_installed()
    c = RayCluster().start()
    try:
        c.add_worker(num_cpus=2)
        yield c
    finally:
        c.stop()


def q(db: Path, sql: str) -> list[tuple[Any, ...]]:
    con = sqlite3.connect(db)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def victim_steps(db: Path) -> int:
    """Steps recorded for the victim case so far (0 before the store has its tables)."""
    try:
        [(n,)] = q(
            db,
            "SELECT count(*) FROM session_steps s JOIN job_environments j "
            "ON s.session_id = j.env_id WHERE j.case_id = 'victim'",
        )
    except sqlite3.OperationalError as e:
        assert "no such table" in str(e)
        return 0
    return int(n)


def records(out: Path) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["env_name"], r["case_id"]): r for r in map(json.loads, out.read_text().splitlines())}


KEYS = ("status", "outcome", "score", "eval_status", "reason", "error", "step_count", "sandbox", "group_id")


async def test_bundled_envs_give_the_same_rows_on_ray_as_local(
    tmp_path: Path, ray_cluster: RayCluster
) -> None:
    require_bwrap()
    db = tmp_path / "trajs.db"
    common = [
        "--agent-root",
        str(REPO / "env"),
        "--llm-model",
        "fake",
        "--db-path",
        f"sqlite://{db}",
        "--enable-evaluation",
        "--limit",
        "2",
        "--pool-size",
        "3",
        "--env",
        "gsm8k",
        "--env",
        "workspace",
    ]
    async with FakeUpstream() as up:
        cfg = gateway_config(tmp_path / "gw.yaml", up.base_url, db)
        code, _, err = await launch(
            *common,
            "--gateway-config",
            str(cfg),
            "--job-id",
            "loc",
            "--out",
            str(tmp_path / "loc.jsonl"),
            cwd=tmp_path,
        )
        assert code == 0, err
        code, _, err = await launch(
            *common,
            "--gateway-config",
            str(cfg),
            "--job-id",
            "ray",
            "--mode",
            "ray",
            "--ray-address",
            ray_cluster.address,
            "--out",
            str(tmp_path / "ray.jsonl"),
            cwd=tmp_path,
        )
    assert code == 0, err
    assert "ray: 2 node(s) at" in err
    local, ray = records(tmp_path / "loc.jsonl"), records(tmp_path / "ray.jsonl")
    assert sorted(local) == sorted(ray) and len(ray) == 4  # 2 gsm8k cases, 2 workspace tasks
    for key, rec in ray.items():
        want = {k: local[key][k] for k in KEYS if k != "group_id"}
        assert {k: rec[k] for k in KEYS if k != "group_id"} == want, key
        assert rec["trajectory"][0]["content"] == DEFAULT_TEXT and len(rec["attempts"]) == 1
    assert {r["status"] for (env, _), r in ray.items() if env == "gsm8k"} == {"succeeded"}
    assert {r["error"] for (env, _), r in ray.items() if env == "workspace"} == {
        "outputs/answer.json is missing"
    }
    # the same table rows in the store: one per session, finished, graded, one attempt each
    sql = (
        "SELECT env_name, case_id, status, reward, eval_status, attempts, finished FROM job_environments "
        "WHERE job_id = '{}' ORDER BY env_name, case_id"
    )
    assert q(db, sql.format("ray")) == q(db, sql.format("loc"))
    assert q(db, "SELECT count(*), sum(infra) FROM session_attempts WHERE job_id = 'ray'") == [(4, 0)]


async def test_the_workspace_travels_to_the_node_and_back_for_the_grader(
    tmp_path: Path, ray_cluster: RayCluster
) -> None:
    """The agent's tool reads a task file (sent to the node with the workspace) and writes the
    answer there; the grader on the launcher's host reads it from the workspace brought back."""
    require_bwrap()
    task = REPO / "env" / "workspace" / "tasks" / "csv_sales_by_region"
    answer = json.dumps(json.loads((task / "expected.json").read_text()))
    command = f"test -s sales.csv && mkdir -p outputs && printf '%s' '{answer}' > outputs/answer.json"
    tool_call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "bash", "arguments": json.dumps({"command": command})},
    }
    db, out = tmp_path / "trajs.db", tmp_path / "out.jsonl"
    async with FakeUpstream() as up:
        up.script(
            "/v1/chat/completions",
            [
                Reply.json(chat_completion(None, tool_calls=[tool_call], finish_reason="tool_calls")),
                Reply.json(chat_completion("done")),
            ],
        )
        cfg = gateway_config(tmp_path / "gw.yaml", up.base_url, db)
        code, _, err = await launch(
            "--agent-root",
            str(REPO / "env"),
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
            "tools",
            "--out",
            str(out),
            "--mode",
            "ray",
            "--ray-address",
            ray_cluster.address,
            cwd=tmp_path,
        )
    assert code == 0, err
    (r,) = records(out).values()
    assert r["case_id"] == "csv_sales_by_region"
    assert (r["status"], r["eval_status"], r["score"], r["step_count"], r["sandbox"]) == (
        "succeeded",
        "scored",
        10.0,
        2,
        "bwrap",
    )
    # the final workspace is also what a regrade gets
    [(status, files)] = q(db, "SELECT status, file_count FROM session_workspaces")
    assert status == "kept" and files >= 2  # sales.csv and outputs/answer.json


VICTIM_RUNTIME = """
import time
from env.runtime_kit import chat_completion, openai_client, run_runtime
from rollout.contract.protocol import SimulationStartResult

def main(req):
    client = openai_client(req, max_retries=0)
    completion, text = chat_completion(client, model=req.model, messages=[{"role": "user", "content": "hi"}])
    if req.env_params["dataset"].get("hang") and req.metadata["attempt"] == 1:
        time.sleep(3600)  # until its node dies
    return SimulationStartResult(session_id=req.session_id, status="succeeded", metrics={"text": text})

run_runtime(main)
"""

EVALUATOR = """
def evaluate(request, spec, trajectory):
    return 10 if trajectory.final_response == "hello from fake" else 1
"""


def make_env(root: Path, cases: list[dict[str, Any]], resources: dict[str, Any] | None = None) -> Path:
    env_dir = root / "nodes"
    (env_dir / "data").mkdir(parents=True, exist_ok=True)
    (env_dir / "runtime.py").write_text(VICTIM_RUNTIME)
    (env_dir / "rule_evaluator.py").write_text(EVALUATOR)
    (env_dir / "data" / "cases.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cases))
    runtime: dict[str, Any] = {"command": ["{python}", "{env_dir}/runtime.py"], "timeout_s": 600}
    if resources is not None:
        runtime["resources"] = resources
    (env_dir / "env.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "nodes",
                "dataset": {"format": "jsonl", "path": "data/cases.jsonl", "id_field": "id"},
                "runtime": runtime,
                "max_steps": 4,
            }
        )
    )
    return env_dir


async def test_a_node_that_dies_mid_session_is_an_infra_failure_retried_elsewhere(
    tmp_path: Path, ray_cluster: RayCluster
) -> None:
    require_bwrap()
    make_env(
        tmp_path / "envs",
        [{"id": "victim", "hang": True}, *({"id": f"ok{i}"} for i in range(3))],
        resources={"num_cpus": 1, "memory_mb": 64},
    )
    db, out = tmp_path / "trajs.db", tmp_path / "out.jsonl"
    worker = ray_cluster.nodes[-1]
    async with FakeUpstream() as up:
        cfg = gateway_config(tmp_path / "gw.yaml", up.base_url, db)
        job = asyncio.create_task(
            launch(
                "--agent-root",
                str(tmp_path / "envs"),
                "--gateway-config",
                str(cfg),
                "--llm-model",
                "fake",
                "--db-path",
                f"sqlite://{db}",
                "--enable-evaluation",
                "--job-id",
                "kill",
                "--out",
                str(out),
                "--pool-size",
                "2",
                "--retry-backoff-s",
                "0.1",
                "--mode",
                "ray",
                "--ray-address",
                ray_cluster.address,
                cwd=tmp_path,
            )
        )
        # the victim's runtime has made its model call and now waits on the worker node
        for _ in range(1200):
            if victim_steps(db) == 1:
                break
            assert not job.done(), job.result()
            await asyncio.sleep(0.25)
        else:
            raise AssertionError("the victim session never made its model call")
        worker.kill_raylet()
        await asyncio.to_thread(ray_cluster.add_worker, 2)  # the node that replaces it
        code, _, err = await job
    assert code == 0, err
    recs = records(out)
    assert len(recs) == 4
    victim = recs[("nodes", "victim")]
    first, last = victim["attempts"][0], victim["attempts"][-1]
    assert (first["outcome"], first["infra"]) == ("node_lost", True)
    assert "Ray node" in first["reason"]
    assert (last["outcome"], last["infra"]) == ("succeeded", False)
    assert (victim["status"], victim["score"], victim["retried"]) == ("succeeded", 10.0, True)
    for key, r in recs.items():  # every session finished and graded; none lost
        assert (r["status"], r["eval_status"], r["score"]) == ("succeeded", "scored", 10.0), key
        assert all(a["outcome"] in ("node_lost", "succeeded") for a in r["attempts"]), key
    # the lost attempt's step is kept apart (not trainable); the trajectory is the last attempt's
    sid = victim["session_id"]
    assert q(db, f"SELECT count(*), sum(is_trainable) FROM session_steps WHERE session_id = '{sid}~a1'") == [
        (1, 0)
    ]
    assert q(db, f"SELECT count(*), sum(is_trainable) FROM session_steps WHERE session_id = '{sid}'") == [
        (1, 1)
    ]
    assert q(db, "SELECT count(*) FROM job_environments WHERE job_id = 'kill' AND finished = 1") == [(4,)]


async def test_setup_refuses_what_the_cluster_cannot_run(tmp_path: Path, ray_cluster: RayCluster) -> None:
    require_bwrap()
    db = tmp_path / "trajs.db"
    async with FakeUpstream() as up:
        cfg = gateway_config(tmp_path / "gw.yaml", up.base_url, db)
        base = [
            "--agent-root",
            str(tmp_path / "envs"),
            "--gateway-config",
            str(cfg),
            "--llm-model",
            "fake",
            "--db-path",
            f"sqlite://{db}",
            "--mode",
            "ray",
            "--ray-address",
            ray_cluster.address,
        ]
        make_env(tmp_path / "envs", [{"id": "a"}], resources={"num_cpus": 64})
        code, _, err = await launch(*base, "--job-id", "big", cwd=tmp_path)
        assert code == 1, err
        assert "env nodes asks each session for 64 CPU(s)" in err and "runtime.resources" in err
        make_env(tmp_path / "envs", [{"id": "a"}], resources={"num_cpus": 1})
        # nodes cannot resolve the advertised gateway host: refused before any session runs
        code, _, err = await launch(
            *base,
            "--job-id",
            "far",
            "--gateway-advertise-url",
            "http://gateway.invalid:18080/v1/sessions",
            cwd=tmp_path,
        )
        assert code == 1, err
        assert "the gateway at http://gateway.invalid:18080/healthz cannot be reached" in err
        assert err.count("node ") >= 2  # every node was asked
    assert len(up.requests) == 0
    assert q(db, "SELECT count(*) FROM session_attempts") == [(0,)]


def test_a_ray_address_where_nothing_listens_is_a_clear_error() -> None:
    ray_installed()
    from rollout.jobs.processes import free_port
    from rollout.jobs.ray_backend import RayBackendError, connect

    address = f"127.0.0.1:{free_port()}"
    with pytest.raises(
        RayBackendError, match=f"cannot connect to the Ray cluster at '{address}'.*ray start --head"
    ):
        connect(address)


def test_ray_options_and_resources_are_checked() -> None:
    with pytest.raises(ValueError, match="--ray-address is only used with --mode ray"):
        JobOptions.model_validate({"gateway_config": "g.yaml", "ray_address": "auto"})
    with pytest.raises(ValueError, match="--gateway-advertise-url must be"):
        JobOptions.model_validate({"gateway_config": "g.yaml", "gateway_advertise_url": "gw:8000"})
    assert (
        JobOptions.model_validate({"gateway_config": "g.yaml", "mode": "ray", "ray_address": "auto"}).mode
        == "ray"
    )


def test_env_resources_are_strict(tmp_path: Path) -> None:
    env_dir = make_env(tmp_path, [{"id": "a"}], resources={"num_cpus": 0.5, "memory_mb": 256})
    r = load_env_config(env_dir / "env.yaml").runtime.resources
    assert (r.num_cpus, r.memory_mb) == (0.5, 256)
    make_env(tmp_path, [{"id": "a"}], resources={"cpus": 2})
    with pytest.raises(EnvConfigError, match="cpus"):
        load_env_config(env_dir / "env.yaml")
    make_env(tmp_path, [{"id": "a"}], resources={"num_cpus": -1})
    with pytest.raises(EnvConfigError, match="num_cpus"):
        load_env_config(env_dir / "env.yaml")


async def test_a_job_on_an_unreachable_ray_cluster_writes_no_row(tmp_path: Path) -> None:
    """The cluster is connected to before planning: a failed start leaves no job behind to block
    its id or to become the store's latest job."""
    ray_installed()
    from rollout.core.setup import SetupError
    from rollout.jobs.processes import free_port
    from rollout.jobs.run import run_job
    from tests.rollout.test_attempts import make_env

    make_env(tmp_path / "envs", [{"id": "c1", "q": "hi"}])
    db = tmp_path / "t.db"
    (tmp_path / "gw.yaml").write_text(
        yaml.safe_dump({"llm_routes": {"fake": {"base_url": "http://127.0.0.1:9/v1"}}})
    )
    opts = JobOptions.model_validate(
        {
            "agent_root": tmp_path / "envs",
            "gateway_config": tmp_path / "gw.yaml",
            "llm_model": "fake",
            "db_path": f"sqlite://{db}",
            "mode": "ray",
            "ray_address": f"127.0.0.1:{free_port()}",
            "job_id": "r1",
        }
    )
    with pytest.raises(SetupError, match="cannot connect to the Ray cluster"):
        await run_job(opts)
    assert q(db, "SELECT count(*) FROM job_environments") == [(0,)]
