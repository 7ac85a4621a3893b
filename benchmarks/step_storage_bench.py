"""Storage of a long agent session: bytes on disk per byte of unique conversation, and what
recording one step costs, with steps stored in full and as deltas (``telemetry.step_deltas``).

    python benchmarks/step_storage_bench.py [--turns 100] [--turn-bytes 1024] [--turn-spread 0] [--sessions 16] [--token-sessions 8]

Each session is an agent loop of ``--turns`` calls: call k sends the whole history (a system
prompt, then per turn a user message of ``--turn-bytes`` and the assistant's answer) and gets a
chat completion back (``--turn-spread S``: each turn's size drawn from a log-normal of median
``--turn-bytes`` and sigma S, as tool outputs of mixed sizes); with token ids the rows also
carry prompt/completion token ids (one token per byte). Rows are built and recorded exactly as the gateway records them
(:func:`store.step_record`, :class:`store.stepcodec.StepEncoder`, ``Store.commit_now``, the
prefix check of :class:`gateway.continuity.PrefixTracker`), in one run into SQLite files of four
kinds: ``full`` (every value in full, 4 KiB pages), ``before`` (deltas on a 4 KiB file, the prefix
check and the encoder each hashing the history), ``now`` (deltas on a new file as the store makes
it, one hashing pass per step) and ``16k`` (the same on 16 KiB pages); every step is then read back (``Store.trajectory``) and checked equal
to what was written. Prints the file size / unique content for N sessions, what each session adds
(the file of 2N sessions minus that of N: the target's measure, without the file's fixed cost),
CPU microseconds per recorded step, and where the bytes of the ``now`` file go (SQLite
``dbstat``: pages, payload and free bytes per table and index; the text bytes of each column).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gateway.continuity import PrefixTracker
from store import Store, json_dumps, step_record
from store.engine import SQLITE_PAGE_SIZE
from store.stepcodec import StepEncoder, message_digests, token_chain

ANSWER = "Done: I ran the command and the output is shown above; next I will check the log file."


def turn_sizes(sid: str, turns: int, turn_bytes: int, spread: float) -> list[int]:
    """Bytes of each turn's user message: ``turn_bytes`` each, or with ``spread`` > 0 drawn
    from a log-normal distribution of median ``turn_bytes`` and that sigma (seeded by ``sid``),
    as tool outputs of mixed sizes."""
    if spread <= 0:
        return [turn_bytes] * turns
    rng = random.Random(sid)
    return [max(16, round(turn_bytes * math.exp(rng.gauss(0.0, spread)))) for _ in range(turns)]


def session_rows(sid: str, turns: int, turn_bytes: int, tokens: bool,
                 spread: float = 0.0) -> tuple[list[dict[str, Any]], int]:
    """The rows of one session (in call order) and the bytes of its unique content: every
    distinct message once, every response once, and with ``tokens`` every token id once."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent in a Linux shell."}]
    unique = len(json_dumps(messages[0]))
    rows = []
    prompt_ids: list[int] = []
    for k, size in enumerate(turn_sizes(sid, turns, turn_bytes, spread)):
        user = {"role": "user", "content": f"[turn {k}] " + ("output line\n" * (size // 12 + 1))[:size]}
        messages = [*messages, user]
        unique += len(json_dumps(user))
        response = {"id": f"chatcmpl-{sid}-{k}", "object": "chat.completion", "created": 1700000000 + k,
                    "model": "policy", "choices": [{"index": 0, "message": {"role": "assistant", "content": ANSWER},
                                                    "logprobs": None, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 100 * k, "completion_tokens": 20, "total_tokens": 100 * k + 20}}
        unique += len(json_dumps(response))
        new_prompt = list(json_dumps(user).encode()) if tokens else []
        completion = list(ANSWER.encode()) if tokens else None
        prompt_ids = prompt_ids + new_prompt
        if tokens:
            unique += len(json_dumps(new_prompt)) + len(json_dumps(completion))
        rows.append(step_record(
            session_id=sid, seq=k + 1, step_id=k + 1, llm_model="policy", endpoint="chat.completions",
            is_stream=False, status="ok", status_code=200, messages=messages,
            request={"model": "policy", "messages": messages, "temperature": 0.7, "max_tokens": 512},
            response=response, finish_reason="stop", prompt_tokens=100 * k, completion_tokens=20,
            total_tokens=100 * k + 20, latency_ms=850.0, meta_json={"route": "policy"},
            prompt_token_ids=list(prompt_ids) if tokens else None, completion_token_ids=completion,
            job_id="bench-job", env_name="bench", group_id=f"g-{sid}"))
        answer = {"role": "assistant", "content": ANSWER}
        messages = [*messages, answer]
        if tokens:
            prompt_ids = prompt_ids + (completion or [])
    return rows, unique


def db_bytes(path: Path) -> tuple[int, int]:
    """The database file's size (after folding the WAL in) and the bytes of the pages of the
    ``session_steps`` table and its indexes (SQLite ``dbstat``)."""
    con = sqlite3.connect(path)
    try:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        size = int(con.execute("PRAGMA page_count").fetchone()[0]) * int(con.execute("PRAGMA page_size").fetchone()[0])
        names = [r[0] for r in con.execute("SELECT name FROM sqlite_schema WHERE tbl_name = 'session_steps'")]
        steps = sum(int(con.execute("SELECT coalesce(sum(pgsize), 0) FROM dbstat WHERE name = ?", (n,)).fetchone()[0])
                    for n in names)
        return size, steps
    finally:
        con.close()


_TEXT_COLUMNS = ("messages", "request", "response", "prompt_token_ids", "completion_token_ids", "record_id",
                 "created_at", "encoding", "meta_json", "session_id", "env_name", "llm_model", "group_id", "job_id",
                 "endpoint", "status", "finish_reason")


def breakdown(path: Path, unique: int) -> list[str]:
    """Where the file's bytes go, as lines of text: each table and index of ``session_steps``
    (pages, payload, free bytes in its pages), the pages of every other object (an empty
    store's fixed cost, not per session), and the ``session_steps`` payload by column (the text
    bytes of each text/JSON column; the rest is record headers and numbers). Ratios are to
    ``unique``."""
    con = sqlite3.connect(path)
    try:
        page = int(con.execute("PRAGMA page_size").fetchone()[0])
        names = {r[0] for r in con.execute("SELECT name FROM sqlite_schema WHERE tbl_name = 'session_steps'")}
        stats = con.execute("SELECT name, count(*), sum(pgsize), sum(payload), sum(unused) FROM dbstat "
                            "GROUP BY name ORDER BY sum(pgsize) DESC").fetchall()
        lines = [f"  where the deltas file goes (page size {page} B; x = bytes / unique content):"]
        other_pages = other_bytes = 0
        for name, pages, size, payload, unused in stats:
            if name not in names:
                other_pages += pages
                other_bytes += size
                continue
            lines.append(f"    {name:<36} {pages:5d} pages {size / unique:6.3f}x  payload {payload / unique:6.3f}x  "
                         f"free in its pages {unused / unique:6.3f}x  page/cell headers "
                         f"{(size - payload - unused) / unique:6.3f}x")
        lines.append(f"    {'every other table and index':<36} {other_pages:5d} pages {other_bytes / unique:6.3f}x  "
                     "(one page each, empty: per file, not per session)")
        sums = con.execute("SELECT " + ", ".join(f"coalesce(sum(length(CAST({c} AS BLOB))), 0)" for c in _TEXT_COLUMNS)
                           + " FROM session_steps").fetchone()
        payload = int(con.execute("SELECT sum(payload) FROM dbstat WHERE name = 'session_steps'").fetchone()[0])
        cols = sorted(zip(_TEXT_COLUMNS, sums, strict=True), key=lambda c: -c[1])
        lines.append("    session_steps payload by column: " + ", ".join(
            f"{c} {n / unique:.3f}x" for c, n in cols if n) + f", record headers and numbers "
            f"{(payload - sum(sums)) / unique:.3f}x")
        return lines
    finally:
        con.close()


def make_file(path: Path, page_size: int | None) -> None:
    """``page_size`` None: leave ``path`` to the store (a new file gets ``SQLITE_PAGE_SIZE``);
    else create it first with that page size, as a file made by an earlier version."""
    if page_size is None:
        return
    con = sqlite3.connect(path)
    try:
        con.execute(f"PRAGMA page_size={page_size}")
        con.execute("PRAGMA journal_mode=WAL")
    finally:
        con.close()


async def record(path: Path, sessions: list[list[dict[str, Any]]], deltas: bool, shared: bool) -> tuple[float, float]:
    """Record every step as the gateway does (one commit per step, sessions interleaved); returns
    the CPU microseconds per step spent on the prefix check + encoding, and on writing.
    ``shared``: one exact hashing pass per step for both (``message_digests``, as the gateway
    does), else each hashes the history itself (before)."""
    store = Store(f"sqlite:///{path}")
    await store.init()
    encoder, prefixes = StepEncoder(), PrefixTracker()
    encode_s = write_s = 0.0
    n = 0
    try:
        for k in range(max(len(s) for s in sessions)):
            for rows in sessions:
                if k >= len(rows):
                    continue
                row = dict(rows[k])
                t0 = time.process_time()
                tokens = token_chain(row["prompt_token_ids"], row["completion_token_ids"])
                digests = message_digests(row["messages"]) if deltas and shared else None
                row["extends_prefix"] = prefixes.observe(
                    row["session_id"], row["seq"], ok=True, prompt_ids=row["prompt_token_ids"], tokens=tokens,
                    messages=row["messages"], answer_message=row["response"]["choices"][0]["message"], tools=None,
                    digests=digests)
                pending = encoder.encode(row, tokens, digests) if deltas else None
                t1 = time.process_time()
                if not store.commit_now([row], []):
                    await store.write_batch([row], [])
                if pending is not None:
                    encoder.committed(pending)
                t2 = time.process_time()
                encode_s += t1 - t0
                write_s += t2 - t1
                n += 1
        for rows in sessions:  # every step reads back exactly as it was recorded
            got = await store.trajectory(rows[0]["session_id"])
            for g, want in zip(got, rows, strict=True):
                for col in ("messages", "request", "prompt_token_ids", "response"):
                    if json_dumps(getattr(g, col)) != json_dumps(want[col]):
                        raise SystemExit(f"step {want['seq']} of {want['session_id']}: {col} differs")
    finally:
        await store.close()
    return encode_s / n * 1e6, write_s / n * 1e6


# (name, deltas, page size of the file (None: a new file, SQLITE_PAGE_SIZE), one shared hashing pass)
CONFIGS = (("full", False, 4096, False), ("before", True, 4096, False), ("now", True, None, True),
           ("16k", True, 16384, True))


async def run(turns: int, turn_bytes: int, n_sessions: int, tokens: bool, spread: float = 0.0) -> None:
    built = [session_rows(f"s{i}", turns, turn_bytes, tokens, spread) for i in range(2 * n_sessions)]
    unique_n = sum(u for _, u in built[:n_sessions])
    unique_2n = sum(u for _, u in built)
    label = "with token ids" if tokens else "messages only"
    sizes_text = f"{turn_bytes} B" if spread <= 0 else f"median {turn_bytes} B (log-normal, sigma {spread})"
    print(f"{n_sessions} sessions x {turns} turns x {sizes_text} per turn ({label}); unique content "
          f"{unique_n / n_sessions / 1024:.1f} KiB per session")
    print(f"  {'storage':<7} {'page':>6} {'file/unique':>12} {'per session':>12} {'steps/unique':>13} "
          f"{'prefix+encode':>14} {'write':>7} {'total (CPU us/step)':>20}")
    where: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, deltas, page_size, shared in CONFIGS:
            sizes = []
            for count in ((n_sessions,) if not deltas else (n_sessions, 2 * n_sessions)):
                path = Path(tmp) / f"{name}-{count}.db"
                make_file(path, page_size)
                encode_us, write_us = await record(path, [rows for rows, _ in built[:count]], deltas, shared)
                sizes.append(db_bytes(path))
                if count == n_sessions:
                    cpu = (encode_us, write_us)
                if name == "now" and count == 2 * n_sessions:
                    where = breakdown(path, unique_2n)
            (size, steps), enc, wr = sizes[0], *cpu
            page = page_size or SQLITE_PAGE_SIZE
            marginal = f"{(sizes[1][0] - sizes[0][0]) / (unique_2n - unique_n):12.2f}" if len(sizes) > 1 else f"{'':>12}"
            print(f"  {name:<7} {page:6d} {size / unique_n:12.2f} {marginal} {steps / unique_n:13.2f} "
                  f"{enc:14.1f} {wr:7.1f} {enc + wr:20.1f}")
    print(f"  file/unique: the file of {n_sessions} sessions (with its fixed cost, every empty table); per session: "
          f"what each session adds (the file of {2 * n_sessions} sessions minus that of {n_sessions}, over the unique "
          "content they add), the measure of the target; steps/unique: the session_steps table and its indexes")
    print("\n".join(where))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="session storage: full steps vs deltas")
    ap.add_argument("--turns", type=int, default=100)
    ap.add_argument("--turn-bytes", type=int, default=1024)
    ap.add_argument("--sessions", type=int, default=16,
                    help="sessions of the messages-only workload (and twice as many for the per-session cost)")
    ap.add_argument("--token-sessions", type=int, default=8, help="the same for the workload with token ids")
    ap.add_argument("--turn-spread", type=float, default=0.0,
                    help="sigma of log-normal turn sizes around --turn-bytes (0: every turn the same size)")
    args = ap.parse_args(argv)
    asyncio.run(run(args.turns, args.turn_bytes, args.sessions, False, args.turn_spread))
    if args.token_sessions > 0:
        asyncio.run(run(args.turns, args.turn_bytes, args.token_sessions, True, args.turn_spread))
    return 0


if __name__ == "__main__":
    sys.exit(main())
