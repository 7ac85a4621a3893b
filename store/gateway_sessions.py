"""The gateway's session rows (``gateway_sessions``): what a gateway reads of a session at its first
call, and what gateways sharing sessions change under the row's lock (the step budget's
reservation, ``in_flight``, a refund). Called by ``gateway.sessions`` and ``gateway.shared_sessions``
through :class:`store.Store`; the step rows themselves go through ``store.batch_writer``.

SQL: SQLAlchemy Core on the tables, except the hot paths that run as text: the reservation (one
``UPDATE ... RETURNING``, on the SQLite batch writer's ``sqlite3`` connection or an asyncpg pool of
its own) and the ``in_flight`` release in the batch writer's transaction (``sqlite3``; PostgreSQL
``unnest`` of arrays). :func:`change` is the one ORM write: the caller's ``change`` mutates the row
as an object.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple, TypeVar

from sqlalchemy import Connection, Table, bindparam, text
from sqlalchemy import select as sa_select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.orm import Session

from store.connections import Connections
from store.models import GatewaySession, GatewaySessionStatus, JobEnvironment, SessionClientScore, utcnow

_T = TypeVar("_T")
_GS: Table = GatewaySession.__table__  # type: ignore[attr-defined]
_JE: Table = JobEnvironment.__table__  # type: ignore[attr-defined]
_CS: Table = SessionClientScore.__table__  # type: ignore[attr-defined]
_OPEN = ("active", "truncated", "interrupted")
SESSION_COLUMNS = tuple(c.name for c in _GS.columns)

_GATEWAY_SESSION = _GS.select().where(_GS.c.session_id == bindparam("b_sid"))
_SESSION_CONTEXT = (
    _JE.select()
    .with_only_columns(_JE.c.job_id, _JE.c.env_name, _JE.c.group_id, _JE.c.max_steps, _JE.c.llm_model)
    .where(_JE.c.env_id == bindparam("b_sid"))
)
_MARK_INTERRUPTED = _GS.update().where(_GS.c.status == "active")

_RELEASE_SQL = (  # sqlite3 ``?`` parameters: n, n, session id
    "UPDATE gateway_sessions SET in_flight = CASE WHEN in_flight > ? THEN in_flight - ? "
    "ELSE 0 END WHERE session_id = ? RETURNING status"
)
_RELEASE = text(_RELEASE_SQL.replace("?", ":n", 2).replace("?", ":sid"))
_PG_LOCK_SESSIONS = text(
    "SELECT session_id FROM gateway_sessions WHERE session_id = ANY(CAST(:sids AS TEXT[])) "
    "ORDER BY session_id FOR UPDATE"
)
_PG_RELEASE_MANY = text(
    "UPDATE gateway_sessions AS g SET in_flight = GREATEST(g.in_flight - v.n, 0) "
    "FROM unnest(CAST(:sids AS TEXT[]), CAST(:ns AS INT[])) AS v(sid, n) "
    "WHERE g.session_id = v.sid RETURNING g.session_id, g.status"
)

_SQLITE_COUNTS = "CASE WHEN json_type(step_counts) = 'object' THEN step_counts ELSE '{}' END"
_SQLITE_RESERVE_SQL = (  # named parameters, run by the batch writer's own sqlite3 connection
    "UPDATE gateway_sessions SET total_steps = total_steps + 1, in_flight = in_flight + 1, "
    f"step_counts = json_set({_SQLITE_COUNTS}, :path, COALESCE(json_extract({_SQLITE_COUNTS}, :path), 0) + 1), "
    "status = 'active', updated_at = :now, route = COALESCE(route, :model) "
    "WHERE session_id = :sid AND status IN ('active', 'truncated', 'interrupted') "
    "AND (max_steps < 0 OR total_steps - refunded_steps < max_steps) AND (route IS NULL OR route = :model) "
    "RETURNING total_steps, json_extract(step_counts, :path), job_id, env_name, group_id"
)
_PG_COUNTS = "CASE WHEN json_typeof(step_counts) = 'object' THEN step_counts::jsonb ELSE '{}'::jsonb END"
_PG_RESERVE_SQL = (  # asyncpg: $1 session id, $2 route key, $3 now
    "UPDATE gateway_sessions SET total_steps = total_steps + 1, in_flight = in_flight + 1, "
    f"step_counts = jsonb_set({_PG_COUNTS}, ARRAY[$2::text], "
    f"to_jsonb(COALESCE(({_PG_COUNTS} ->> $2::text)::int, 0) + 1))::json, "
    "status = 'active', updated_at = $3, route = COALESCE(route, $2::text) "
    "WHERE session_id = $1 AND status IN ('active', 'truncated', 'interrupted') "
    "AND (max_steps < 0 OR total_steps - refunded_steps < max_steps) AND (route IS NULL OR route = $2::text) "
    "RETURNING total_steps, (step_counts::jsonb ->> $2::text)::int, job_id, env_name, group_id"
)

Reservation = tuple[int, int, str | None, str | None, str | None]
"""``(seq, step_id, job_id, env_name, group_id)`` of a reserved step."""
OnWriter = Callable[[Callable[[sqlite3.Connection], _T]], Awaitable[_T]]


class SessionContext(NamedTuple):
    """What a gateway takes from the launcher's row of a session (``job_environments``):
    ``llm_model`` is the route the launcher runs the session on (the session is bound to it)."""

    job_id: str | None
    env_name: str | None
    group_id: str | None
    max_steps: int | None
    llm_model: str | None


def load(conn: Connection, session_id: str) -> GatewaySession | None:
    """The ``gateway_sessions`` row of a session, or None."""
    row = conn.execute(_GATEWAY_SESSION, {"b_sid": session_id}).mappings().first()
    return GatewaySession(**row) if row is not None else None


def load_or_context(conn: Connection, session_id: str) -> tuple[GatewaySession | None, SessionContext | None]:
    """The gateway row of a session, or when there is none what the launcher's row says of it."""
    st = load(conn, session_id)
    if st is not None:
        return st, None
    row = conn.execute(_SESSION_CONTEXT, {"b_sid": session_id}).first()
    return None, (SessionContext(*row) if row is not None else None)


def release_counts(steps: Sequence[Mapping[str, Any]]) -> list[tuple[str, int]]:
    """(session id, steps of it in the batch), sorted by session id: every writer takes the rows'
    locks in the same order, so two gateways' batches never deadlock."""
    counts: dict[str, int] = {}
    for st in steps:
        counts[st["session_id"]] = counts.get(st["session_id"], 0) + 1
    return sorted(counts.items())


def mark_after_close(steps: list[Mapping[str, Any]], closed: set[str]) -> list[Mapping[str, Any]]:
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


def release_sqlite(con: sqlite3.Connection, steps: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """In the batch writer's transaction: lower ``in_flight`` of each step's session by its steps
    in the batch; returns ``steps`` with those of sessions already closed marked
    (:func:`mark_after_close`)."""
    closed = {
        sid
        for sid, n in release_counts(steps)
        if (r := con.execute(_RELEASE_SQL, (n, n, sid)).fetchone()) is not None and r[0] == "closed"
    }
    return mark_after_close(steps, closed)


async def release_pg(conn: AsyncConnection, steps: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """:func:`release_sqlite` on PostgreSQL, taking the rows' locks in session id order first (no
    deadlock between two gateways' batches)."""
    counts = release_counts(steps)
    sids, ns = [c[0] for c in counts], [c[1] for c in counts]
    await conn.execute(_PG_LOCK_SESSIONS, {"sids": sids})
    res = await conn.execute(_PG_RELEASE_MANY, {"sids": sids, "ns": ns})
    return mark_after_close(
        steps, {str(sid) for sid, status in res.all() if status == GatewaySessionStatus.CLOSED}
    )


def change(
    s: Session,
    session_id: str,
    change: Callable[[GatewaySession], _T],
    create: Callable[[JobEnvironment | None], GatewaySession],
) -> _T:
    """In the caller's write transaction: read the row with its lock (``SELECT ... FOR UPDATE``;
    SQLite's write lock), made first by ``create`` when missing (inserted unless another process
    did it meanwhile), and return ``change(row)``; the flush at commit writes what it changed."""
    st = s.get(GatewaySession, session_id, with_for_update=True)
    if st is None:
        new = create(s.get(JobEnvironment, session_id))
        ins = (sqlite_insert if s.get_bind().dialect.name == "sqlite" else pg_insert)(_GS)
        s.execute(
            ins.on_conflict_do_nothing(index_elements=["session_id"]),
            [{n: getattr(new, n) for n in SESSION_COLUMNS}],
        )
        st = s.get(GatewaySession, session_id, with_for_update=True, populate_existing=True)
        assert st is not None
    return change(st)


class GatewaySessions:
    """The gateway-session statements of one store, run on its connections. On SQLite the
    reservation runs on the batch writer's connection and thread (``on_writer``), so it never
    waits for this process's own batches' lock."""

    def __init__(self, db: Connections, on_writer: OnWriter[Any] | None) -> None:
        self._db = db
        self._on_writer = on_writer
        self._pool: Any = None  # asyncpg pool of reserve (PostgreSQL)
        self._pool_lock = asyncio.Lock()
        dialect = db.writer.sync_engine.dialect
        # ``updated_at`` as SQLAlchemy binds it on this dialect: the plain sqlite3 reservation
        # stores what a Core write would
        self._bind_ts: Callable[[Any], Any] = _GS.c.updated_at.type.dialect_impl(dialect).bind_processor(
            dialect
        ) or (lambda v: v)

    async def load(self, session_id: str) -> GatewaySession | None:
        """The persisted gateway state of a session, or None."""
        return await self._db.read_sync(lambda c: load(c, session_id))

    async def load_or_context(self, session_id: str) -> tuple[GatewaySession | None, SessionContext | None]:
        """:func:`load_or_context` in one read."""
        return await self._db.read_sync(lambda c: load_or_context(c, session_id))

    async def mark_interrupted(self) -> int:
        """Every row left ``active`` becomes ``interrupted``; returns how many."""
        async with self._db.write_lock, self._db.writer.begin() as conn:
            res = await conn.execute(_MARK_INTERRUPTED.values(status="interrupted", updated_at=utcnow()))
            return int(res.rowcount or 0)

    async def change(
        self,
        session_id: str,
        fn: Callable[[GatewaySession], _T],
        create: Callable[[JobEnvironment | None], GatewaySession],
    ) -> _T:
        """:func:`change` in a write transaction of its own."""
        async with self._db.write_session() as s, s.begin():
            return await s.run_sync(change, session_id, fn, create)

    async def reserve(self, session_id: str, model: str) -> Reservation | None:
        """The reservation statement on this backend; None when it reserved nothing (and on SQLite
        for a route key holding ``"`` or ``\\``, not expressible as a JSON path key)."""
        row: Any
        if self._on_writer is not None:
            if '"' in model or "\\" in model:
                return None
            params = {
                "sid": session_id,
                "model": model,
                "path": f'$."{model}"',
                "now": self._bind_ts(utcnow()),
            }
            row = await self._on_writer(lambda con: con.execute(_SQLITE_RESERVE_SQL, params).fetchone())
        else:
            row = await (await self._pg_pool()).fetchrow(_PG_RESERVE_SQL, session_id, model, utcnow())
        if row is None:
            return None
        return int(row[0]), int(row[1]), row[2], row[3], row[4]

    async def _pg_pool(self) -> Any:
        """A small asyncpg pool of its own for :meth:`reserve` (one statement per call in
        autocommit, without SQLAlchemy's per-execute cost on the hot path); made on first use."""
        if self._pool is None:
            async with self._pool_lock:  # the first calls come many at once
                if self._pool is None:
                    import asyncpg

                    dsn = "postgresql://" + self._db.url.split("://", 1)[1]
                    self._pool = await asyncpg.create_pool(dsn, min_size=1, max_size=8)
        return self._pool

    async def release(self, session_id: str, n: int = 1) -> None:
        """Lower a session's ``in_flight`` by ``n`` (not below 0)."""
        async with self._db.writer.begin() as conn:
            await conn.execute(_RELEASE, {"n": n, "sid": session_id})

    async def set_client_score(self, session_id: str, score: float, reason: str | None) -> SessionClientScore:
        """Record (or replace) the score a client gave ``session_id``, provenance ``client``."""
        row = SessionClientScore(session_id=session_id, score=score, reason=reason)
        values = {n: getattr(row, n) for n in ("session_id", "score", "reason", "provenance", "recorded_at")}
        ins = (sqlite_insert if self._db.kind == "sqlite" else pg_insert)(_CS)
        stmt = ins.on_conflict_do_update(
            index_elements=["session_id"], set_={k: ins.excluded[k] for k in values if k != "session_id"}
        )
        async with self._db.write_lock, self._db.writer.begin() as conn:
            await conn.execute(stmt, values)
        return row

    async def idle_sessions(self, before: datetime) -> list[str]:
        """Sessions without a launcher row, still open (active, truncated, interrupted), whose row
        last changed before ``before``, with no call in flight (shared sessions): what an idle close
        closes."""
        no_job = ~sa_select(_JE.c.env_id).where(_JE.c.env_id == _GS.c.session_id).exists()
        q = (
            sa_select(_GS.c.session_id)
            .where(_GS.c.status.in_(_OPEN), _GS.c.updated_at < before, _GS.c.in_flight == 0, no_job)
            .order_by(_GS.c.session_id)
        )
        async with self._db.reader.connect() as conn:
            return [str(r) for r in (await conn.execute(q)).scalars()]

    async def close(self) -> None:
        """Close the reservation pool (PostgreSQL)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()
