"""The SQL of job locks (``job_locks``, :class:`store.models.JobLock`): take, refresh, release.
Each runs in one write transaction of its own; the holder is compared and swapped, so of two
launchers racing for a job (on one host or several over PostgreSQL) exactly one gets it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from sqlalchemy import Connection, delete, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from store.models import JobLock

_JL = JobLock.__table__  # type: ignore[attr-defined]


def take(
    conn: Connection, lock: JobLock, now: datetime, stale_before: datetime, gone: Callable[[JobLock], bool]
) -> JobLock | None:
    """Make ``lock`` the job's holder when it has none, or when the holder's heartbeat is older
    than ``stale_before`` or ``gone(holder)`` (its process no longer runs); returns None then,
    else the live holder's row."""
    values = {
        "job_id": lock.job_id,
        "owner": lock.owner,
        "pid": lock.pid,
        "host": lock.host,
        "started_at": now,
        "heartbeat_at": now,
    }
    insert = (sqlite_insert if conn.dialect.name == "sqlite" else pg_insert)(_JL)
    if conn.execute(insert.values(**values).on_conflict_do_nothing(index_elements=["job_id"])).rowcount:
        return None
    row = conn.execute(select(_JL).where(_JL.c.job_id == lock.job_id)).mappings().first()
    if row is None:  # released in between: the next try inserts
        return take(conn, lock, now, stale_before, gone)
    holder = JobLock(**row)
    beaten = holder.heartbeat_at if holder.heartbeat_at.tzinfo else holder.heartbeat_at.replace(tzinfo=UTC)
    if beaten >= stale_before and not gone(holder):
        return holder
    swapped = conn.execute(
        update(_JL).where(_JL.c.job_id == lock.job_id, _JL.c.owner == holder.owner).values(**values)
    ).rowcount
    return None if swapped else take(conn, lock, now, stale_before, gone)


def beat(conn: Connection, job_id: str, owner: str, now: datetime) -> bool:
    """Refresh the heartbeat of ``owner``'s lock; False when it no longer holds the job."""
    return bool(
        conn.execute(
            update(_JL).where(_JL.c.job_id == job_id, _JL.c.owner == owner).values(heartbeat_at=now)
        ).rowcount
    )


def release(conn: Connection, job_id: str, owner: str) -> None:
    """Drop ``owner``'s lock of the job (nothing when another holds it)."""
    conn.execute(delete(_JL).where(_JL.c.job_id == job_id, _JL.c.owner == owner))
