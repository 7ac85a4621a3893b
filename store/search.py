"""Full-text search over the recorded steps: SQLite FTS5 or PostgreSQL ``tsvector`` (docs/viewer.md).

Stored steps are deltas, compressed, so the searching reader keeps its own index
(:class:`StepSearch`) built from decoded steps: on SQLite in a file beside the store
(:func:`index_path`), on PostgreSQL in two tables. Each step is indexed with the text new since
the previous step and its answer, at most :data:`MAX_STEP_CHARS`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from store.engine import make_engine, sqlite_path
from store.models import SessionStep
from store.stepcodec import answer_items, decode_rows
from wire.text import display_text

ST = SessionStep.__table__  # type: ignore[attr-defined]
log = logging.getLogger(__name__)

INDEX_TABLE = "step_search"
BOOK_TABLE = "step_search_sessions"
MAX_STEP_CHARS = 200_000
"""Text indexed per step (a tool result longer than this is searchable in its first part only)."""
MARK_START, MARK_END = "\x02", "\x03"
"""Around each matched word in :attr:`SearchHit.snippet` (never in indexed text: removed from it)."""
STEPS_PER_WRITE = 48
"""Steps indexed per write transaction at most (a longer session is one transaction of its own):
short transactions keep the gateway's commits from waiting on the index (benchmarks/search_bench.py)."""
SKIP_KEYS = frozenset(
    {
        "role",
        "type",
        "id",
        "tool_call_id",
        "call_id",
        "signature",
        "encrypted_content",
        "cache_control",
        "index",
        "status",
        "object",
    }
)
"""JSON keys whose string values are not indexed (ids, roles, opaque blobs)."""


def index_path(store_file: Path) -> Path:
    """The SQLite file of the search index of the SQLite store ``store_file``: ``x.db`` ->
    ``x.search.db`` beside it."""
    return store_file.with_name(f"{store_file.stem}.search{store_file.suffix or '.db'}")


def _writable(index_file: Path) -> bool:
    """Whether the index file can be made or written where it belongs (beside the store)."""
    if index_file.exists():
        return os.access(index_file, os.W_OK) and os.access(index_file.parent, os.W_OK)
    return os.access(index_file.parent, os.W_OK)


@dataclass(frozen=True)
class SearchHit:
    """One matching step: its session, ``seq`` and job, and a snippet of its text with each
    matched word between :data:`MARK_START` and :data:`MARK_END` (the text is raw: escape it)."""

    session_id: str
    seq: int
    job_id: str | None
    snippet: str


@dataclass(frozen=True)
class SearchPage:
    """A page of hits (best first), whether more follow, and the sessions not indexed yet."""

    hits: list[SearchHit]
    more: bool
    pending: int


def _strings(value: Any, out: list[str]) -> None:
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            if k not in SKIP_KEYS:
                _strings(v, out)
    elif isinstance(value, list):
        for v in value:
            _strings(v, out)


def _clean(s: str) -> str:
    """Indexable text: NUL and the marks replaced by spaces, each lone surrogate (no UTF-8 carries
    it) by U+FFFD (``wire.text.display_text``)."""
    return display_text(s.replace("\x00", " ").replace(MARK_START, " ").replace(MARK_END, " "))


def step_texts(steps: Sequence[dict[str, Any]]) -> list[str]:
    """The indexed text of each step of one session (decoded rows in ``seq`` order): the messages
    that are not a repeat of the previous step's messages and answer, then the answer."""
    out: list[str] = []
    previous: list[Any] = []
    for row in steps:
        messages = row.get("messages")
        messages = messages if isinstance(messages, list) else []
        same = 0
        while same < min(len(previous), len(messages)) and previous[same] == messages[same]:
            same += 1
        parts: list[str] = []
        answer = answer_items(row.get("response"))
        _strings(messages[same:], parts)
        _strings(answer, parts)
        previous = [*messages, *answer]  # the next step re-sends the answer too
        out.append(_clean("\n".join(parts))[:MAX_STEP_CHARS])
    return out


def fts5_query(words: str) -> str:
    """The FTS5 query matching every word of ``words`` (each a quoted term: no operator, column
    filter or prefix syntax of the user's reaches FTS5)."""
    return " ".join('"' + w.replace('"', '""') + '"' for w in words.split())


class StepSearch:
    """The search index of one store: :meth:`ensure`, :meth:`refresh`, :meth:`search`; writes one
    transaction per :data:`STEPS_PER_WRITE` steps at most. The caller closes it."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.dialect = engine.dialect.name
        url = engine.url.render_as_string(hide_password=False)
        store_file = sqlite_path(url)
        self.index_file = None if store_file is None else index_path(store_file)
        self.temp_dir: Path | None = None
        if self.index_file is not None and not _writable(self.index_file):
            self.temp_dir = Path(tempfile.mkdtemp(prefix="rollout-search-"))
            self.index_file = self.temp_dir / self.index_file.name
            log.warning(
                "search: %s cannot be written; the index is built in %s (removed at close)",
                index_path(store_file) if store_file else None,
                self.temp_dir,
            )
        self._index_url = url if self.index_file is None else f"sqlite+aiosqlite:///{self.index_file}"
        self._writer: AsyncEngine | None = None
        self._reader: AsyncEngine | None = None
        self._lock = asyncio.Lock()
        self._indexed_at: tuple[int, int] | None = None  # _signature() when every session was indexed

    def _write_engine(self) -> AsyncEngine:
        if self._writer is None:
            self._writer = make_engine(self._index_url, writer=True)
        return self._writer

    def _read_engine(self) -> AsyncEngine:
        if self.index_file is None:
            return self.engine
        if self._reader is None:
            self._reader = make_engine(self._index_url, writer=False)
        return self._reader

    async def close(self) -> None:
        """Dispose of the index's engines; remove a temporary index."""
        for eng in (self._writer, self._reader):
            if eng is not None:
                await eng.dispose()
        self._writer = self._reader = None
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir)
            self.temp_dir = None

    async def ensure(self) -> None:
        """Create the index tables when missing."""
        if self.dialect == "sqlite":
            ddl = [
                f"CREATE VIRTUAL TABLE IF NOT EXISTS {INDEX_TABLE} USING fts5("
                "body, session_id UNINDEXED, seq UNINDEXED, job_id UNINDEXED, tokenize='unicode61')"
            ]
        else:
            ddl = [
                f"CREATE TABLE IF NOT EXISTS {INDEX_TABLE} (session_id TEXT NOT NULL, seq INTEGER NOT NULL, "
                "job_id TEXT, body TEXT NOT NULL, tsv TSVECTOR NOT NULL, PRIMARY KEY (session_id, seq))",
                f"CREATE INDEX IF NOT EXISTS ix_{INDEX_TABLE}_tsv ON {INDEX_TABLE} USING GIN (tsv)",
            ]
        ddl.append(
            f"CREATE TABLE IF NOT EXISTS {BOOK_TABLE} (session_id TEXT PRIMARY KEY, steps INTEGER NOT NULL, "
            "max_seq INTEGER NOT NULL, last_record TEXT NOT NULL)"
        )
        async with self._write_engine().begin() as conn:
            for stmt in ddl:
                await conn.execute(text(stmt))

    async def _state(self) -> tuple[dict[str, tuple[int, int, str]], dict[str, tuple[int, int, str]]]:
        stmt = select(
            ST.c.session_id,
            func.count().label("n"),
            func.max(ST.c.seq).label("m"),
            func.max(ST.c.record_id).label("r"),
        ).group_by(ST.c.session_id)
        async with self.engine.connect() as conn:
            live = {r.session_id: (int(r.n), int(r.m), str(r.r)) for r in (await conn.execute(stmt)).all()}
        async with self._read_engine().connect() as conn:
            book = {
                r.session_id: (int(r.steps), int(r.max_seq), str(r.last_record))
                for r in (
                    await conn.execute(
                        text(f"SELECT session_id, steps, max_seq, last_record FROM {BOOK_TABLE}")
                    )
                ).all()
            }
        return live, book

    async def _signature(self) -> tuple[int, int]:
        """(steps, SQLite's largest rowid): equal to an earlier value when no step was added or
        removed since (the cheap check before comparing every session)."""
        last = "max(rowid)" if self.dialect == "sqlite" else "0"
        async with self.engine.connect() as conn:
            row = (await conn.execute(text(f"SELECT count(*), coalesce({last}, 0) FROM {ST.name}"))).one()
        return int(row[0]), int(row[1])

    async def pending(self) -> int:
        """Sessions whose steps changed since they were indexed (or were never indexed), plus
        indexed sessions whose steps are gone."""
        if self._indexed_at is not None and await self._signature() == self._indexed_at:
            return 0
        live, book = await self._state()
        return sum(1 for sid, v in live.items() if book.get(sid) != v) + len(book.keys() - live.keys())

    async def refresh(self, max_sessions: int | None = None, *, wait: bool = True) -> int | None:
        """Index the sessions that changed (at most ``max_sessions``, None: all); returns the
        number of sessions still to index after this call. One refresh runs at a time: with
        ``wait`` false, a call while another runs returns None at once."""
        if not wait and self._lock.locked():
            return None
        async with self._lock:
            signature = await self._signature()
            if signature == self._indexed_at:
                return 0
            live, book = await self._state()
            changed = sorted(sid for sid, v in live.items() if book.get(sid) != v)
            gone = sorted(book.keys() - live.keys())
            todo = changed if max_sessions is None else changed[:max_sessions]
            for i in range(0, len(gone), 500):
                await self._write([], gone[i : i + 500])
            batch: list[str] = []
            steps = 0
            for sid in todo:
                if batch and steps + live[sid][0] > STEPS_PER_WRITE:
                    await self._index(batch, {b: live[b] for b in batch})
                    batch, steps = [], 0
                batch.append(sid)
                steps += live[sid][0]
            if batch:
                await self._index(batch, {b: live[b] for b in batch})
            left = len(changed) - len(todo)
            self._indexed_at = signature if left == 0 else None
            return left

    async def _index(self, sids: list[str], marks: dict[str, tuple[int, int, str]]) -> None:
        async with self.engine.connect() as conn:
            rows = [
                dict(r._mapping)
                for r in (
                    await conn.execute(
                        select(ST).where(ST.c.session_id.in_(sids)).order_by(ST.c.session_id, ST.c.seq)
                    )
                ).all()
            ]
        if rows and "encoding" in rows[0]:
            decode_rows(rows)
        by_sid: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            by_sid.setdefault(r["session_id"], []).append(r)
        entries: list[dict[str, Any]] = []
        books: list[dict[str, Any]] = []
        for sid in sids:
            steps = by_sid.get(sid, [])
            for row, body in zip(steps, step_texts(steps), strict=True):
                entries.append({"sid": sid, "seq": int(row["seq"]), "job": row.get("job_id"), "body": body})
            if steps:  # a session whose steps moved meanwhile is indexed at the next refresh
                mark = (
                    len(steps),
                    max(int(s["seq"]) for s in steps),
                    max(str(s["record_id"]) for s in steps),
                )
                same = mark == marks[sid]
                books.append(
                    {
                        "sid": sid,
                        "n": mark[0] if same else -1,
                        "m": mark[1] if same else -1,
                        "r": mark[2] if same else "",
                    }
                )
        await self._write(entries, sids, books)

    async def _write(
        self, entries: list[dict[str, Any]], drop: list[str], books: list[dict[str, Any]] | None = None
    ) -> None:
        if not drop and not entries:
            return
        if self.dialect == "sqlite":
            insert = (
                f"INSERT INTO {INDEX_TABLE} (body, session_id, seq, job_id) VALUES (:body, :sid, :seq, :job)"
            )
        else:
            insert = (
                f"INSERT INTO {INDEX_TABLE} (session_id, seq, job_id, body, tsv) "
                "VALUES (:sid, :seq, :job, :body, to_tsvector('simple', :body))"
            )
        async with self._write_engine().begin() as conn:
            for i in range(0, len(drop), 500):
                part = {f"s{k}": sid for k, sid in enumerate(drop[i : i + 500])}
                names = ", ".join(f":{k}" for k in part)
                await conn.execute(text(f"DELETE FROM {INDEX_TABLE} WHERE session_id IN ({names})"), part)
                await conn.execute(text(f"DELETE FROM {BOOK_TABLE} WHERE session_id IN ({names})"), part)
            if entries:
                await conn.execute(text(insert), entries)
            if books:
                await conn.execute(
                    text(
                        f"INSERT INTO {BOOK_TABLE} (session_id, steps, max_seq, last_record) "
                        "VALUES (:sid, :n, :m, :r)"
                    ),
                    books,
                )

    async def search(
        self, words: str, *, job_id: str | None = None, offset: int = 0, limit: int = 50
    ) -> SearchPage:
        """Steps whose text holds every word of ``words`` (best match first: FTS5's bm25, else
        ``ts_rank``; then session and ``seq``), of ``job_id`` when given; ``pending`` counts the
        sessions not indexed yet (call :meth:`refresh` first)."""
        words = display_text(words)
        if not words.split():
            return SearchPage(hits=[], more=False, pending=0)
        params: dict[str, Any] = {"lim": limit + 1, "off": max(0, offset)}
        where_job = ""
        if job_id is not None:
            params["job"], where_job = job_id, " AND job_id = :job"
        if self.dialect == "sqlite":
            params["q"] = fts5_query(words)
            sql = (
                f"SELECT session_id, seq, job_id, snippet({INDEX_TABLE}, 0, '{MARK_START}', '{MARK_END}', '…', 24) "
                f"AS snip FROM {INDEX_TABLE} WHERE {INDEX_TABLE} MATCH :q{where_job} "
                "ORDER BY bm25(step_search), session_id, seq LIMIT :lim OFFSET :off"
            )
        else:
            params["q"] = words
            sql = (
                f"SELECT session_id, seq, job_id, ts_headline('simple', body, q, "
                f"'StartSel={MARK_START}, StopSel={MARK_END}, MaxWords=30, MinWords=10, MaxFragments=2, "
                'FragmentDelimiter=" … "\') AS snip '
                f"FROM {INDEX_TABLE}, plainto_tsquery('simple', :q) AS q WHERE tsv @@ q{where_job} "
                "ORDER BY ts_rank(tsv, q) DESC, session_id, seq LIMIT :lim OFFSET :off"
            )
        async with self._read_engine().connect() as conn:
            rows = (await conn.execute(text(sql), params)).all()
        hits = [
            SearchHit(session_id=r.session_id, seq=int(r.seq), job_id=r.job_id, snippet=r.snip or "")
            for r in rows[:limit]
        ]
        return SearchPage(hits=hits, more=len(rows) > limit, pending=await self.pending())
