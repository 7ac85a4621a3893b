"""A gateway outage during a job: what becomes of the sessions, with and without retries.

``python benchmarks/outage_bench.py [--sessions 200] [--pool 16] [--outage-s 3] [--quick] [--json PATH]``

Runs the same job twice in one run, each against a gateway subprocess (the project's fake upstream
as the model) that is SIGKILLed once a fifth of the sessions finished and restarted on the same
port and database ``--outage-s`` seconds later:

- ``no_retries``: ``max_retries 0`` and no sliding-window opening (a gateway probe that fails
  after a gateway failure still holds new sessions);
- ``defaults``: the default retry policy and breaker.

Prints per run: sessions succeeded, sessions never recovered (reward NULL), attempts that failed on
infrastructure, attempts started while the gateway was down, breaker opens, and scored sessions
whose outcome was an infrastructure failure (must be 0).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import _bench
import yaml

from rollout.jobs.options import JobOptions
from rollout.jobs.processes import free_port
from rollout.jobs.run import run_job
from tests.fake_upstream import FakeUpstream

REPO = Path(__file__).resolve().parents[1]
RUNTIME = """
import time
from env.runtime_kit import chat_completion, openai_client, run_runtime
from rollout.contract.protocol import SimulationStartResult

def main(req):
    client = openai_client(req, max_retries=0)
    for _ in range(2):
        completion, _ = chat_completion(client, model=req.model, messages=[{"role": "user", "content": "hi"}])
        time.sleep(0.2)
    return SimulationStartResult(session_id=req.session_id, status="succeeded")

run_runtime(main)
"""


def make_env(root: Path, n: int) -> None:
    d = root / "outage"
    (d / "data").mkdir(parents=True)
    (d / "runtime.py").write_text(RUNTIME)
    (d / "rule_evaluator.py").write_text("def evaluate(request, spec, trajectory):\n    return 10\n")
    (d / "data" / "cases.jsonl").write_text("".join(json.dumps({"id": f"c{i}"}) + "\n" for i in range(n)))
    (d / "env.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "outage",
                "dataset": {"format": "jsonl", "path": "data/cases.jsonl", "id_field": "id"},
                "runtime": {"command": ["{python}", "{env_dir}/runtime.py"], "timeout_s": 60},
                "max_steps": 4,
            }
        )
    )


def gateway(cfg: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as fh:
        return subprocess.Popen(
            [sys.executable, "-m", "gateway", "--config", str(cfg), "--port", str(port)],
            cwd=str(REPO),
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


async def wait_ready(port: int, proc: subprocess.Popen[bytes]) -> None:
    """Until the gateway answers (in a thread: the job's sessions go on meanwhile)."""
    await asyncio.to_thread(_bench.wait_http, f"http://127.0.0.1:{port}/readyz", 60, proc)


async def one_run(
    label: str, tmp: Path, up: FakeUpstream, args: argparse.Namespace, **opts: Any
) -> dict[str, Any]:
    db = tmp / f"{label}.db"
    cfg = tmp / f"{label}.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "storage_config": {"db_url": f"sqlite://{db}"},
                "llm_routes": {"fake": {"base_url": up.base_url}},
            }
        )
    )
    port = free_port()
    gw = gateway(cfg, port, tmp / f"{label}.log")
    await wait_ready(port, gw)
    done = 0
    options = JobOptions.model_validate(
        {
            "agent_root": tmp / "envs",
            "gateway_config": cfg,
            "llm_model": "fake",
            "db_path": f"sqlite://{db}",
            "enable_evaluation": True,
            "out": tmp / f"{label}.jsonl",
            "pool_size": args.pool,
            "job_id": label,
            "gateway_base_url": f"http://127.0.0.1:{port}/v1/sessions",
            **opts,
        }
    )

    def on_done(_: Any) -> None:
        nonlocal done
        done += 1

    t0 = time.monotonic()
    job = asyncio.create_task(run_job(options, on_done=on_done))
    while done < args.sessions // 5:
        await asyncio.sleep(0.01)
    os.killpg(gw.pid, signal.SIGKILL)
    gw.wait()
    killed = time.time()
    await asyncio.sleep(args.outage_s)
    back = time.time()  # the gateway is down at least until its restart begins
    gw = gateway(cfg, port, tmp / f"{label}.log")
    await wait_ready(port, gw)
    try:
        result = await job
    finally:
        os.killpg(gw.pid, signal.SIGTERM)
        gw.wait()
    con = sqlite3.connect(db)
    started_down = con.execute(
        "SELECT count(*) FROM session_attempts WHERE started_at >= ? AND started_at < ?",
        tuple(datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S.%f") for t in (killed, back)),
    ).fetchone()[0]
    con.close()
    recs = result.records
    return {
        "run": label,
        "sessions": len(recs),
        "succeeded": sum(r.status == "succeeded" for r in recs),
        "never_recovered": sum(r.eval_status == "infra_error" for r in recs),
        "infra_attempts": sum(a.infra for r in recs for a in r.attempts),
        "started_while_down": started_down,
        "breaker_opens": sum(e.state == "open" for e in result.breaker_events),
        "scored_infra": sum(
            r.eval_status == "scored" and r.outcome not in ("succeeded", "failed") for r in recs
        ),
        "wall_s": round(time.monotonic() - t0, 1),
    }


async def main() -> None:
    ap = _bench.parser(__doc__, quick={"sessions": 20, "pool": 4, "outage_s": 1.0})
    ap.add_argument("--sessions", type=int, default=200)
    ap.add_argument("--pool", type=int, default=16)
    ap.add_argument("--outage-s", type=float, default=3.0)
    args = ap.parse_args()
    report = _bench.Report("outage_bench", args)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        make_env(tmp / "envs", args.sessions)
        async with FakeUpstream() as up:
            rows = [
                await one_run(
                    "no_retries",
                    tmp,
                    up,
                    args,
                    max_retries=0,
                    breaker={"min_failures": 10**6, "window": 10**6},
                ),
                await one_run("defaults", tmp, up, args),
            ]
    table = _bench.Table(
        f"a gateway killed after a fifth of the sessions, back {args.outage_s:g} s later", [*rows[0].keys()]
    )
    for r in rows:
        table.add(*r.values())
    report.table(table)
    report.finish()


if __name__ == "__main__":
    asyncio.run(main())
