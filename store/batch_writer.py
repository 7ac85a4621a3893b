"""The gateway's batch writer: its recorded steps (``session_steps``) and session snapshots
(``gateway_sessions``), many in one transaction (``gateway.recorder`` through
:meth:`store.Store.write_batch` and :meth:`store.Store.commit_now`).

SQLite: plain ``sqlite3`` on one connection in one worker thread, with values bound exactly as
SQLAlchemy binds them (the same rows either way), and a small batch committed inline when the
write lock is free at once. PostgreSQL: SQLAlchemy Core ``executemany``. Gateways that share
sessions lower ``in_flight`` in the same transaction (``store.gateway_sessions``).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import cache
from typing import Any, TypeVar

from sqlalchemy import Table, insert
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Dialect
from sqlmodel import SQLModel

from store.connections import Connections
from store.engine import BUSY_TIMEOUT_MS, SQLITE_PAGE_SIZE
from store.gateway_sessions import SESSION_COLUMNS, release_pg, release_sqlite
from store.models import GatewaySession, SessionStep
from store.stepcodec import pack

log = logging.getLogger(__name__)
_T = TypeVar("_T")

_ST: Table = SessionStep.__table__  # type: ignore[attr-defined]
_GS: Table = GatewaySession.__table__  # type: ignore[attr-defined]
_STEP_COLUMNS = tuple(c.name for c in _ST.columns)

StepRow = SessionStep | Mapping[str, Any]
"""A step to write: a :class:`SessionStep` or a plain dict of every column (:func:`store.models.step_record`)."""
SessionRow = GatewaySession | Mapping[str, Any]
"""A gateway session state to write: a :class:`GatewaySession` or a plain dict of every column."""


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


_STEP_INSERT_SQL = (
    f"INSERT INTO {_q(_ST.name)} ({', '.join(map(_q, _STEP_COLUMNS))}) "
    f"VALUES ({', '.join('?' * len(_STEP_COLUMNS))})"
)
_SESSION_UPSERT_SQL = (
    f"INSERT INTO {_q(_GS.name)} ({', '.join(map(_q, SESSION_COLUMNS))}) "
    f"VALUES ({', '.join('?' * len(SESSION_COLUMNS))}) ON CONFLICT ({_q('session_id')}) DO UPDATE SET "
    + ", ".join(
        f"{_q(c)} = excluded.{_q(c)}" for c in SESSION_COLUMNS if c not in ("session_id", "created_at")
    )
)


@cache
def _session_upsert(dialect_name: str) -> Any:
    """``INSERT INTO gateway_sessions ... ON CONFLICT (session_id) DO UPDATE`` (every column but
    the key and ``created_at``), for executemany; the Core twin of :data:`_SESSION_UPSERT_SQL`."""
    stmt = (sqlite_insert if dialect_name == "sqlite" else pg_insert)(_GS)
    return stmt.on_conflict_do_update(
        index_elements=["session_id"],
        set_={c: stmt.excluded[c] for c in SESSION_COLUMNS if c not in ("session_id", "created_at")},
    )


def _as_dict(obj: SQLModel | Mapping[str, Any], names: tuple[str, ...]) -> Mapping[str, Any]:
    """The column values of a table object as a plain dict (cheaper than ``model_dump``)."""
    return obj if isinstance(obj, Mapping) else {n: getattr(obj, n) for n in names}


def _rows(
    steps: Sequence[StepRow], sessions: Iterable[SessionRow]
) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """The batch as dicts: every step, and the last snapshot of each session (callers queue
    snapshots in order)."""
    latest: dict[str, Mapping[str, Any]] = {}
    for gs in sessions:
        row = _as_dict(gs, SESSION_COLUMNS)
        latest[row["session_id"]] = row
    return [_as_dict(st, _STEP_COLUMNS) for st in steps], list(latest.values())


_RowFn = Callable[[Mapping[str, Any]], tuple[Any, ...]]


def _row_converter(table: Table, dialect: Dialect) -> _RowFn:
    """A function turning a row (a dict of every column) into the tuple of its column values,
    each converted exactly as SQLAlchemy binds it on this dialect (the column type's own bind
    processor: JSON via the engine's ``json_serializer`` with None stored as the JSON text
    ``'null'`` as the ``JSON(none_as_null=False)`` columns do, booleans as 0/1, datetimes in
    SQLite's DATETIME storage format with the tzinfo dropped, not converted), so rows read back
    identically either way. Raises KeyError for a missing column."""
    procs = tuple((c.name, c.type.dialect_impl(dialect).bind_processor(dialect)) for c in table.columns)

    def convert(row: Mapping[str, Any]) -> tuple[Any, ...]:
        return tuple([row[n] if p is None else p(row[n]) for n, p in procs])

    return convert


def _log_checkpoint_failure(fut: Future[None]) -> None:
    if not fut.cancelled() and (e := fut.exception()) is not None:
        log.warning("passive WAL checkpoint failed: %s: %s", type(e).__name__, e)


class SqliteBatchWriter:
    """ONE plain ``sqlite3`` connection, opened, used and closed by ONE worker thread; one thread
    hop per batch, ``BEGIN IMMEDIATE`` + two executemany + ``COMMIT``.

    A small batch may instead be committed inline, on the caller's (event loop) thread, through
    a second connection that never waits: ``busy_timeout`` 0, so when another connection or
    process holds the write lock it fails at once with ``SQLITE_BUSY`` and the batch goes to
    the worker thread as usual (which waits up to the store's busy timeout). That saves the two
    thread hops (~0.1-0.3 ms) at low load, when the loop has nothing else to do. The inline
    connection never checkpoints (``wal_autocheckpoint=0``, a checkpoint can fsync for
    milliseconds); every :data:`INLINE_CHECKPOINT_EVERY` inline commits a passive checkpoint
    runs in the worker thread instead."""

    INLINE_CHECKPOINT_EVERY = 500

    def __init__(self, path: str, dialect: Dialect) -> None:
        self.path = path
        self._step_row = _row_converter(_ST, dialect)
        self._session_row = _row_converter(_GS, dialect)
        self._executor: ThreadPoolExecutor | None = None
        self._con: sqlite3.Connection | None = None  # only touched in the worker thread
        self._inline_con: sqlite3.Connection | None = None  # only touched on the event loop thread
        self._inline_commits = 0

    def _connect(
        self, *, busy_timeout_ms: int = BUSY_TIMEOUT_MS, autocheckpoint: bool = True
    ) -> sqlite3.Connection:
        con = sqlite3.connect(self.path, timeout=busy_timeout_ms / 1000, isolation_level=None)
        try:
            con.execute(
                f"PRAGMA page_size={SQLITE_PAGE_SIZE}"
            )  # a new file only: before WAL writes its header
            con.execute("PRAGMA journal_mode=WAL")
            con.execute(f"PRAGMA busy_timeout={busy_timeout_ms}")
            con.execute("PRAGMA synchronous=NORMAL")
            if not autocheckpoint:
                con.execute("PRAGMA wal_autocheckpoint=0")
        except BaseException:
            con.close()
            raise
        return con

    @staticmethod
    def _transaction(con: sqlite3.Connection, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        """``fn(con)`` between ``BEGIN IMMEDIATE`` and ``COMMIT`` (``ROLLBACK`` when it raises)."""
        con.execute("BEGIN IMMEDIATE")
        try:
            result = fn(con)
        except BaseException:
            if con.in_transaction:
                con.execute("ROLLBACK")
            raise
        con.execute("COMMIT")
        return result

    def _commit_on(
        self,
        con: sqlite3.Connection,
        steps: list[Mapping[str, Any]],
        sessions: list[Mapping[str, Any]],
        release: bool = False,
    ) -> None:
        session_rows = [self._session_row(gs) for gs in sessions]
        packed = [pack(st) for st in steps]  # compressed here, in the writer, before taking the lock

        def write(con: sqlite3.Connection) -> None:
            rows = release_sqlite(con, packed) if release else packed
            step_rows = [self._step_row(st) for st in rows]
            if session_rows:
                con.executemany(_SESSION_UPSERT_SQL, session_rows)
            if step_rows:
                con.executemany(_STEP_INSERT_SQL, step_rows)

        self._transaction(con, write)

    def _worker_con(self) -> sqlite3.Connection:
        con = self._con
        if con is None:
            con = self._con = self._connect()
        return con

    def _commit(
        self, steps: list[Mapping[str, Any]], sessions: list[Mapping[str, Any]], release: bool
    ) -> None:
        self._commit_on(self._worker_con(), steps, sessions, release)

    async def run(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        """``fn(connection)`` in a write transaction of its own, in the worker thread (after the
        batches submitted before it): the shared sessions' reservation."""
        return await asyncio.get_running_loop().run_in_executor(
            self._pool(), lambda: self._transaction(self._worker_con(), fn)
        )

    def _checkpoint(self) -> None:
        self._worker_con().execute("PRAGMA wal_checkpoint(PASSIVE)")

    def _try_inline(self, steps: list[Mapping[str, Any]], sessions: list[Mapping[str, Any]]) -> bool:
        """Commit on this thread if the write lock is free at once; False when it is not."""
        con = self._inline_con
        if con is None:
            con = self._inline_con = self._connect(busy_timeout_ms=0, autocheckpoint=False)
        try:
            self._commit_on(con, steps, sessions)
        except sqlite3.OperationalError as e:
            if e.sqlite_errorcode in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
                return False
            raise
        self._inline_commits += 1
        if self._inline_commits >= self.INLINE_CHECKPOINT_EVERY:
            self._inline_commits = 0
            fut = self._pool().submit(self._checkpoint)
            fut.add_done_callback(_log_checkpoint_failure)
        return True

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store-writer")
        return self._executor

    def commit_now(self, steps: Sequence[StepRow], sessions: Iterable[SessionRow]) -> bool:
        """Commit inline if the write lock is free at once (see the class docstring)."""
        step_rows, session_rows = _rows(steps, sessions)
        if not step_rows and not session_rows:
            return True
        return self._try_inline(step_rows, session_rows)

    async def write(
        self, steps: Sequence[StepRow], sessions: Iterable[SessionRow], release: bool = False
    ) -> None:
        """Write one batch in the worker thread (SQLModel objects are first copied to dicts here,
        on the caller's thread: they are not shared)."""
        step_rows, session_rows = _rows(steps, sessions)
        if not step_rows and not session_rows:
            return
        await asyncio.get_running_loop().run_in_executor(
            self._pool(), self._commit, step_rows, session_rows, release
        )

    def _close_connection(self) -> None:
        con, self._con = self._con, None
        if con is not None:
            con.close()

    def close_inline(self) -> None:
        """Close the inline connection (on the event loop thread, where it was opened)."""
        con, self._inline_con = self._inline_con, None
        if con is not None:
            con.close()

    async def close(self) -> None:
        """Close the inline connection, then the worker's connection in its thread, then stop the
        thread (waits for it)."""
        self.close_inline()
        executor, self._executor = self._executor, None
        if executor is None:
            return
        try:
            await asyncio.get_running_loop().run_in_executor(executor, self._close_connection)
        finally:
            executor.shutdown(wait=True)


class BatchWriter:
    """The batch writes of one store: :class:`SqliteBatchWriter` on SQLite, Core on the store's
    writer engine on PostgreSQL."""

    def __init__(self, db: Connections) -> None:
        self._db = db
        self.sqlite = (
            SqliteBatchWriter(db.path, db.writer.sync_engine.dialect) if db.path is not None else None
        )

    def commit_now(self, steps: Sequence[StepRow], sessions: Iterable[SessionRow]) -> bool:
        """Commit inline if that needs no waiting (SQLite, no batch of this store being written,
        the write lock free at once); False, having written nothing, otherwise."""
        w = self.sqlite
        if w is None or self._db.write_lock.locked():
            return False
        return w.commit_now(steps, sessions)

    async def write(self, steps: Sequence[StepRow], sessions: Iterable[SessionRow], *, release: bool) -> None:
        """Insert the steps and upsert the sessions (their last snapshots) in one transaction."""
        if self.sqlite is not None:
            async with self._db.write_lock:
                await self.sqlite.write(steps, sessions, release)
            return
        step_rows, session_rows = _rows(steps, sessions)
        step_rows = [pack(st) for st in step_rows]
        async with self._db.write_lock, self._db.writer.begin() as conn:
            if release:
                step_rows = await release_pg(conn, step_rows)
            if session_rows:
                await conn.execute(_session_upsert(self._db.kind), session_rows)
            if step_rows:
                await conn.execute(insert(_ST), step_rows)

    async def close(self) -> None:
        """Stop the SQLite writer's thread and close its connections."""
        if self.sqlite is not None:
            await self.sqlite.close()
