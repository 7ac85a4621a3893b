"""Every SQL statement of the project, behind one class.

``Store`` owns a writer engine (``BEGIN IMMEDIATE``, one connection for SQLite) and a reader engine.
Both the gateway and the launcher use it, each in its own process; SQLite WAL + busy_timeout make
the two processes' writes wait for each other instead of failing with "database is locked".
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from sqlalchemy import Connection, Table, bindparam, delete, insert, inspect, text, update
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session
from sqlalchemy.schema import CreateColumn
from sqlmodel import SQLModel, col, select

from store import job_lock
from store.engine import (
    BUSY_TIMEOUT_MS,
    SQLITE_PAGE_SIZE,
    hide_secrets,
    make_engine,
    make_sync_sqlite_engine,
    parse_db_url,
    redact_url,
    sqlite_path,
)
from store.feed import append_if_ready, backfill, unfinished_group
from store.group import GroupCommit, Op
from store.models import (
    GatewaySession,
    JobEnvironment,
    JobLock,
    SessionAttempt,
    SessionStatus,
    SessionStep,
    SessionWorkspace,
    attempt_session_id,
    utcnow,
)
from store.session_result import SessionResult
from store.stepcodec import decode_rows, pack

log = logging.getLogger(__name__)
_T = TypeVar("_T")

_STEP_COLUMNS = tuple(c.name for c in SessionStep.__table__.columns)  # type: ignore[attr-defined]
_SESSION_COLUMNS = tuple(c.name for c in GatewaySession.__table__.columns)  # type: ignore[attr-defined]


def _columns(obj: SQLModel, names: tuple[str, ...]) -> dict[str, Any]:
    """The column values of a table object, as a plain dict (cheaper than ``model_dump``)."""
    return {n: getattr(obj, n) for n in names}


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


_STEP_INSERT_SQL = (
    f"INSERT INTO {_q(SessionStep.__tablename__)} ({', '.join(map(_q, _STEP_COLUMNS))}) "
    f"VALUES ({', '.join('?' * len(_STEP_COLUMNS))})"
)
_SESSION_UPSERT_SQL = (
    f"INSERT INTO {_q(GatewaySession.__tablename__)} ({', '.join(map(_q, _SESSION_COLUMNS))}) "
    f"VALUES ({', '.join('?' * len(_SESSION_COLUMNS))}) ON CONFLICT ({_q('session_id')}) DO UPDATE SET "
    + ", ".join(f"{_q(c)} = excluded.{_q(c)}" for c in _SESSION_COLUMNS if c not in ("session_id", "created_at"))
)

_SCHEMA_LOCK_KEY = 0x726F6C6C  # PostgreSQL advisory lock held while Store.init creates or upgrades tables

_RELEASE_SQL = (
    f"UPDATE {_q(GatewaySession.__tablename__)} SET in_flight = CASE WHEN in_flight > ? THEN in_flight - ? "
    "ELSE 0 END WHERE session_id = ? RETURNING status"
)


def _release_counts(steps: Sequence[Mapping[str, Any]]) -> list[tuple[str, int]]:
    """(session id, steps of it in the batch), sorted by session id: every writer takes the rows'
    locks in the same order, so two gateways' batches never deadlock."""
    counts: dict[str, int] = {}
    for st in steps:
        counts[st["session_id"]] = counts.get(st["session_id"], 0) + 1
    return sorted(counts.items())


def _mark_after_close(steps: list[Mapping[str, Any]], closed: set[str]) -> list[Mapping[str, Any]]:
    """Step rows of sessions already closed when they commit get ``meta_json.after_close`` and
    ``is_trainable = false`` (their close stopped waiting for them)."""
    if not closed:
        return steps
    out: list[Mapping[str, Any]] = []
    for st in steps:
        if st["session_id"] in closed:
            st = {**st, "meta_json": {**(st["meta_json"] or {}), "after_close": True}, "is_trainable": False}
        out.append(st)
    return out


_RowFn = Callable[[Mapping[str, Any]], tuple[Any, ...]]
StepRow = SessionStep | Mapping[str, Any]
"""A step to write: a :class:`SessionStep` or a plain dict of every column (:func:`store.models.step_record`)."""
SessionRow = GatewaySession | Mapping[str, Any]
"""A gateway session state to write: a :class:`GatewaySession` or a plain dict of every column."""


def _as_dict(obj: SQLModel | Mapping[str, Any], names: tuple[str, ...]) -> Mapping[str, Any]:
    return obj if isinstance(obj, Mapping) else _columns(obj, names)


_JE: Table = JobEnvironment.__table__  # type: ignore[attr-defined]
_SA: Table = SessionAttempt.__table__  # type: ignore[attr-defined]
_SW: Table = SessionWorkspace.__table__  # type: ignore[attr-defined]
_ST: Table = SessionStep.__table__  # type: ignore[attr-defined]
_COLUMN_OF: dict[type, tuple[tuple[str, str], ...]] = {}


def _column_values(obj: SQLModel) -> dict[str, Any]:
    """Column name -> value of a table model instance (``session_id`` is the column ``env_id``
    of some tables): what an ORM flush of ``obj`` would write."""
    names = _COLUMN_OF.get(type(obj))
    if names is None:
        names = tuple((a.key, a.columns[0].name) for a in inspect(type(obj)).mapper.column_attrs)
        _COLUMN_OF[type(obj)] = names
    return {c: getattr(obj, k) for k, c in names}


def _row_converter(table: Table, dialect: Dialect) -> _RowFn:
    """A function turning a row (a dict of every column) into the tuple of its column values,
    each converted exactly as SQLAlchemy binds it on this dialect (the column type's own bind
    processor: JSON via the engine's ``json_serializer`` with None stored as the JSON text
    ``'null'`` as the ``JSON(none_as_null=False)`` columns do, booleans as 0/1, datetimes in
    SQLite's DATETIME storage format with the tzinfo dropped, not converted), so rows read back
    identically either way. Raises KeyError for a missing column."""
    plan: list[tuple[str, Callable[[Any], Any] | None]] = []
    for c in table.columns:
        plan.append((c.name, c.type.dialect_impl(dialect).bind_processor(dialect)))
    procs = tuple(plan)

    def convert(row: Mapping[str, Any]) -> tuple[Any, ...]:
        return tuple([row[n] if p is None else p(row[n]) for n, p in procs])

    return convert


# The launcher's per-session statements, built once (the columns an UPDATE sets are the keys of
# the parameters it is run with; ``b_*`` are the WHERE values).
_UPDATE_JE = _JE.update().where(_JE.c.env_id == bindparam("b_sid"))
_LAST_STEP = (select(_ST.c.record_id, _ST.c.meta_json).where(_ST.c.session_id == bindparam("b_sid"))
              .order_by(_ST.c.seq.desc()).limit(1))
_FINISH_STEP = _ST.update().where(_ST.c.record_id == bindparam("b_rid"))
_TRAJECTORY = (select(SessionStep).where(col(SessionStep.session_id) == bindparam("b_sid"))
               .order_by(col(SessionStep.seq)))


_GS: Table = GatewaySession.__table__  # type: ignore[attr-defined]
_GATEWAY_SESSION = _GS.select().where(_GS.c.session_id == bindparam("b_sid"))
_SESSION_CONTEXT = (_JE.select().with_only_columns(_JE.c.job_id, _JE.c.env_name, _JE.c.group_id, _JE.c.max_steps,
                                                   _JE.c.llm_model)
                    .where(_JE.c.env_id == bindparam("b_sid")))
_POLICY_VERSIONS = select(_ST.c.policy_version).where(_ST.c.session_id == bindparam("b_sid")).distinct()


class SessionContext(NamedTuple):
    """What a gateway takes from the launcher's row of a session (``job_environments``):
    ``llm_model`` is the route the launcher runs the session on (the session is bound to it)."""

    job_id: str | None
    env_name: str | None
    group_id: str | None
    max_steps: int | None
    llm_model: str | None


def _gateway_session(conn: Connection, session_id: str) -> GatewaySession | None:
    row = conn.execute(_GATEWAY_SESSION, {"b_sid": session_id}).mappings().first()
    return GatewaySession(**row) if row is not None else None


def _check_columns(values: Mapping[str, Any]) -> None:
    """ValueError naming the keys that are not columns of ``job_environments`` (an UPDATE run
    with them would skip them silently)."""
    if unknown := sorted(k for k in values if k not in _JE.c or k == "env_id"):
        raise ValueError(f"job_environments has no column {', '.join(unknown)} (values: {sorted(values)})")


def _insert_new(conn: Connection, rows: list[dict[str, Any]]) -> int:
    """Insert the ``job_environments`` rows (column dicts) whose ``env_id`` is not taken; returns how many."""
    have = set(conn.execute(select(_JE.c.env_id).where(_JE.c.env_id.in_([r["env_id"] for r in rows]))).scalars())
    new = [r for r in rows if r["env_id"] not in have]
    if new:
        conn.execute(insert(_JE), new)
    return len(new)


_SQLITE_COUNTS = "CASE WHEN json_type(step_counts) = 'object' THEN step_counts ELSE '{}' END"
_SQLITE_RESERVE_SQL = (  # named parameters, run by the batch writer's own sqlite3 connection
    "UPDATE gateway_sessions SET total_steps = total_steps + 1, in_flight = in_flight + 1, "
    f"step_counts = json_set({_SQLITE_COUNTS}, :path, COALESCE(json_extract({_SQLITE_COUNTS}, :path), 0) + 1), "
    "status = 'active', updated_at = :now, route = COALESCE(route, :model) "
    "WHERE session_id = :sid AND status IN ('active', 'truncated', 'interrupted') "
    "AND (max_steps < 0 OR total_steps - refunded_steps < max_steps) AND (route IS NULL OR route = :model) "
    "RETURNING total_steps, json_extract(step_counts, :path), job_id, env_name, group_id"
)
_PG_COUNTS = ("CASE WHEN json_typeof(step_counts) = 'object' THEN step_counts::jsonb ELSE '{}'::jsonb END")
_PG_RESERVE_SQL = (  # asyncpg: $1 session id, $2 route key, $3 now
    "UPDATE gateway_sessions SET total_steps = total_steps + 1, in_flight = in_flight + 1, "
    f"step_counts = jsonb_set({_PG_COUNTS}, ARRAY[$2::text], "
    f"to_jsonb(COALESCE(({_PG_COUNTS} ->> $2::text)::int, 0) + 1))::json, "
    "status = 'active', updated_at = $3, route = COALESCE(route, $2::text) "
    "WHERE session_id = $1 AND status IN ('active', 'truncated', 'interrupted') "
    "AND (max_steps < 0 OR total_steps - refunded_steps < max_steps) AND (route IS NULL OR route = $2::text) "
    "RETURNING total_steps, (step_counts::jsonb ->> $2::text)::int, job_id, env_name, group_id"
)
_PG_LOCK_SESSIONS = text(
    "SELECT session_id FROM gateway_sessions WHERE session_id = ANY(CAST(:sids AS TEXT[])) "
    "ORDER BY session_id FOR UPDATE"
)
_PG_RELEASE_MANY = text(
    "UPDATE gateway_sessions AS g SET in_flight = GREATEST(g.in_flight - v.n, 0) "
    "FROM unnest(CAST(:sids AS TEXT[]), CAST(:ns AS INT[])) AS v(sid, n) "
    "WHERE g.session_id = v.sid RETURNING g.session_id, g.status"
)


def _release_stmt() -> Any:
    return text(_RELEASE_SQL.replace("?", ":n", 2).replace("?", ":sid"))


def is_unavailable(exc: BaseException) -> bool:
    """True when ``exc`` from a store call means the database as a whole failed (locked past the
    busy timeout, disk I/O, a lost connection: an OperationalError of sqlite3 or SQLAlchemy), as
    opposed to one row it refused (a constraint, a value it cannot store). PostgreSQL: a lost or
    refused connection (SQLAlchemy marks it ``connection_invalidated``; ``OSError`` from the
    driver's connect)."""
    if isinstance(exc, sqlite3.OperationalError | sa_exc.OperationalError | OSError):
        return True
    return isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated


def _log_checkpoint_failure(fut: Future[None]) -> None:
    if not fut.cancelled() and (e := fut.exception()) is not None:
        log.warning("passive WAL checkpoint failed: %s: %s", type(e).__name__, e)


class StoreUnavailable(RuntimeError):
    """The database cannot be opened: a file that is not SQLite, a folder SQLite cannot write in,
    a PostgreSQL server that refuses the connection or the credentials."""


def _open_failure(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None)
    return f"{type(orig or exc).__name__}: {orig or exc}".strip()


class SchemaError(RuntimeError):
    """The database has a table of ours without a column this version needs, and the column
    cannot be added in place (NOT NULL without a server default)."""


def add_missing_columns(conn: Connection) -> list[str]:
    """Add to every table of ours the columns it lacks (``ALTER TABLE ... ADD COLUMN``, with the
    column's server default), so a database written by an older version keeps working. Returns
    the ``table.column`` names added. Raises SchemaError for a missing NOT NULL column without a
    server default (no value for the existing rows)."""
    insp = inspect(conn)
    existing_tables = set(insp.get_table_names())
    added: list[str] = []
    for table in SQLModel.metadata.sorted_tables:
        if table.name not in existing_tables:
            continue
        have = {c["name"] for c in insp.get_columns(table.name)}
        for column in table.columns:
            if column.name in have:
                continue
            if not column.nullable and column.server_default is None:
                raise SchemaError(f"table {table.name} has no column {column.name} (NOT NULL, no default): "
                                  "this database was made by an incompatible version")
            ddl = CreateColumn(column).compile(dialect=conn.dialect)
            conn.execute(text(f"ALTER TABLE {_q(table.name)} ADD COLUMN {ddl}"))
            added.append(f"{table.name}.{column.name}")
    return added


class _SqliteBatchWriter:
    """``write_batch`` for SQLite: ONE plain ``sqlite3`` connection, opened, used and closed by ONE
    worker thread; one thread hop per batch, ``BEGIN IMMEDIATE`` + two executemany + ``COMMIT``.

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
        self._step_row = _row_converter(SessionStep.__table__, dialect)  # type: ignore[attr-defined]
        self._session_row = _row_converter(GatewaySession.__table__, dialect)  # type: ignore[attr-defined]
        ts = GatewaySession.__table__.c.updated_at.type  # type: ignore[attr-defined]
        self._now: Callable[[Any], Any] = ts.dialect_impl(dialect).bind_processor(dialect) or (lambda v: v)
        self._executor: ThreadPoolExecutor | None = None
        self._con: sqlite3.Connection | None = None  # only touched in the worker thread
        self._inline_con: sqlite3.Connection | None = None  # only touched on the event loop thread
        self._inline_commits = 0

    def _connect(self, *, busy_timeout_ms: int = BUSY_TIMEOUT_MS, autocheckpoint: bool = True) -> sqlite3.Connection:
        con = sqlite3.connect(self.path, timeout=busy_timeout_ms / 1000, isolation_level=None)
        try:
            con.execute(f"PRAGMA page_size={SQLITE_PAGE_SIZE}")  # a new file only: before WAL writes its header
            con.execute("PRAGMA journal_mode=WAL")
            con.execute(f"PRAGMA busy_timeout={busy_timeout_ms}")
            con.execute("PRAGMA synchronous=NORMAL")
            if not autocheckpoint:
                con.execute("PRAGMA wal_autocheckpoint=0")
        except BaseException:
            con.close()
            raise
        return con

    def _commit_on(self, con: sqlite3.Connection, steps: list[Mapping[str, Any]],
                   sessions: list[Mapping[str, Any]], release: bool = False) -> None:
        session_rows = [self._session_row(gs) for gs in sessions]
        steps = [pack(st) for st in steps]  # compressed here, in the writer, before taking the lock
        con.execute("BEGIN IMMEDIATE")
        try:
            if release:
                closed = {sid for sid, n in _release_counts(steps)
                          if (r := con.execute(_RELEASE_SQL, (n, n, sid)).fetchone()) is not None and r[0] == "closed"}
                steps = _mark_after_close(steps, closed)
            step_rows = [self._step_row(st) for st in steps]
            if session_rows:
                con.executemany(_SESSION_UPSERT_SQL, session_rows)
            if step_rows:
                con.executemany(_STEP_INSERT_SQL, step_rows)
        except BaseException:
            if con.in_transaction:
                con.execute("ROLLBACK")
            raise
        con.execute("COMMIT")

    def _commit(self, steps: list[Mapping[str, Any]], sessions: list[Mapping[str, Any]], release: bool) -> None:
        con = self._con
        if con is None:
            con = self._con = self._connect()
        self._commit_on(con, steps, sessions, release)

    def _reserve(self, sid: str, model: str, path: str) -> tuple[Any, ...] | None:
        con = self._con
        if con is None:
            con = self._con = self._connect()
        con.execute("BEGIN IMMEDIATE")
        try:
            row = con.execute(_SQLITE_RESERVE_SQL, {"sid": sid, "model": model, "path": path,
                                                    "now": self._now(utcnow())}).fetchone()
        except BaseException:
            if con.in_transaction:
                con.execute("ROLLBACK")
            raise
        con.execute("COMMIT")
        return tuple(row) if row is not None else None

    async def reserve(self, sid: str, model: str, path: str) -> tuple[Any, ...] | None:
        """:data:`_SQLITE_RESERVE_SQL` in its own transaction, in the worker thread (after the
        batches submitted before it)."""
        return await asyncio.get_running_loop().run_in_executor(self._pool(), self._reserve, sid, model, path)

    def _checkpoint(self) -> None:
        con = self._con
        if con is None:
            con = self._con = self._connect()
        con.execute("PRAGMA wal_checkpoint(PASSIVE)")

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

    @staticmethod
    def _rows(steps: Sequence[StepRow], sessions: Iterable[SessionRow]
              ) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
        latest: dict[str, Mapping[str, Any]] = {}
        for gs in sessions:
            latest[gs["session_id"] if isinstance(gs, Mapping) else gs.session_id] = _as_dict(gs, _SESSION_COLUMNS)
        return [_as_dict(st, _STEP_COLUMNS) for st in steps], list(latest.values())

    def commit_now(self, steps: Sequence[StepRow], sessions: Iterable[SessionRow]) -> bool:
        """Commit inline if the write lock is free at once (see the class docstring)."""
        step_rows, session_rows = self._rows(steps, sessions)
        if not step_rows and not session_rows:
            return True
        return self._try_inline(step_rows, session_rows)

    async def write(self, steps: Sequence[StepRow], sessions: Iterable[SessionRow], release: bool = False) -> None:
        """Write one batch in the worker thread (SQLModel objects are first copied to dicts here,
        on the caller's thread: they are not shared)."""
        step_rows, session_rows = self._rows(steps, sessions)
        if not step_rows and not session_rows:
            return
        await asyncio.get_running_loop().run_in_executor(self._pool(), self._commit, step_rows, session_rows,
                                                         release)

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


class Store:
    """The trajectory store at one URL (``sqlite://PATH`` or ``postgresql://...``).

    Call ``await init()`` once (creates the tables if missing) and ``await close()`` at the end
    (disposes the engines, so no aiosqlite thread keeps the interpreter alive).
    """

    def __init__(self, url: str) -> None:
        self.user_url = url
        self.url = parse_db_url(url)
        self.writer: AsyncEngine = make_engine(self.url, writer=True)
        self.reader: AsyncEngine = make_engine(self.url, writer=False)
        self._write = async_sessionmaker(self.writer, expire_on_commit=False, class_=AsyncSession)
        self._read = async_sessionmaker(self.reader, expire_on_commit=False, class_=AsyncSession)
        self._write_lock = asyncio.Lock()
        self._group = GroupCommit(self._run_batch)  # the launcher's row writes (store.group)
        self._upsert_stmt: Any = None
        self._upserts: dict[tuple[str, bool], Any] = {}
        self._reserve_pool: Any = None  # asyncpg pool of reserve_step (PostgreSQL)
        self._reserve_pool_lock = asyncio.Lock()
        path = self.path
        self._sqlite_writer = (
            _SqliteBatchWriter(path, self.writer.sync_engine.dialect) if path is not None else None)
        self._sync_writer = make_sync_sqlite_engine(Path(path), writer=True) if path is not None else None
        self._sync_reader = make_sync_sqlite_engine(Path(path), writer=False) if path is not None else None
        self._group_thread: ThreadPoolExecutor | None = None

    @property
    def kind(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return "sqlite" if self.url.startswith("sqlite") else "postgresql"

    @property
    def path(self) -> str | None:
        """The SQLite file path (absolute), or None for PostgreSQL."""
        p = sqlite_path(self.url)
        return str(p) if p else None

    def identity(self) -> str:
        """A string naming the database, equal for two Store objects on the same database, with
        no credential in it (the absolute file path for SQLite; for PostgreSQL the URL without
        its user info and with credential parameters such as ``password`` as ``***``,
        :func:`store.engine.redact_url`). What is printed, logged and answered of the database."""
        if self.path:
            return f"sqlite://{self.path}"
        return "postgresql://" + redact_url(self.url, drop_user=True).split("://", 1)[1]

    def hide_secrets(self, text: str) -> str:
        """``text`` (e.g. a driver's error) with this store URL's credentials as ``***``."""
        return hide_secrets(text, self.user_url, self.url)

    def peer_url(self) -> str:
        """The URL another process (a gateway the launcher starts) opens the same database with:
        the absolute SQLite path, or the PostgreSQL URL as given (password included)."""
        return self.identity() if self.path else self.user_url

    async def init(self) -> None:
        """Create missing tables, and add the columns a database made by an older version lacks
        (:func:`add_missing_columns`). Idempotent; safe when two processes start at once.
        Raises SchemaError when a missing column cannot be added automatically, StoreUnavailable
        when the database cannot be opened (the reason in its message)."""
        try:
            async with self._write_lock, self.writer.begin() as conn:
                if self.kind == "postgresql":  # DDL of two processes starting at once, one after the other
                    await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _SCHEMA_LOCK_KEY})
                await conn.run_sync(SQLModel.metadata.create_all)
                added = await conn.run_sync(add_missing_columns)
        except (sa_exc.DBAPIError, sqlite3.Error, OSError) as e:
            raise StoreUnavailable(f"storage {self.identity()}: cannot open the database "
                                   f"({self.hide_secrets(_open_failure(e))})") from e
        for name in added:
            log.warning("store %s: added column %s (the database was made by an older version)",
                        self.identity(), name)

    def _group_executor(self) -> ThreadPoolExecutor:
        if self._group_thread is None:
            self._group_thread = ThreadPoolExecutor(1, thread_name_prefix="store-group")
        return self._group_thread

    def _sync_batch(self, ops: list[Op]) -> list[Any]:
        assert self._sync_writer is not None
        with Session(self._sync_writer, expire_on_commit=False) as s, s.begin():
            return [op(s) for op in ops]

    async def _run_batch(self, ops: list[Op]) -> list[Any]:
        """Run ``ops`` in one write transaction (``store.group``): for SQLite in one hop to a thread
        of its own with a sync connection, else through the async writer."""
        async with self._write_lock:
            if self._sync_writer is not None:
                return await asyncio.get_running_loop().run_in_executor(self._group_executor(), self._sync_batch, ops)
            async with self._write() as s, s.begin():
                return await s.run_sync(lambda sync: [op(sync) for op in ops])

    async def close(self) -> None:
        """Wait for queued row writes, close the SQLite batch writer's connection and stop its
        thread, then dispose both engines (closes every pooled connection)."""
        await self._group.aclose()
        if self._group_thread is not None:
            self._group_thread.shutdown(wait=True)
        for engine in (self._sync_writer, self._sync_reader):
            if engine is not None:
                engine.dispose()
        if self._sqlite_writer is not None:
            await self._sqlite_writer.close()
        pool, self._reserve_pool = self._reserve_pool, None
        if pool is not None:
            await pool.close()
        await self.writer.dispose()
        await self.reader.dispose()

    async def ping(self) -> None:
        """Run ``SELECT 1``; raises the driver's error when the database is unreachable."""
        async with self.reader.connect() as conn:
            await conn.execute(text("SELECT 1"))

    async def checkpoint(self) -> None:
        """Fold the SQLite WAL into the main file (``wal_checkpoint(TRUNCATE)``), so copying only
        the ``.db`` file loses nothing. No-op on PostgreSQL."""
        path = self.path
        if path is None:
            return

        def _checkpoint() -> None:
            con = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
            try:
                con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                con.close()

        await asyncio.to_thread(_checkpoint)

    # ------------------------------------------------------------------ gateway side
    async def _read_sync(self, fn: Callable[[Connection], _T]) -> _T:
        """``fn(connection)`` in one read transaction: on SQLite in one hop to the grouped writes'
        thread (between their transactions) on its sync reader connection, else on the async
        reader (``run_sync``)."""
        reader = self._sync_reader
        if reader is not None:
            def read() -> _T:
                with reader.connect() as conn:  # closing it ends the read transaction
                    return fn(conn)
            return await asyncio.get_running_loop().run_in_executor(self._group_executor(), read)
        async with self.reader.connect() as aconn:
            return await aconn.run_sync(fn)

    async def load_gateway_session(self, session_id: str) -> GatewaySession | None:
        """The persisted gateway state of a session, or None."""
        return await self._read_sync(lambda c: _gateway_session(c, session_id))

    async def gateway_session_or_context(
            self, session_id: str) -> tuple[GatewaySession | None, SessionContext | None]:
        """The persisted gateway state of a session, and when there is none what the launcher's
        row says of it (None as well when the session was not created by a launcher), in one read."""
        def read(c: Connection) -> tuple[GatewaySession | None, SessionContext | None]:
            st = _gateway_session(c, session_id)
            if st is not None:
                return st, None
            row = c.execute(_SESSION_CONTEXT, {"b_sid": session_id}).first()
            return None, (SessionContext(*row) if row is not None else None)
        return await self._read_sync(read)

    def commit_now(self, steps: Sequence[StepRow], sessions: Iterable[SessionRow]) -> bool:
        """Commit ``steps`` and ``sessions`` (as :meth:`write_batch`) synchronously on the calling
        thread if that needs no waiting: SQLite, no batch being written by this store, and the
        database's write lock free at once. Returns False, having written nothing, otherwise
        (always on PostgreSQL); raises the driver's error when the commit fails."""
        w = self._sqlite_writer
        if w is None or self._write_lock.locked():
            return False
        return w.commit_now(steps, sessions)

    async def write_batch(self, steps: Sequence[StepRow], sessions: Iterable[SessionRow], *,
                          release_in_flight: bool = False) -> None:
        """Insert step rows and upsert gateway session rows in ONE transaction (group commit).

        Sessions are upserted once each (the last snapshot of a session in the batch wins: callers
        queue snapshots in order); both statements run as one prepared ``executemany``.

        SQLite: plain ``sqlite3`` on one dedicated connection in one worker thread (one thread hop
        per batch); values are bound exactly as SQLAlchemy binds them, so SQLAlchemy reads see
        the same rows. On error the whole batch is rolled back and the ``sqlite3`` error raised.
        PostgreSQL: the SQLAlchemy Core path.

        A row is a table object or a plain dict of every column (:func:`store.models.step_record`;
        a session state as ``{column: value}``); dict rows must not be changed by the caller
        afterwards (they are read in the writer thread). :meth:`commit_now` is the inline path.
        A format-3 step row is compressed on the way (:func:`store.stepcodec.pack`): SQLite in the
        worker thread (inline: on the caller's thread), PostgreSQL on the caller's, where each
        row's JSON is serialized.

        ``release_in_flight`` (gateways sharing sessions, :meth:`change_gateway_session`): in the
        same transaction, each step's session gets ``in_flight`` lowered by one, and the steps of
        a session already ``closed`` then are stored with ``meta_json.after_close = true`` and
        ``is_trainable = false`` (its close stopped waiting for them)."""
        if self._sqlite_writer is not None:
            async with self._write_lock:
                await self._sqlite_writer.write(steps, sessions, release_in_flight)
            return
        latest: dict[str, Mapping[str, Any]] = {}
        for gs in sessions:
            row = _as_dict(gs, _SESSION_COLUMNS)
            latest[row["session_id"]] = row
        step_rows: list[Mapping[str, Any]] = [pack(_as_dict(st, _STEP_COLUMNS)) for st in steps]
        async with self._write_lock, self.writer.begin() as conn:
            if release_in_flight:
                counts = _release_counts(step_rows)
                sids, ns = [c[0] for c in counts], [c[1] for c in counts]
                # the rows' locks in session id order (no deadlock between two gateways' batches)
                await conn.execute(_PG_LOCK_SESSIONS, {"sids": sids})
                res = await conn.execute(_PG_RELEASE_MANY, {"sids": sids, "ns": ns})
                closed = {str(sid) for sid, status in res.all() if status == SessionStatus.CLOSED}
                step_rows = _mark_after_close(step_rows, closed)
            if latest:
                await conn.execute(self._session_upsert(), list(latest.values()))
            if step_rows:
                await conn.execute(insert(SessionStep.__table__), step_rows)  # type: ignore[attr-defined]

    async def mark_interrupted(self) -> int:
        """Mark every gateway session left ``active`` by an earlier gateway process as
        ``interrupted`` (a gateway that died mid-session leaves no session "running"
        for ever). Called at gateway start; the session's budget, step counts and step ids are
        kept, and its next call makes it ``active`` again. Returns how many were marked."""
        async with self._write_lock, self.writer.begin() as conn:
            res = await conn.execute(
                update(GatewaySession).where(col(GatewaySession.status) == "active")
                .values(status="interrupted", updated_at=utcnow()))
            return int(getattr(res, "rowcount", 0) or 0)

    # ------------------------------------------------------------------ gateways sharing sessions
    async def change_gateway_session(self, session_id: str, change: Callable[[GatewaySession], _T],
                                     create: Callable[[JobEnvironment | None], GatewaySession]) -> _T:
        """Read, change and write one ``gateway_sessions`` row in one transaction that holds the
        row's lock (PostgreSQL ``SELECT ... FOR UPDATE``; SQLite's write lock), so gateway
        processes sharing the store change a session one at a time. A missing row is made first
        by ``create(launcher's job_environments row or None)`` (inserted unless another process
        did it meanwhile). ``change`` mutates the state it gets and returns what this call
        returns; it runs inside the transaction (keep it short, no I/O); an exception from it
        rolls back."""
        async with self._write() as s, s.begin():
            st = await s.get(GatewaySession, session_id, with_for_update=True)
            if st is None:
                new = create(await s.get(JobEnvironment, session_id))
                ins = (sqlite_insert if self.kind == "sqlite" else pg_insert)(GatewaySession.__table__)  # type: ignore[attr-defined]
                await s.execute(ins.on_conflict_do_nothing(index_elements=["session_id"]),
                                [_columns(new, _SESSION_COLUMNS)])
                st = await s.get(GatewaySession, session_id, with_for_update=True, populate_existing=True)
                assert st is not None
            return change(st)

    async def reserve_step(self, session_id: str, model: str) -> tuple[int, int, str | None, str | None,
                                                                       str | None] | None:
        """The common reservation in ONE statement (PostgreSQL: ``UPDATE ... RETURNING`` on the
        session's row, which PostgreSQL re-checks under the row's lock): for a session row that
        exists, is ``active``/``truncated``/``interrupted``, is bound to route ``model`` (or to
        none yet: it is bound to ``model`` then) and has budget left, count the next
        step of route ``model`` (``total_steps``, ``step_counts``, ``in_flight``, status
        ``active``) and return ``(seq, step_id, job_id, env_name, group_id)``. None otherwise
        (and on SQLite for a route key holding ``"`` or ``\\``): the caller then takes
        :meth:`change_gateway_session`. SQLite: the same statement with ``json_set`` (the write
        transaction holds the file's lock), on the batch writer's connection and thread, so it
        never waits for this process's own batches' lock."""
        row: Any
        if self._sqlite_writer is not None:
            if '"' in model or "\\" in model:  # not expressible as a SQLite JSON path key
                return None
            row = await self._sqlite_writer.reserve(session_id, model, f'$."{model}"')
        else:
            row = await (await self._pg_reserve_pool()).fetchrow(_PG_RESERVE_SQL, session_id, model, utcnow())
        if row is None:
            return None
        return int(row[0]), int(row[1]), row[2], row[3], row[4]

    async def _pg_reserve_pool(self) -> Any:
        """A small asyncpg pool of its own for :meth:`reserve_step` (one statement per call in
        autocommit, without SQLAlchemy's per-execute cost on the hot path); made on first use."""
        if self._reserve_pool is None:
            async with self._reserve_pool_lock:  # the first calls come many at once
                if self._reserve_pool is None:
                    import asyncpg

                    dsn = "postgresql://" + self.url.split("://", 1)[1]
                    self._reserve_pool = await asyncpg.create_pool(dsn, min_size=1, max_size=8)
        return self._reserve_pool

    async def release_in_flight(self, session_id: str, n: int = 1) -> None:
        """Lower a session's ``in_flight`` by ``n`` (not below 0), for reserved steps whose row
        will never be written (the call ended without one, or its record was lost)."""
        async with self.writer.begin() as conn:
            await conn.execute(_release_stmt(), {"n": n, "sid": session_id})

    def _session_upsert(self) -> Any:
        """``INSERT INTO gateway_sessions ... ON CONFLICT (session_id) DO UPDATE`` (every column but
        the key and ``created_at``), for executemany; built once per store."""
        if self._upsert_stmt is None:
            dialect_insert = sqlite_insert if self.kind == "sqlite" else pg_insert  # PostgreSQL: untested
            stmt = dialect_insert(GatewaySession.__table__)  # type: ignore[attr-defined]
            self._upsert_stmt = stmt.on_conflict_do_update(
                index_elements=["session_id"],
                set_={c: stmt.excluded[c] for c in _SESSION_COLUMNS if c not in ("session_id", "created_at")})
        return self._upsert_stmt

    # ------------------------------------------------------------------ job locks
    async def take_job_lock(self, lock: JobLock, stale_after_s: float,
                            gone: Callable[[JobLock], bool]) -> JobLock | None:
        """Make ``lock`` (job, owner token, pid, host) the job's holder unless a live one holds it
        (:func:`store.job_lock.take`: a heartbeat within ``stale_after_s`` and not ``gone``);
        returns None when taken, else the holder."""
        now = utcnow()
        async with self._write_lock, self.writer.begin() as conn:
            return await conn.run_sync(job_lock.take, lock, now, now - timedelta(seconds=stale_after_s), gone)

    async def beat_job_lock(self, job_id: str, owner: str) -> bool:
        """Refresh ``owner``'s heartbeat on the job; False when it no longer holds it."""
        async with self._write_lock, self.writer.begin() as conn:
            return await conn.run_sync(job_lock.beat, job_id, owner, utcnow())

    async def release_job_lock(self, job_id: str, owner: str) -> None:
        """Drop ``owner``'s lock of the job."""
        async with self._write_lock, self.writer.begin() as conn:
            await conn.run_sync(job_lock.release, job_id, owner)

    # ------------------------------------------------------------------ launcher side
    async def add_job_sessions(self, rows: Iterable[JobEnvironment], chunk: int = 500) -> int:
        """Insert session rows that do not exist yet, in one transaction (Core inserts, ``chunk``
        rows per statement batch; ``rows`` may be a generator, never held whole); returns how
        many were inserted."""
        inserted = 0
        async with self._write_lock, self.writer.begin() as conn:
            batch: list[dict[str, Any]] = []
            for row in rows:
                batch.append(_column_values(row))
                if len(batch) >= chunk:
                    inserted += await conn.run_sync(_insert_new, batch)
                    batch = []
            if batch:
                inserted += await conn.run_sync(_insert_new, batch)
        return inserted

    async def reset_for_retry(self, session_id: str, attempt: int) -> int:
        """Prepare a session for its next attempt (a retry, or ``--resume``): the steps of attempt
        ``attempt`` are kept but moved to session id ``<session_id>~a<attempt>``
        (:func:`store.models.attempt_session_id`) and marked not trainable, and the gateway's
        state of the session is dropped so the budget starts afresh (call it once the gateway has
        answered the session's close). Returns the number of steps moved."""
        def op(s: Session) -> Any:
            res = s.execute(
                update(SessionStep).where(col(SessionStep.session_id) == session_id)
                .values(session_id=attempt_session_id(session_id, attempt), is_trainable=False)
            )
            s.execute(delete(GatewaySession).where(col(GatewaySession.session_id) == session_id))
            return int(getattr(res, "rowcount", 0) or 0)
        return int(await self._group.run(op))

    async def record_attempt(self, attempt: SessionAttempt, *, if_missing: bool = False) -> bool:
        """Write one attempt row (replacing the row of the same session and attempt number, or,
        with ``if_missing``, only when there is none). Returns whether it was written."""
        values = _column_values(attempt)
        stmt = self._upsert(_SA, replace=not if_missing)

        def op(s: Session) -> bool:
            return bool(s.connection().execute(stmt, values).rowcount)
        return await self._group.run(op)

    def _upsert(self, table: Table, *, replace: bool) -> Any:
        """``INSERT`` of every column of ``table`` that replaces the row with the same primary
        key (``replace``) or leaves it (else); built once per table."""
        key = (table.name, replace)
        stmt = self._upserts.get(key)
        if stmt is None:
            dialect_insert = sqlite_insert if self.kind == "sqlite" else pg_insert
            ins = dialect_insert(table)
            pk = [c.name for c in table.primary_key.columns]
            stmt = (ins.on_conflict_do_update(index_elements=pk, set_={c.name: ins.excluded[c.name]
                                                                      for c in table.columns if c.name not in pk})
                    if replace else ins.on_conflict_do_nothing(index_elements=pk))
            self._upserts[key] = stmt
        return stmt

    async def job_attempts(self, job_id: str) -> dict[str, list[SessionAttempt]]:
        """Every attempt row of a job: session id -> its attempts in order."""
        q = (select(SessionAttempt).where(col(SessionAttempt.job_id) == job_id)
             .order_by(col(SessionAttempt.session_id), col(SessionAttempt.attempt)))
        out: dict[str, list[SessionAttempt]] = {}
        async with self._read() as s:
            for a in (await s.execute(q)).scalars().all():
                out.setdefault(a.session_id, []).append(a)
        return out

    async def job_sessions(self, job_id: str, *, unfinished_only: bool = False) -> list[JobEnvironment]:
        """The session rows of a job, ordered by env, case, sample."""
        q = select(JobEnvironment).where(col(JobEnvironment.job_id) == job_id)
        if unfinished_only:
            q = q.where(col(JobEnvironment.finished).is_(False))
        q = q.order_by(col(JobEnvironment.env_name), col(JobEnvironment.case_id), col(JobEnvironment.sample_index))
        async with self._read() as s:
            return list((await s.execute(q)).scalars().all())

    async def job_exists(self, job_id: str) -> bool:
        """Whether the job has any session row."""
        q = select(_JE.c.env_id).where(_JE.c.job_id == job_id).limit(1)
        async with self.reader.connect() as conn:
            return (await conn.execute(q)).first() is not None

    async def job_session_ids(self, job_id: str, *, finished_only: bool = False) -> AsyncIterator[str]:
        """The session ids of a job in the order of :meth:`job_sessions` (env, case, sample),
        streamed (not read into memory at once)."""
        q = select(_JE.c.env_id).where(_JE.c.job_id == job_id)
        if finished_only:
            q = q.where(_JE.c.finished.is_(True))
        q = q.order_by(_JE.c.env_name, _JE.c.case_id, _JE.c.sample_index)
        async with self.reader.connect() as conn:
            result = await conn.stream(q)
            async for (sid,) in result:
                yield sid

    async def job_sessions_by_id(self, session_ids: Sequence[str]) -> list[JobEnvironment]:
        """The session rows of ``session_ids`` (unknown ones left out), in that order."""
        rows: dict[str, JobEnvironment] = {}
        async with self._read() as s:
            for i in range(0, len(session_ids), 500):
                q = select(JobEnvironment).where(col(JobEnvironment.session_id).in_(session_ids[i:i + 500]))
                rows.update((r.session_id, r) for r in (await s.execute(q)).scalars().all())
        return [rows[sid] for sid in session_ids if sid in rows]

    async def session_attempts(self, session_ids: Sequence[str]) -> dict[str, list[SessionAttempt]]:
        """The attempt rows of ``session_ids``: session id -> its attempts in order (sessions
        without any left out)."""
        out: dict[str, list[SessionAttempt]] = {}
        async with self._read() as s:
            for i in range(0, len(session_ids), 500):
                q = (select(SessionAttempt).where(col(SessionAttempt.session_id).in_(session_ids[i:i + 500]))
                     .order_by(col(SessionAttempt.session_id), col(SessionAttempt.attempt)))
                for a in (await s.execute(q)).scalars().all():
                    out.setdefault(a.session_id, []).append(a)
        return out

    async def update_job_session(self, session_id: str, **values: Any) -> None:
        """Set columns of one ``job_environments`` row."""
        _check_columns(values)
        params = {**values, "b_sid": session_id}

        def op(s: Session) -> None:
            s.connection().execute(_UPDATE_JE, params)
        await self._group.run(op)

    async def trajectory(self, session_id: str) -> list[SessionStep]:
        """Every recorded step of a session, in call order (``seq``), with every value in full
        (:func:`store.stepcodec.decode_rows`). On SQLite read in the grouped writes' thread (one
        hop, between their transactions)."""
        q, key = _TRAJECTORY, {"b_sid": session_id}
        if self._sync_reader is not None:
            reader = self._sync_reader

            def read() -> list[SessionStep]:
                with Session(reader, expire_on_commit=False) as s:  # closing it ends the read transaction
                    return list(s.execute(q, key).scalars().all())
            rows = await asyncio.get_running_loop().run_in_executor(self._group_executor(), read)
        else:
            async with self._read() as s:
                rows = list((await s.execute(q, key)).scalars().all())
        decode_rows(rows)
        return rows

    async def policy_versions(self, session_id: str) -> list[int | None]:
        """The distinct ``policy_version`` values of a session's steps, ascending, None (steps
        recorded before any version was set) first; empty when the session has no step."""
        found = set(await self._read_sync(
            lambda c: c.execute(_POLICY_VERSIONS, {"b_sid": session_id}).scalars().all()))
        return ([None] if None in found else []) + sorted(v for v in found if v is not None)

    async def policy_version_spans(self, job_id: str) -> dict[str, list[int | None]]:
        """The sessions of a job whose steps span more than one policy version (None counting as
        one): session id -> its distinct versions, as :meth:`policy_versions` orders them."""
        q = (select(SessionStep.session_id, SessionStep.policy_version).where(col(SessionStep.job_id) == job_id)
             .distinct())
        by_sid: dict[str, set[int | None]] = {}
        async with self._read() as s:
            for sid, version in (await s.execute(q)).all():
                by_sid.setdefault(sid, set()).add(version)
        return {sid: ([None] if None in vs else []) + sorted(v for v in vs if v is not None)
                for sid, vs in sorted(by_sid.items()) if len(vs) > 1}

    async def finish_job_session(self, session_id: str, result: SessionResult) -> None:
        """Finish a session in one transaction, writing its ``result`` to both tables: on the
        session's last step ``reward``/``step_reward`` (and ``result.evaluation`` into
        ``meta_json["evaluation"]``), marked terminal and session-completed; on its
        ``job_environments`` row the result's columns plus ``finished=True`` and ``finished_at``.
        When this finishes the last unfinished session of its group, the group's feed entry is
        appended in the same transaction (:func:`store.feed.append_if_ready`)."""
        values, reward, eval_meta = result.columns(), result.reward, result.evaluation

        def op(s: Session) -> None:
            conn = s.connection()
            group = unfinished_group(conn, session_id)
            last = conn.execute(_LAST_STEP, {"b_sid": session_id}).one_or_none()
            if last is not None:
                meta = dict(last.meta_json or {})
                if eval_meta is not None:
                    meta["evaluation"] = eval_meta
                conn.execute(_FINISH_STEP, {"b_rid": last.record_id, "reward": reward, "step_reward": reward,
                                            "is_terminal": True, "is_session_completed": True, "meta_json": meta})
            conn.execute(_UPDATE_JE, {**values, "finished": True, "finished_at": utcnow(), "b_sid": session_id})
            if group is not None:
                append_if_ready(conn, *group)
        await self._group.run(op)

    async def backfill_feed(self, job_id: str) -> int:
        """Append feed entries for the complete groups of a job recorded before the feed existed
        (:func:`store.feed.backfill`); returns how many."""
        return int(await self._group.run(lambda s: backfill(s, job_id)))

    # ------------------------------------------------------------------ kept workspaces, regrade
    async def save_workspace_archive(self, row: SessionWorkspace) -> None:
        """Insert the kept workspace of ``row.session_id``, replacing an earlier one (a new attempt
        of the session replaces what its earlier attempt left)."""
        values, stmt = _column_values(row), self._upsert(_SW, replace=True)

        def op(s: Session) -> None:
            s.connection().execute(stmt, values)
        await self._group.run(op)

    async def workspace_archive(self, session_id: str) -> SessionWorkspace | None:
        """The kept workspace of a session (archive bytes included), or None."""
        async with self._read() as s:
            return await s.get(SessionWorkspace, session_id)

    async def record_regrade(
        self, session_id: str, *, reward: float | None, eval_status: str, eval_reason: str | None,
        eval_detail: dict[str, Any] | None, eval_meta: dict[str, Any],
    ) -> dict[str, Any] | None:
        """Write a new evaluation of a session in one transaction, keeping the previous one.

        ``job_environments``: the previous ``eval_status``/``reward``/``eval_reason``/``eval_detail``
        are appended to ``eval_history`` (with ``replaced_at``, ISO UTC) unless the session was never
        evaluated, then the new values are set. Last step (if any): ``meta_json["evaluation"]`` is
        appended to ``meta_json["evaluation_history"]``, ``eval_meta`` takes its place and
        ``reward``/``step_reward`` become ``reward``. Nothing else changes (steps, status, attempts).
        Returns the previous entry (None when there was none); raises KeyError for an unknown session."""
        async with self._write_lock, self._write() as s, s.begin():
            row = await s.get(JobEnvironment, session_id)
            if row is None:
                raise KeyError(f"no session {session_id!r}")
            history = list(row.eval_history or [])
            previous: dict[str, Any] | None = None
            if row.eval_status is not None or row.reward is not None:
                previous = {"eval_status": row.eval_status, "reward": row.reward, "eval_reason": row.eval_reason,
                            "eval_detail": row.eval_detail, "replaced_at": utcnow().isoformat()}
                history.append(previous)
            last = (
                await s.execute(
                    select(SessionStep).where(col(SessionStep.session_id) == session_id)
                    .order_by(col(SessionStep.seq).desc()).limit(1)
                )
            ).scalar_one_or_none()
            if last is not None:
                meta = dict(last.meta_json or {})
                if "evaluation" in meta:
                    meta["evaluation_history"] = [*meta.get("evaluation_history", []), meta["evaluation"]]
                meta["evaluation"] = eval_meta
                await s.execute(
                    update(SessionStep).where(col(SessionStep.record_id) == last.record_id)
                    .values(reward=reward, step_reward=reward, meta_json=meta)
                )
            await s.execute(
                update(JobEnvironment).where(col(JobEnvironment.session_id) == session_id)
                .values(reward=reward, eval_status=eval_status, eval_reason=eval_reason, eval_detail=eval_detail,
                        eval_history=history or None)
            )
            return previous
