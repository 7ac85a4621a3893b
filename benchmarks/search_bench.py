"""The viewer's search index: building it, searching it, and what it costs the gateway's writes.

    PYTHONPATH=. python benchmarks/search_bench.py [--sessions 2000] [--steps 8] [--writes 4000] [--quick] [--json PATH]

Fills a SQLite store with ``--sessions`` sessions of ``--steps`` steps, stored as the gateway
stores them (each a delta on the previous step, packed); builds the index
(``store.search.StepSearch.refresh``) and times searches; then times ``Store.write_batch`` of one
step (the gateway's commit) without a viewer, while another process refreshes the index in a
loop (a viewer indexing a running job: every round indexes the sessions just written), and
without again. Imports ``store`` only.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _bench

from store import Store, step_record
from store.engine import make_engine, parse_db_url
from store.search import StepSearch
from store.stepcodec import StepEncoder

LOG_LINE = "Dec 10 06:55:{s:02d} sshd[{p}]: Failed password for root from 10.0.{a}.{b} port 22 ssh2"
INDEXER = """
import asyncio, sys
from pathlib import Path
from store.engine import make_engine, parse_db_url
from store.search import StepSearch

async def main(url, stop):
    engine = make_engine(parse_db_url(url), writer=False)
    search = StepSearch(engine)
    await search.refresh()
    print("ready", flush=True)
    rounds = 0
    while not Path(stop).exists():
        await search.refresh()
        rounds += 1
        await asyncio.sleep(0.01)
    await search.close()
    await engine.dispose()
    print(rounds, flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def session_rows(sid: str, steps: int, enc: StepEncoder) -> list[dict[str, object]]:
    """A session's steps as the gateway writes them: the whole history re-sent at each step."""
    history: list[dict[str, object]] = [
        {"role": "system", "content": "You investigate logs with the bash tool."}
    ]
    rows = []
    for seq in range(1, steps + 1):
        tool = "\n".join(
            LOG_LINE.format(s=i % 60, p=1000 + i + seq, a=seq % 250, b=i % 250) for i in range(40)
        )
        history = [
            *history,
            {"role": "user" if seq == 1 else "tool", "content": f"step {seq} of {sid}\n{tool}"},
        ]
        answer = f"I count {seq * 7} failed logins so far in {sid}; next I grep auth.log.{seq}"
        row = step_record(
            session_id=sid,
            seq=seq,
            step_id=seq,
            llm_model="m",
            endpoint="chat.completions",
            job_id="bench",
            env_name="e",
            messages=list(history),
            request={"model": "m", "messages": list(history)},
            response={"choices": [{"message": {"role": "assistant", "content": answer}}]},
        )
        enc.committed(enc.encode(row))
        rows.append(row)
        history = [*history, {"role": "assistant", "content": answer}]
    return rows


async def fill(store: Store, prefix: str, sessions: int, steps: int) -> None:
    enc = StepEncoder()
    batch: list[dict[str, object]] = []
    for i in range(sessions):
        batch += session_rows(f"{prefix}{i:06d}", steps, enc)
        if len(batch) >= 512:
            await store.write_batch(batch, [])
            batch = []
    if batch:
        await store.write_batch(batch, [])


async def write_latencies(store: Store, prefix: str, n: int, steps: int) -> list[float]:
    """Seconds of each ``write_batch`` of one step, ``n`` of them (sessions of ``steps`` steps)."""
    enc = StepEncoder()
    out = []
    for i in range(0, n, steps):
        for row in session_rows(f"{prefix}{i:06d}", steps, enc):
            t0 = time.perf_counter()
            await store.write_batch([row], [])
            out.append(time.perf_counter() - t0)
    return out[:n]


async def main() -> int:
    ap = _bench.parser(__doc__, quick={"sessions": 200, "steps": 4, "writes": 200})
    ap.add_argument("--sessions", type=int, default=2000)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--writes", type=int, default=4000)
    args = ap.parse_args()
    report = _bench.Report("search_bench", args)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite://{Path(tmp) / 'bench.db'}"
        store = Store(url)
        await store.init()
        with _bench.timed() as filled:
            await fill(store, "s", args.sessions, args.steps)
        report.line(f"stored {args.sessions} sessions x {args.steps} steps in {filled.wall_s:.1f} s")
        engine = make_engine(parse_db_url(url), writer=False)
        search = StepSearch(engine)
        await search.ensure()
        with _bench.timed() as built:
            await search.refresh()
        with _bench.timed() as again:
            await search.refresh()
        searches = {}
        for words in ("failed password", "auth.log.3 grep", "nosuchword"):
            times = []
            for _ in range(5):
                with _bench.timed() as t:
                    page = await search.search(words)
                times.append(t.wall_s)
            searches[words] = (_bench.median(times) * 1000, len(page.hits), page.more)
        await search.close()
        await engine.dispose()
        store_mb = sum(f.stat().st_size for f in Path(tmp).glob("bench.db*")) / 2**20
        index_mb = sum(f.stat().st_size for f in Path(tmp).glob("bench.search.db*")) / 2**20
        report.line(f"store {store_mb:.1f} MiB, index {index_mb:.1f} MiB (WAL files included)")
        build = _bench.Table("the index", ["what", ("seconds", ".2f"), ("steps / s", ",.0f")])
        build.add("index every session", built.wall_s, args.sessions * args.steps / built.wall_s)
        build.add("refresh with nothing new", again.wall_s, None)
        report.table(build)
        found = _bench.Table("searches (median of 5)", ["words", ("ms", ".1f"), "hits (page of 50)", "more"])
        for words, (t_ms, n, more) in searches.items():
            found.add(words, t_ms, n, more)
        report.table(found)

        lat: dict[str, list[float]] = {}
        lat["no viewer"] = await write_latencies(store, "a", args.writes, args.steps)
        stop = Path(tmp) / "stop"
        env = {**os.environ, "PYTHONPATH": str(_bench.REPO)}
        indexer = subprocess.Popen(
            [sys.executable, "-c", INDEXER, url, str(stop)], env=env, stdout=subprocess.PIPE, text=True
        )
        try:
            assert indexer.stdout is not None
            await asyncio.to_thread(indexer.stdout.readline)  # its first round done: it indexes what follows
            lat["viewer indexing"] = await write_latencies(store, "b", args.writes, args.steps)
        finally:
            stop.touch()
            rounds = (indexer.communicate(timeout=300)[0] or "?").strip()
        lat["no viewer, again"] = await write_latencies(store, "c", args.writes, args.steps)
        await store.close()
    table = _bench.Table(
        f"Store.write_batch of one step ({args.writes} each; the indexer ran {rounds} refreshes)",
        ["while", ("p50 us", ",.0f"), ("p90 us", ",.0f"), ("p99 us", ",.0f"), ("max ms", ".1f")],
    )
    for name, xs in lat.items():
        table.add(
            name,
            _bench.percentile(xs, 50) * 1e6,
            _bench.percentile(xs, 90) * 1e6,
            _bench.percentile(xs, 99) * 1e6,
            max(xs) * 1000,
        )
    report.table(table)
    report.finish()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
