"""How fast the feed serves a 10,000-session job, and with how much memory.

    python benchmarks/feed_bench.py [--sessions 10000] [--group-size 8] [--steps 3] [--limit 50] [--quick] [--json PATH]

Builds a temporary SQLite store through the store's own write paths: ``add_job_sessions``, the
gateway's ``write_batch`` for ``--steps`` steps per session (a growing conversation; token ids and
logprobs too when the store has those columns) and ``finish_job_session`` for every session (which
appends each group's feed entry as its last session finishes: its cost per call is printed). Then
starts ``launcher.py feed`` as a subprocess (uvicorn, one process) and reads every group from
cursor 0 with ``rollout.servers.feed.client.FeedClient`` in pages of ``--limit``, once per view (``full``:
messages and tokens; ``tokens``: no messages; ``scores``: no steps), and prints groups/s,
sessions/s, MB/s of JSON, and the feed process's resident memory before and at its peak (VmHWM);
finally ``launcher.py export`` to JSONL and Parquet with their time and peak memory.
"""

from __future__ import annotations

import asyncio
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _bench

from rollout.servers.feed.client import FeedClient
from store import JobEnvironment, SessionResult, SessionStep, Store

REPO = Path(__file__).resolve().parents[1]


async def build(db: Path, sessions: int, group: int, steps: int) -> tuple[float, float]:
    """The job; returns (seconds to build, seconds per finish_job_session)."""
    t0 = time.perf_counter()
    store = Store(f"sqlite://{db}")
    await store.init()
    tokens = "prompt_token_ids" in SessionStep.__table__.c  # type: ignore[attr-defined]
    rng = random.Random(7)
    rows = [
        JobEnvironment(
            session_id=f"s{i:06d}",
            job_id="big",
            env_name=("gsm8k", "workspace")[(i // group) % 2],
            case_id=f"c{i // group}",
            llm_model="m",
            group_id=f"g{i // group:05d}",
            sample_index=i % group,
            status="running",
        )
        for i in range(sessions)
    ]
    for i in range(0, sessions, 1000):
        await store.add_job_sessions(rows[i : i + 1000])
    batch: list[SessionStep] = []
    for i in range(sessions):
        history: list[dict[str, str]] = [{"role": "system", "content": "You solve tasks with a shell. " * 4}]
        prompt: list[int] = [rng.randrange(50000) for _ in range(60)]
        for k in range(1, steps + 1):
            history.append({"role": "user" if k == 1 else "tool", "content": f"observation {k} of {i} " * 20})
            completion = [rng.randrange(50000) for _ in range(40)]
            extra: dict[str, Any] = (
                {
                    "prompt_token_ids": list(prompt),
                    "completion_token_ids": completion,
                    "completion_logprobs": [-rng.random() for _ in completion],
                }
                if tokens
                else {}
            )
            batch.append(
                SessionStep(
                    session_id=f"s{i:06d}",
                    seq=k,
                    step_id=k,
                    llm_model="m",
                    endpoint="chat.completions",
                    job_id="big",
                    messages=list(history),
                    prompt_tokens=len(prompt),
                    completion_tokens=len(completion),
                    response={
                        "choices": [
                            {
                                "message": {"role": "assistant", "content": f"run step {k} " * 10},
                                "finish_reason": "stop",
                            }
                        ]
                    },
                    **extra,
                )
            )
            history.append({"role": "assistant", "content": f"run step {k} " * 10})
            prompt = prompt + completion + [rng.randrange(50000) for _ in range(80)]
        if len(batch) >= 600:
            await store.write_batch(batch, [])
            batch = []
    if batch:
        await store.write_batch(batch, [])
    t1 = time.perf_counter()
    for i in range(sessions):
        score = float(rng.choice((0, 0, 10)))
        await store.finish_job_session(
            f"s{i:06d}",
            SessionResult(reward=score, status="succeeded", eval_status="scored" if i % 50 else "error"),
        )
    per_finish = (time.perf_counter() - t1) / sessions
    await store.checkpoint()
    await store.close()
    return time.perf_counter() - t0, per_finish


def read_all(url: str, view: str, limit: int) -> tuple[int, int, int, float]:
    """Read every group; returns (groups, sessions, JSON bytes, seconds)."""
    import httpx

    n = s = size = 0
    cursor = 0
    with httpx.Client(timeout=120) as http:
        t0 = time.perf_counter()
        while True:
            r = http.get(f"{url}/v1/jobs/big/groups", params={"after": cursor, "limit": limit, "view": view})
            r.raise_for_status()
            page = r.json()
            size += len(r.content)
            if not page["groups"]:
                break
            n += len(page["groups"])
            s += sum(len(g["samples"]) for g in page["groups"])
            cursor = page["next_cursor"]
        return n, s, size, time.perf_counter() - t0


def main() -> int:
    ap = _bench.parser(__doc__, quick={"sessions": 400})
    ap.add_argument("--sessions", type=int, default=10_000)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--limit", type=int, default=50)
    args = ap.parse_args()
    report = _bench.Report("feed_bench", args)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "feed.db"
        built_s, per_finish = asyncio.run(build(db, args.sessions, args.group_size, args.steps))
        report.value("finish_job_session_ms", per_finish * 1e3)
        report.line(
            f"store: {args.sessions} sessions x {args.steps} steps, groups of {args.group_size}; built in "
            f"{built_s:.1f} s; {db.stat().st_size / 2**20:.0f} MiB; finish_job_session with the readiness "
            f"check: {per_finish * 1e3:.2f} ms per session"
        )
        feed = subprocess.Popen(
            [sys.executable, str(REPO / "launcher.py"), "feed", "--db-path", f"sqlite://{db}", "--port", "0"],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        table = _bench.Table(
            f"reading every group from cursor 0, pages of {args.limit}",
            [
                "view",
                "groups",
                ("groups/s", ",.0f"),
                ("sessions/s", ",.0f"),
                ("MB/s", ".1f"),
                ("KB/group", ".1f"),
                ("feed RSS peak MiB", ".0f"),
            ],
        )
        try:
            assert feed.stdout is not None
            url = feed.stdout.readline().split()[2].rstrip("/")
            with FeedClient(url) as c:
                prog = c.progress("big")
            report.line(
                f"feed: {prog.groups_ready} groups ready of {prog.groups}; resident "
                f"{_bench.proc_mib(feed.pid):.0f} MiB at start"
            )
            for view in ("scores", "tokens", "full"):
                n, s, size, dt = read_all(url, view, args.limit)
                table.add(
                    view,
                    n,
                    n / dt,
                    s / dt,
                    size / dt / 1e6,
                    size / max(n, 1) / 1e3,
                    _bench.proc_mib(feed.pid, "VmHWM"),
                )
        finally:
            feed.terminate()
            feed.wait()
        report.table(table)
        exports = _bench.Table(
            "launcher.py export",
            [
                "format",
                ("sessions/s", ",.0f"),
                ("seconds", ".1f"),
                ("MiB", ".0f"),
                ("largest child peak RSS MiB", ".0f"),
            ],
        )
        for fmt in ("jsonl", "parquet"):
            out = Path(tmp) / f"export.{fmt}"
            before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
            with _bench.timed() as t:
                subprocess.run(
                    [
                        sys.executable,
                        str(REPO / "launcher.py"),
                        "export",
                        "--db-path",
                        f"sqlite://{db}",
                        "--job-id",
                        "big",
                        "--format",
                        fmt,
                        "--out",
                        str(out),
                    ],
                    check=True,
                    env=env,
                    stdout=subprocess.DEVNULL,
                )
            peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
            exports.add(
                fmt, args.sessions / t.wall_s, t.wall_s, out.stat().st_size / 2**20, max(peak, before) / 1024
            )
        report.table(exports)
    report.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
