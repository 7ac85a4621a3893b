"""Storage of a long agent session: bytes on disk per byte of unique conversation, and what
recording one step costs, with steps stored in full, as format-2 deltas and as format 3 (deltas,
compressed by the store's writer: ``store.stepcodec.pack``).

    python benchmarks/step_storage_bench.py [--turns 100] [--turn-bytes 1024] [--turn-spread 0]
        [--sessions 16] [--token-sessions 8] [--corpus PATH] [--quick] [--json PATH]

Each session is an agent loop of ``--turns`` calls: call k sends the whole history (a system
prompt, a task, then per turn the assistant's tool call and the tool's output of
``--turn-bytes``) and gets a chat completion back holding the next tool call (``--turn-spread
S``: each output's size drawn from a log-normal of median ``--turn-bytes`` and sigma S). The
outputs are cut in order from real text: by default the repository's own ``*.py`` files, as an
agent's ``cat file.py`` would show them, or any text file (``--corpus``); with token ids the rows
also carry prompt/completion ids (one id per word piece, as a tokenizer gives). Then the worst
case: the same loop on outputs of random bytes, base64-encoded (incompressible). Rows are built
and recorded exactly as the gateway records them (:func:`store.step_record`,
:class:`store.stepcodec.StepEncoder`, ``Store.commit_now``, the prefix check of
:class:`gateway.continuity.PrefixTracker`) into SQLite files of three storages: ``full`` (every
value in full), ``before`` (format 2: deltas, rows as the store wrote them before format 3) and
``now`` (format 3, the store as it is); every step is then read back (``Store.trajectory``) and
checked equal to what was written. Prints the file size / unique content for N sessions, what
each session adds (the file of 2N sessions minus that of N: the target's measure, without the
file's fixed cost), the ideal (each session's unique content as one zlib stream), CPU
microseconds per recorded step, and where the bytes of the ``now`` file go (SQLite ``dbstat``).
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import random
import re
import sqlite3
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _bench
from sqlalchemy import JSON

from gateway.continuity import PrefixTracker
from store import Store, json_dumps, step_record
from store.engine import SQLITE_PAGE_SIZE
from store.stepcodec import StepEncoder, message_digests, pack, token_chain

ROOT = Path(__file__).resolve().parent.parent
SYSTEM = {
    "role": "system",
    "content": "You are an agent in a Linux shell. Call the bash tool to run commands.",
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]
_PIECE = re.compile(r"\w{1,8}|\s+|[^\w\s]")


def source_corpus(root: Path = ROOT) -> list[tuple[str, str]]:
    """The repository's own ``*.py`` files in path order, as (path, text)."""
    files = sorted(
        p for p in root.rglob("*.py") if not any(part.startswith(".") for part in p.relative_to(root).parts)
    )
    return [(str(p.relative_to(root)), p.read_text(encoding="utf-8", errors="replace")) for p in files]


def file_corpus(path: Path) -> list[tuple[str, str]]:
    """One text file as the corpus."""
    return [(path.name, path.read_text(encoding="utf-8", errors="replace"))]


class Cutter:
    """Cuts successive outputs from a corpus (wrapping around at its end), each as the command
    that printed it and its text; ``start`` is where this session begins to read."""

    def __init__(self, corpus: list[tuple[str, str]], start: int) -> None:
        self.spans: list[tuple[int, str]] = []
        parts, at = [], 0
        for path, text in corpus:
            self.spans.append((at, path))
            parts.append(text)
            at += len(text)
        self.text = "".join(parts)
        self.at = start % len(self.text)

    def cut(self, n: int) -> tuple[str, str]:
        text = self.text[self.at : self.at + n]
        while len(text) < n:
            text += self.text[: n - len(text)]
        path = next((p for at, p in reversed(self.spans) if at <= self.at), self.spans[0][1])
        offset = self.at - next(at for at, p in self.spans if p == path)
        command = f"tail -c +{offset + 1} {path} | head -c {n}"
        self.at = (self.at + n) % len(self.text)
        return command, text


class RandomCutter:
    """Outputs of random bytes, base64-encoded: the incompressible worst case."""

    def __init__(self, seed: str) -> None:
        self.rng = random.Random(seed)

    def cut(self, n: int) -> tuple[str, str]:
        return f"head -c {n * 3 // 4} /dev/urandom | base64 -w0", base64.b64encode(
            self.rng.randbytes(n * 3 // 4 + 3)
        ).decode()[:n]


def token_ids(text: str) -> list[int]:
    """Token ids of ``text``, one per word piece (as a tokenizer: the same text, the same ids)."""
    return [zlib.crc32(p.encode()) % 150_000 for p in _PIECE.findall(text)]


def turn_sizes(sid: str, turns: int, turn_bytes: int, spread: float) -> list[int]:
    """Bytes of each turn's tool output: ``turn_bytes`` each, or with ``spread`` > 0 drawn
    from a log-normal distribution of median ``turn_bytes`` and that sigma (seeded by ``sid``),
    as tool outputs of mixed sizes."""
    if spread <= 0:
        return [turn_bytes] * turns
    rng = random.Random(sid)
    return [max(16, round(turn_bytes * math.exp(rng.gauss(0.0, spread)))) for _ in range(turns)]


def session_rows(
    sid: str, turns: int, turn_bytes: int, tokens: bool, cutter: Any, spread: float = 0.0
) -> tuple[list[dict[str, Any]], int, bytes]:
    """The rows of one session (in call order), the bytes of its unique content (every distinct
    message once, every response once, and with ``tokens`` every token id once, each as the
    JSON text the store writes) and that content as one zlib stream (the ideal)."""
    rng = random.Random(sid)
    task = {"role": "user", "content": "Read the files of this project and summarise what each one does."}
    messages: list[dict[str, Any]] = [SYSTEM, task]
    uniques = [json_dumps(SYSTEM), json_dumps(task), json_dumps(TOOLS)]
    rows = []
    prompt_ids: list[int] = token_ids(json_dumps(messages)) if tokens else []
    sizes = turn_sizes(sid, turns, turn_bytes, spread)
    command, output = cutter.cut(sizes[0])
    for k in range(turns):
        call_id = f"call_{rng.getrandbits(96):024x}"
        answer = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "bash", "arguments": json.dumps({"command": command})},
                }
            ],
        }
        response = {
            "id": f"chatcmpl-{rng.getrandbits(96):024x}",
            "object": "chat.completion",
            "created": 1700000000 + 7 * k,
            "model": "policy",
            "choices": [{"index": 0, "message": answer, "logprobs": None, "finish_reason": "tool_calls"}],
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": 30,
                "total_tokens": len(prompt_ids) + 30,
            },
        }
        uniques.append(json_dumps(response))
        completion = token_ids(json_dumps(answer)) if tokens else None
        if tokens:
            uniques += [json_dumps(prompt_ids)] if k == 0 else []
            uniques.append(json_dumps(completion))
        rows.append(
            step_record(
                session_id=sid,
                seq=k + 1,
                step_id=k + 1,
                llm_model="policy",
                endpoint="chat.completions",
                is_stream=False,
                status="ok",
                status_code=200,
                messages=messages,
                request={
                    "model": "policy",
                    "messages": messages,
                    "tools": TOOLS,
                    "temperature": 0.7,
                    "max_tokens": 512,
                },
                response=response,
                finish_reason="tool_calls",
                prompt_tokens=len(prompt_ids),
                completion_tokens=30,
                total_tokens=len(prompt_ids) + 30,
                latency_ms=850.0,
                meta_json={"route": "policy"},
                prompt_token_ids=list(prompt_ids) if tokens else None,
                completion_token_ids=completion,
                job_id="bench-job",
                env_name="bench",
                group_id=f"g-{sid}",
            )
        )
        if k + 1 < turns:
            command_next, output_next = cutter.cut(sizes[k + 1])
        tool = {"role": "tool", "tool_call_id": call_id, "content": output}
        uniques.append(json_dumps(tool))
        messages = [*messages, answer, tool]
        if tokens:
            new_ids = token_ids(json_dumps(tool))
            uniques.append(json_dumps(new_ids))
            prompt_ids = prompt_ids + (completion or []) + new_ids
        if k + 1 < turns:
            command, output = command_next, output_next
    text = "".join(uniques).encode()
    return rows, len(text), zlib.compress(text, 9)


def db_bytes(path: Path) -> tuple[int, int]:
    """The database file's size (after folding the WAL in) and the bytes of the pages of the
    ``session_steps`` table and its indexes (SQLite ``dbstat``)."""
    con = sqlite3.connect(path)
    try:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        size = int(con.execute("PRAGMA page_count").fetchone()[0]) * int(
            con.execute("PRAGMA page_size").fetchone()[0]
        )
        names = [r[0] for r in con.execute("SELECT name FROM sqlite_schema WHERE tbl_name = 'session_steps'")]
        steps = sum(
            int(con.execute("SELECT coalesce(sum(pgsize), 0) FROM dbstat WHERE name = ?", (n,)).fetchone()[0])
            for n in names
        )
        return size, steps
    finally:
        con.close()


_TEXT_COLUMNS = (
    "packed",
    "messages",
    "request",
    "response",
    "prompt_token_ids",
    "completion_token_ids",
    "record_id",
    "created_at",
    "encoding",
    "meta_json",
    "session_id",
    "env_name",
    "llm_model",
    "group_id",
    "job_id",
    "endpoint",
    "status",
    "finish_reason",
)


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
        stats = con.execute(
            "SELECT name, count(*), sum(pgsize), sum(payload), sum(unused) FROM dbstat "
            "GROUP BY name ORDER BY sum(pgsize) DESC"
        ).fetchall()
        lines = [f"  where the deltas file goes (page size {page} B; x = bytes / unique content):"]
        other_pages = other_bytes = 0
        for name, pages, size, payload, unused in stats:
            if name not in names:
                other_pages += pages
                other_bytes += size
                continue
            lines.append(
                f"    {name:<36} {pages:5d} pages {size / unique:6.3f}x  payload {payload / unique:6.3f}x  "
                f"free in its pages {unused / unique:6.3f}x  page/cell headers "
                f"{(size - payload - unused) / unique:6.3f}x"
            )
        lines.append(
            f"    {'every other table and index':<36} {other_pages:5d} pages {other_bytes / unique:6.3f}x  "
            "(one page each, empty: per file, not per session)"
        )
        sums = con.execute(
            "SELECT "
            + ", ".join(f"coalesce(sum(length(CAST({c} AS BLOB))), 0)" for c in _TEXT_COLUMNS)
            + " FROM session_steps"
        ).fetchone()
        payload = int(
            con.execute("SELECT sum(payload) FROM dbstat WHERE name = 'session_steps'").fetchone()[0]
        )
        cols = sorted(zip(_TEXT_COLUMNS, sums, strict=True), key=lambda c: -c[1])
        lines.append(
            "    session_steps payload by column: "
            + ", ".join(f"{c} {n / unique:.3f}x" for c, n in cols if n)
            + f", record headers and numbers "
            f"{(payload - sum(sums)) / unique:.3f}x"
        )
        return lines
    finally:
        con.close()


def legacy(row: dict[str, Any]) -> dict[str, Any]:
    """A row as the store wrote it before format 3: None in ``messages``, ``request`` and
    ``response`` as the JSON text ``null``, a 32-hex-digit ``record_id``."""
    row = dict(row)
    for c in ("messages", "request", "response"):
        if row[c] is None:
            row[c] = JSON.NULL
    row["record_id"] = random.getrandbits(128).to_bytes(16, "big").hex()
    return row


async def record(
    path: Path, sessions: list[list[dict[str, Any]]], version: int | None
) -> tuple[float, float, float]:
    """Record every step as the gateway does (one commit per step, sessions interleaved) in
    format ``version`` (None: every value in full); returns the CPU microseconds per step spent
    on the prefix check + encoding (the gateway's event loop), on compressing the row
    (:func:`store.stepcodec.pack`, timed apart: it runs inside the write) and on writing."""
    store = Store(f"sqlite:///{path}")
    await store.init()
    encoder, prefixes = StepEncoder(version or 3), PrefixTracker()
    encode_s = pack_s = write_s = 0.0
    n = 0
    try:
        for k in range(max(len(s) for s in sessions)):
            for rows in sessions:
                if k >= len(rows):
                    continue
                row = dict(rows[k])
                t0 = time.process_time()
                tokens = token_chain(row["prompt_token_ids"], row["completion_token_ids"])
                digests = message_digests(row["messages"]) if version else None
                row["extends_prefix"] = prefixes.observe(
                    row["session_id"],
                    row["seq"],
                    ok=True,
                    prompt_ids=row["prompt_token_ids"],
                    tokens=tokens,
                    messages=row["messages"],
                    answer_message=row["response"]["choices"][0]["message"],
                    tools=None,
                    digests=digests,
                )
                pending = encoder.encode(row, tokens, digests) if version else None
                t1 = time.process_time()
                if version == 3:
                    pack(row)
                t2 = time.process_time()
                if version == 2:
                    row = legacy(row)
                t3 = time.process_time()
                if not store.commit_now([row], []):
                    await store.write_batch([row], [])
                if pending is not None:
                    encoder.committed(pending)
                t4 = time.process_time()
                encode_s += t1 - t0
                pack_s += t2 - t1
                write_s += t4 - t3
                n += 1
        for rows in sessions:  # every step reads back exactly as it was recorded
            got = await store.trajectory(rows[0]["session_id"])
            for g, want in zip(got, rows, strict=True):
                for col in ("messages", "request", "prompt_token_ids", "completion_token_ids", "response"):
                    if json_dumps(getattr(g, col)) != json_dumps(want[col]):
                        raise SystemExit(f"step {want['seq']} of {want['session_id']}: {col} differs")
    finally:
        await store.close()
    return encode_s / n * 1e6, pack_s / n * 1e6, write_s / n * 1e6


CONFIGS: tuple[tuple[str, int | None], ...] = (("full", None), ("before", 2), ("now", 3))
"""(name, the format written; None: every value in full)."""


async def run(
    report: _bench.Report,
    label: str,
    cutter_of: Callable[[int], Any],
    turns: int,
    turn_bytes: int,
    n_sessions: int,
    tokens: bool,
    spread: float = 0.0,
    configs: tuple[tuple[str, int | None], ...] = CONFIGS,
    show_where: bool = True,
) -> None:
    built = [
        session_rows(f"s{i}", turns, turn_bytes, tokens, cutter_of(i), spread) for i in range(2 * n_sessions)
    ]
    unique_n = sum(u for _, u, _ in built[:n_sessions])
    unique_2n = sum(u for _, u, _ in built)
    ideal = sum(len(z) for _, _, z in built) / unique_2n
    kind = "with token ids" if tokens else "messages only"
    sizes_text = f"{turn_bytes} B" if spread <= 0 else f"median {turn_bytes} B (log-normal, sigma {spread})"
    table = _bench.Table(
        f"{label}: {n_sessions} sessions x {turns} turns x {sizes_text} per turn ({kind}); unique content "
        f"{unique_n / n_sessions / 1024:.1f} KiB per session; ideal (each session's unique content as one "
        f"zlib stream, level 9): {ideal:.2f}x",
        [
            "storage",
            ("file/unique", ".2f"),
            ("per session", ".2f"),
            ("steps/unique", ".2f"),
            ("prefix+encode us", ".1f"),
            ("compress us", ".1f"),
            ("write us", ".1f"),
            ("total CPU us/step", ".1f"),
        ],
    )
    where: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, version in configs:
            sizes = []
            for count in (n_sessions,) if version is None else (n_sessions, 2 * n_sessions):
                path = Path(tmp) / f"{name}-{count}.db"
                encode_us, pack_us, write_us = await record(
                    path, [rows for rows, _, _ in built[:count]], version
                )
                sizes.append(db_bytes(path))
                if count == n_sessions:
                    cpu = (encode_us, pack_us, write_us)
                if name == "now" and count == 2 * n_sessions and show_where:
                    where = breakdown(path, unique_2n)
            (size, steps), (enc, pk, wr) = sizes[0], cpu
            marginal = (sizes[1][0] - sizes[0][0]) / (unique_2n - unique_n) if len(sizes) > 1 else None
            table.add(
                name,
                size / unique_n,
                marginal,
                steps / unique_n,
                enc,
                pk if version == 3 else None,
                wr,
                enc + wr,
            )
    report.table(table)
    report.line(
        f"page size {SQLITE_PAGE_SIZE} B; file/unique: the file of {n_sessions} sessions (with its fixed cost, "
        f"every empty table); per session: what each session adds (the file of {2 * n_sessions} sessions "
        f"minus that of {n_sessions}, over the unique content they add), the measure of the target; "
        "steps/unique: the session_steps table and its indexes; compress: of the write, the zlib of the row "
        "(the writer's thread)"
    )
    for line in where:
        report.line(line)


def main(argv: list[str] | None = None) -> int:
    ap = _bench.parser(__doc__, quick={"turns": 10, "sessions": 2, "token_sessions": 1})
    ap.add_argument("--turns", type=int, default=100)
    ap.add_argument("--turn-bytes", type=int, default=1024)
    ap.add_argument(
        "--sessions",
        type=int,
        default=16,
        help="sessions of the messages-only workload (and twice as many for the per-session cost)",
    )
    ap.add_argument("--token-sessions", type=int, default=8, help="the same for the workload with token ids")
    ap.add_argument(
        "--turn-spread",
        type=float,
        default=0.0,
        help="sigma of log-normal turn sizes around --turn-bytes (0: every turn the same size)",
    )
    ap.add_argument(
        "--corpus",
        type=Path,
        default=None,
        help="a text file to cut the tool outputs from (default: this repository's *.py files)",
    )
    args = ap.parse_args(argv)
    report = _bench.Report("step_storage_bench", args)
    corpus = file_corpus(args.corpus) if args.corpus is not None else source_corpus()
    label = (
        f"corpus {args.corpus.name}" if args.corpus is not None else "corpus: this repository's *.py files"
    )
    size = sum(len(t) for _, t in corpus)

    def cutter(i: int) -> Cutter:  # each session reads from its own place
        return Cutter(corpus, i * size // max(1, 2 * max(args.sessions, args.token_sessions)))

    asyncio.run(
        run(report, label, cutter, args.turns, args.turn_bytes, args.sessions, False, args.turn_spread)
    )
    if args.token_sessions > 0:
        asyncio.run(
            run(
                report,
                label,
                cutter,
                args.turns,
                args.turn_bytes,
                args.token_sessions,
                True,
                args.turn_spread,
                show_where=False,
            )
        )
    asyncio.run(
        run(
            report,
            "worst case: random bytes, base64-encoded",
            lambda i: RandomCutter(f"r{i}"),
            args.turns,
            args.turn_bytes,
            args.sessions,
            False,
            args.turn_spread,
            configs=CONFIGS[1:],
            show_where=False,
        )
    )
    report.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
