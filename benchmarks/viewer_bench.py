"""How fast the viewer's pages are on a 100,000-session job, without and with its indexes.

    python benchmarks/viewer_bench.py [--sessions 100000] [--steps 3] [--repeat 3] [--quick] [--json PATH]

Builds a temporary SQLite store (the launcher's schema from ``Store.init``) holding one job of
``--sessions`` finished sessions (2 envs, 4 samples per case, scores 0..10, some evaluator
errors) with ``--steps`` recorded steps each, then requests each page through the viewer app
(``httpx`` on the ASGI app: routing, SQL and template rendering, no network) ``--repeat`` times
with a new app before and after ``ViewerQueries.ensure_indexes``, and prints the first request's
time (nothing cached) of each, their ratio, and the best of the later requests. Pages: the job list, the job page (summary table, lowest scores, failure reasons), the
first, a filtered, a score-sorted and the last page of the session list, a session (its previous /
next in the job's order), a session opened from a filtered, score-sorted list, the job's groups, a group.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
import tempfile
from pathlib import Path

import _bench
import httpx

from rollout.servers.viewer.app import create_app
from rollout.servers.viewer.db import open_queries
from rollout.servers.viewer.stats import HiddenFields
from store import Store


def build(db: Path, sessions: int, steps: int) -> None:
    con = sqlite3.connect(db)
    now = "2026-01-01 00:00:00.000000"
    rows = []
    for i in range(sessions):
        ev = "error" if i % 97 == 0 else "scored"
        rows.append(
            (
                f"s{i:07d}",
                "big",
                ("gsm8k", "workspace")[i % 2],
                f"c{i // 8}",
                "m",
                f"g{i // 8}",
                i % 4,
                json.dumps({"dataset": {"q": f"question {i}", "answer": str(i)}}),
                4,
                "succeeded",
                1,
                None if ev == "error" else float(i % 11),
                ev,
                "boom" if ev == "error" else f"expected {i}, got 0",
                None,
                None,
                None,
                1.5 + i % 7,
                1,
                now,
                now,
                now,
            )
        )
    con.executemany(
        "INSERT INTO job_environments (env_id, job_id, env_name, case_id, llm_model, group_id, "
        "sample_index, env_params, max_steps, status, attempts, reward, eval_status, eval_reason, "
        "eval_detail, result, error_text, duration_s, finished, created_at, started_at, finished_at) "
        "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        rows,
    )
    msg = json.dumps([{"role": "user", "content": "question"}])
    resp = json.dumps(
        {"choices": [{"message": {"role": "assistant", "content": "0"}, "finish_reason": "stop"}]}
    )
    step_rows = [
        (
            f"r{i}-{k}",
            f"s{i:07d}",
            k,
            k,
            ("gsm8k", "workspace")[i % 2],
            "m",
            f"g{i // 8}",
            "big",
            "chat.completions",
            0,
            "ok",
            200,
            msg,
            "{}",
            resp,
            "stop",
            50,
            5,
            55,
            12.0,
            None,
            k == steps,
            0,
            k == steps,
            1,
            now,
        )
        for i in range(sessions)
        for k in range(1, steps + 1)
    ]
    con.executemany(
        "INSERT INTO session_steps (record_id, session_id, seq, step_id, env_name, llm_model, group_id, "
        "job_id, endpoint, is_stream, status, status_code, messages, request, response, finish_reason, "
        "prompt_tokens, completion_tokens, total_tokens, latency_ms, ttft_ms, is_terminal, "
        "is_truncated, is_session_completed, is_trainable, created_at) "
        "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        step_rows,
    )
    con.commit()
    con.close()


PAGES = {
    "job list": "/",
    "job page": "/jobs/big",
    "sessions p1": "/jobs/big/sessions",
    "filtered": "/jobs/big/sessions?env=workspace&eval=error",
    "by score": "/jobs/big/sessions?sort=score",
    "last page": None,  # set from the session count
    "session": "/sessions/s0000042",
    "session in a list": "/sessions/s0000042?sort=score&env=workspace",
    "groups": "/jobs/big/groups",
    "group": "/groups/g5",
}


async def time_pages(db: Path, repeat: int) -> dict[str, tuple[float, float]]:
    engine, queries = await open_queries(f"sqlite://{db}")
    app = create_app(queries, HiddenFields(Path("env")))
    out: dict[str, tuple[float, float]] = {}
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://v") as client:
            for name, path in PAGES.items():
                times = []
                for _ in range(repeat):
                    with _bench.timed() as t:
                        r = await client.get(str(path))
                    times.append(t.wall_s)
                    if r.status_code != 200:
                        raise SystemExit(f"{path}: HTTP {r.status_code}")
                out[name] = (times[0] * 1000, min(times[1:] or times) * 1000)
    finally:
        await engine.dispose()
    return out


async def main() -> int:
    ap = _bench.parser(__doc__, quick={"sessions": 2000, "repeat": 2})
    ap.add_argument("--sessions", type=int, default=100_000)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    report = _bench.Report("viewer_bench", args)
    PAGES["last page"] = f"/jobs/big/sessions?page={(args.sessions + 49) // 50}"
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.db"
        store = Store(f"sqlite://{db}")
        await store.init()
        await store.close()
        with _bench.timed() as built:
            build(db, args.sessions, args.steps)
        report.line(f"built {args.sessions} sessions x {args.steps} steps in {built.wall_s:.1f} s")
        before = await time_pages(db, args.repeat)
        engine, queries = await open_queries(f"sqlite://{db}")
        with _bench.timed() as indexing:
            made = await queries.ensure_indexes()
        await engine.dispose()
        after = await time_pages(db, args.repeat)
    report.line(f"indexes {', '.join(made)} built in {indexing.wall_s:.2f} s")
    table = _bench.Table(
        f"viewer pages, {args.sessions} sessions x {args.steps} steps (ms; first: the first "
        "request, the job's summary not cached yet; again: best of the others)",
        [
            "page",
            ("no index, first", ".1f"),
            ("indexed, first", ".1f"),
            ("ratio", ".2f"),
            ("indexed, again", ".1f"),
        ],
    )
    for name in PAGES:
        b, a = before[name][0], after[name][0]
        table.add(name, b, a, _bench.ratio(b, a), after[name][1])
    report.table(table)
    report.finish()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
