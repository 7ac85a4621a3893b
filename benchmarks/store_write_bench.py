"""What one recorded step costs in the store, and what two cheaper ways of writing it cost.

    python benchmarks/store_write_bench.py [--steps 2000] [--quick] [--json PATH]

Writes the gateway's kind of rows into a fresh SQLite file, in batches of 1 and 64, three ways:
``Store.write_batch`` as it is, a Core ``executemany``, and plain ``sqlite3`` with one thread
hop; prints wall and CPU microseconds per step, plus the cost of building SQLModel row objects.
(``Store.commit_now``, the inline path at low load, is not measured.) Imports ``store`` only.
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import _bench
from sqlalchemy import JSON, DateTime, insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from store import GatewaySession, SessionStep, Store, json_dumps

MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant. Answer briefly."},
    {"role": "user", "content": "What is the capital of France? Reply in one short sentence, please."},
]
RESPONSE = {
    "id": "chatcmpl-bench",
    "object": "chat.completion",
    "created": 1700000000,
    "model": "fake-fast",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Paris is the capital of France."},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 12, "completion_tokens": 9, "total_tokens": 21},
}
N_SESSIONS = 64


class Rows:
    """Makes step and session rows with unique (session, model, step_id)."""

    def __init__(self) -> None:
        self.n = 0

    def step_kwargs(self) -> dict[str, Any]:
        self.n += 1
        return dict(
            session_id=f"bench-{self.n % N_SESSIONS:03d}",
            seq=self.n,
            step_id=self.n,
            llm_model="bench",
            endpoint="chat.completions",
            is_stream=False,
            status="ok",
            status_code=200,
            messages=MESSAGES,
            request={"model": "bench", "messages": MESSAGES, "temperature": 0.7},
            response=RESPONSE,
            finish_reason="stop",
            prompt_tokens=12,
            completion_tokens=9,
            total_tokens=21,
            latency_ms=1.0,
            meta_json={"route": "bench"},
        )

    def step(self) -> SessionStep:
        return SessionStep(**self.step_kwargs())

    def step_dict(self) -> dict[str, Any]:
        """A full row for Core inserts: the model's defaults filled in (record_id, created_at...)."""
        return SessionStep(**self.step_kwargs()).model_dump()

    def session(self, i: int) -> GatewaySession:
        return GatewaySession(
            session_id=f"bench-{i % N_SESSIONS:03d}", max_steps=-1, step_counts={"bench": i}, total_steps=i
        )


TABLE = _bench.Table(
    "store write cost per recorded step (1 step row + 1 session-state row per step; SQLite WAL, "
    "synchronous=NORMAL)",
    [
        "way",
        "batch",
        ("us wall/step", ".1f"),
        ("us CPU/step", ".1f"),
        ("ms per commit", ".2f"),
        ("wall vs write_batch", ".2f"),
    ],
)


def _report(name: str, batch: int, steps: int, t: _bench.Span) -> None:
    base = next((r[2] for r in TABLE.rows if r[0] == "Store.write_batch" and r[1] == batch), None)
    per_step = t.wall_s / steps * 1e6
    TABLE.add(
        name,
        batch,
        per_step,
        t.cpu_s / steps * 1e6,
        t.wall_s / (steps / batch) * 1e3,
        _bench.ratio(per_step, base) if base else 1.0,
    )


async def bench_store(store: Store, rows: Rows, batch: int, steps: int) -> None:
    data = [
        ([rows.step() for _ in range(batch)], [rows.session(rows.n + j) for j in range(batch)])
        for _ in range(steps // batch)
    ]
    with _bench.timed() as t:
        for s, g in data:
            await store.write_batch(s, g)
    _report("Store.write_batch", batch, steps, t)


async def bench_core(store: Store, rows: Rows, batch: int, steps: int) -> None:
    steps_t = SessionStep.__table__  # type: ignore[attr-defined]
    sess_t = GatewaySession.__table__  # type: ignore[attr-defined]
    ins = insert(steps_t)
    up = sqlite_insert(sess_t)
    up = up.on_conflict_do_update(
        index_elements=["session_id"],
        set_={
            c.name: up.excluded[c.name] for c in sess_t.columns if c.name not in ("session_id", "created_at")
        },
    )
    data = [
        (
            [rows.step_dict() for _ in range(batch)],
            [rows.session(rows.n + j).model_dump() for j in range(batch)],
        )
        for _ in range(steps // batch)
    ]
    with _bench.timed() as t:
        for s, g in data:
            last = list({r["session_id"]: r for r in g}.values())
            async with store.writer.begin() as conn:
                await conn.execute(ins, s)
                await conn.execute(up, last)
    _report("core executemany", batch, steps, t)


def _converter(table: Any) -> tuple[list[str], Callable[[dict[str, Any]], tuple[Any, ...]]]:
    cols = [c.name for c in table.columns]
    json_cols = {c.name for c in table.columns if isinstance(c.type, JSON)}
    dt_cols = {c.name for c in table.columns if isinstance(c.type, DateTime)}

    def conv(row: dict[str, Any]) -> tuple[Any, ...]:
        out = []
        for c in cols:
            v = row.get(c)
            if v is not None and c in json_cols:
                v = json_dumps(v)
            elif isinstance(v, datetime) and c in dt_cols:
                v = v.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
            out.append(v)
        return tuple(out)

    return cols, conv


async def bench_sqlite3(db: Path, rows: Rows, batch: int, steps: int) -> None:
    steps_t = SessionStep.__table__  # type: ignore[attr-defined]
    sess_t = GatewaySession.__table__  # type: ignore[attr-defined]
    scols, sconv = _converter(steps_t)
    gcols, gconv = _converter(sess_t)
    isql = f"INSERT INTO {steps_t.name} ({','.join(scols)}) VALUES ({','.join('?' * len(scols))})"
    usql = (
        f"INSERT INTO {sess_t.name} ({','.join(gcols)}) VALUES ({','.join('?' * len(gcols))}) "
        f"ON CONFLICT(session_id) DO UPDATE SET "
        + ",".join(f"{c}=excluded.{c}" for c in gcols if c not in ("session_id", "created_at"))
    )
    con = sqlite3.connect(db, check_same_thread=False, isolation_level=None, timeout=60)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=NORMAL")

    def commit(s: list[dict[str, Any]], g: list[dict[str, Any]]) -> None:
        con.execute("BEGIN IMMEDIATE")
        try:
            con.executemany(isql, [sconv(r) for r in s])
            con.executemany(usql, [gconv(r) for r in {r["session_id"]: r for r in g}.values()])
        except BaseException:
            con.execute("ROLLBACK")
            raise
        con.execute("COMMIT")

    data = [
        (
            [rows.step_dict() for _ in range(batch)],
            [rows.session(rows.n + j).model_dump() for j in range(batch)],
        )
        for _ in range(steps // batch)
    ]
    with _bench.timed() as t:
        for s, g in data:
            await asyncio.to_thread(commit, s, g)
    _report("sqlite3, 1 hop", batch, steps, t)
    con.close()


def bench_objects(rows: Rows, n: int, report: _bench.Report) -> None:
    with _bench.timed() as steps:
        for _ in range(n):
            rows.step()
    st = rows.session(1)
    with _bench.timed() as snapshots:
        for _ in range(n):
            GatewaySession(**st.model_dump())
    report.line(
        f"building one SessionStep(...): {steps.wall_s / n * 1e6:.1f} us; one session snapshot "
        f"GatewaySession(**st.model_dump()): {snapshots.wall_s / n * 1e6:.1f} us"
    )


async def amain(steps: int, report: _bench.Report) -> None:
    with tempfile.TemporaryDirectory(prefix="store-bench-") as d:
        db = Path(d) / "bench.db"
        store = Store(f"sqlite://{db}")
        await store.init()
        rows = Rows()
        try:
            for batch in (1, 64):
                n = max(batch, steps // batch * batch)
                await bench_store(store, rows, batch, n)
                await bench_core(store, rows, batch, n)
                await bench_sqlite3(db, rows, batch, n)
            report.table(TABLE)
            bench_objects(rows, min(steps, 2000), report)
        finally:
            await store.close()


def main(argv: list[str] | None = None) -> int:
    ap = _bench.parser(__doc__, quick={"steps": 128})
    ap.add_argument("--steps", type=int, default=2000, help="steps written per variant and batch size")
    args = ap.parse_args(argv)
    if not 64 <= args.steps <= 1_000_000:
        ap.error("--steps must be 64..1000000")
    report = _bench.Report("store_write_bench", args)
    try:
        import uvloop
    except ImportError:
        report.line("uvloop not installed: the asyncio event loop")
        asyncio.run(amain(args.steps, report))
    else:
        uvloop.run(amain(args.steps, report))
    report.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
