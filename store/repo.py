"""The store's facade :class:`Store`, one per database URL and process. Its methods delegate to
``store.batch_writer`` (the gateway's batches), ``store.gateway_sessions``, ``store.launcher_rows``
and ``store.job_lock``, whose functions document them. Who writes which table: docs/storage.md.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import exc as sa_exc
from sqlalchemy import text

from store import job_lock
from store.batch_writer import BatchWriter, SessionRow, StepRow
from store.connections import Connections
from store.engine import BUSY_TIMEOUT_MS, hide_secrets, redact_url
from store.gateway_sessions import GatewaySessions, Reservation, SessionContext
from store.launcher_rows import LauncherRows
from store.models import (
    GatewaySession,
    JobEnvironment,
    JobLock,
    SessionAttempt,
    SessionClientScore,
    SessionStep,
    SessionWorkspace,
    utcnow,
)
from store.schema import SchemaError, create_or_upgrade
from store.session_result import SessionResult

__all__ = ["SchemaError", "Store", "StoreUnavailable", "is_unavailable"]  # SchemaError: store.schema

log = logging.getLogger(__name__)
_T = TypeVar("_T")


def is_unavailable(exc: BaseException) -> bool:
    """True when ``exc`` means the database as a whole failed (locked, disk I/O, lost connection),
    not one row it refused (a constraint, a value it cannot store)."""
    if isinstance(exc, sqlite3.OperationalError | sa_exc.OperationalError | OSError):
        return True
    return isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated


class StoreUnavailable(RuntimeError):
    """The database cannot be opened (the reason in the message)."""


def _open_failure(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None)
    return f"{type(orig or exc).__name__}: {orig or exc}".strip()


_KERNEL_FS = ("/proc", "/sys", "/dev")


def file_cause(path: str) -> str | None:
    """Why the SQLite file ``path`` cannot be opened for writing (the driver does not say); None
    when it can be."""
    p = Path(path)
    existed = p.exists()
    try:
        os.close(os.open(p, os.O_RDWR | os.O_CREAT, 0o644))
    except OSError as e:
        kernel = next(
            (
                f"; {k} is a kernel filesystem: no store can be kept there"
                for k in _KERNEL_FS
                if p == Path(k) or Path(k) in p.parents
            ),
            "",
        )
        return f"{path}: {e.strerror or e}{kernel}"
    if not existed:
        p.unlink(missing_ok=True)
    return None


def _open_sqlite(path: str) -> None:
    """Open and close the SQLite file ``path`` with the plain driver; raises sqlite3.Error when it
    cannot be opened (aiosqlite's thread of a failed open may answer after its event loop closed)."""
    sqlite3.connect(path).close()


class Store:
    """The trajectory store at ``sqlite://PATH`` or ``postgresql://...``: ``await init()`` first,
    ``await close()`` at the end."""

    def __init__(self, url: str) -> None:
        self._db = Connections(url)
        self.user_url = url
        self.url = self._db.url
        self.writer = self._db.writer
        self.reader = self._db.reader
        self._batch = BatchWriter(self._db)
        sqlite = self._batch.sqlite
        self._gateway = GatewaySessions(self._db, sqlite.run if sqlite is not None else None)
        self._launcher = LauncherRows(self._db)

    @property
    def kind(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self._db.kind

    @property
    def path(self) -> str | None:
        """The SQLite file path (absolute), or None for PostgreSQL."""
        return self._db.path

    def identity(self) -> str:
        """The database's name to print and log: equal for the same database, no credential in it."""
        if self.path:
            return f"sqlite://{self.path}"
        return "postgresql://" + redact_url(self.url, drop_user=True).split("://", 1)[1]

    def hide_secrets(self, text: str) -> str:
        """``text`` (e.g. a driver's error) with this store URL's credentials as ``***``."""
        return hide_secrets(text, self.user_url, self.url)

    def peer_url(self) -> str:
        """The URL another process opens the same database with (credentials included)."""
        return self.identity() if self.path else self.user_url

    async def init(self) -> None:
        """Create or upgrade the tables (idempotent). Raises SchemaError, or StoreUnavailable when
        the database cannot be opened."""
        try:
            if self.path:  # a file that cannot be opened fails here, before a driver thread is started for it
                _open_sqlite(self.path)
            async with self._db.write_lock, self.writer.begin() as conn:
                added = await conn.run_sync(create_or_upgrade)
        except (sa_exc.DBAPIError, sqlite3.Error, OSError) as e:
            cause = file_cause(str(self.path)) if self.path else None
            raise StoreUnavailable(
                f"storage {self.identity()}: cannot open the database "
                f"({self.hide_secrets(_open_failure(e))}"
                f"{f'; {cause}' if cause else ''})"
            ) from e
        for name in added:
            log.warning(
                "store %s: added column %s (the database was made by an older version)", self.identity(), name
            )

    async def close(self) -> None:
        """Wait for queued writes, stop the batch writer and dispose the engines."""
        await self._db.close_group()
        await self._batch.close()
        await self._gateway.close()
        await self._db.dispose()

    async def ping(self) -> None:
        """Run ``SELECT 1``; raises the driver's error when the database is unreachable."""
        async with self.reader.connect() as conn:
            await conn.execute(text("SELECT 1"))

    async def checkpoint(self) -> None:
        """Fold the SQLite WAL into the ``.db`` file; no-op on PostgreSQL."""
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

    # The methods below delegate; the delegate's docstring says what each does.
    # ------------------------------------------------------------------ the gateway's batches
    def commit_now(self, steps: Sequence[StepRow], sessions: Iterable[SessionRow]) -> bool:
        return self._batch.commit_now(steps, sessions)

    async def write_batch(
        self, steps: Sequence[StepRow], sessions: Iterable[SessionRow], *, release_in_flight: bool = False
    ) -> None:
        """``release_in_flight``: also lower each step's session's ``in_flight`` by one
        (:func:`store.gateway_sessions.release_counts`, :func:`~store.gateway_sessions.mark_after_close`)."""
        await self._batch.write(steps, sessions, release=release_in_flight)

    # ------------------------------------------------------------------ gateway sessions
    async def load_gateway_session(self, session_id: str) -> GatewaySession | None:
        return await self._gateway.load(session_id)

    async def gateway_session_or_context(
        self, session_id: str
    ) -> tuple[GatewaySession | None, SessionContext | None]:
        return await self._gateway.load_or_context(session_id)

    async def mark_interrupted(self) -> int:
        """At gateway start; a marked session's next call makes it ``active`` again."""
        return await self._gateway.mark_interrupted()

    async def change_gateway_session(
        self,
        session_id: str,
        change: Callable[[GatewaySession], _T],
        create: Callable[[JobEnvironment | None], GatewaySession],
    ) -> _T:
        """:func:`store.gateway_sessions.change`: ``change`` runs in the transaction (no I/O)."""
        return await self._gateway.change(session_id, change, create)

    async def reserve_step(self, session_id: str, model: str) -> Reservation | None:
        return await self._gateway.reserve(session_id, model)

    async def release_in_flight(self, session_id: str, n: int = 1) -> None:
        await self._gateway.release(session_id, n)

    async def set_client_score(self, session_id: str, score: float, reason: str | None) -> SessionClientScore:
        return await self._gateway.set_client_score(session_id, score, reason)

    async def idle_sessions(self, before: datetime) -> list[str]:
        return await self._gateway.idle_sessions(before)

    async def attach_sessions(self, rows: Sequence[JobEnvironment]) -> None:
        await self._launcher.attach_sessions(rows)

    # ------------------------------------------------------------------ job locks
    async def take_job_lock(
        self, lock: JobLock, stale_after_s: float, gone: Callable[[JobLock], bool]
    ) -> JobLock | None:
        """Take the job's lock unless a live one holds it (:func:`store.job_lock.take`): None when
        taken, else the holder."""
        now = utcnow()
        async with self._db.write_lock, self.writer.begin() as conn:
            return await conn.run_sync(job_lock.take, lock, now, now - timedelta(seconds=stale_after_s), gone)

    async def beat_job_lock(self, job_id: str, owner: str) -> bool:
        """Refresh ``owner``'s heartbeat on the job; False when it no longer holds it."""
        async with self._db.write_lock, self.writer.begin() as conn:
            return await conn.run_sync(job_lock.beat, job_id, owner, utcnow())

    async def release_job_lock(self, job_id: str, owner: str) -> None:
        """Drop ``owner``'s lock of the job."""
        async with self._db.write_lock, self.writer.begin() as conn:
            await conn.run_sync(job_lock.release, job_id, owner)

    # ------------------------------------------------------------------ the launcher's rows
    async def add_job_sessions(self, rows: Iterable[JobEnvironment], chunk: int = 500) -> int:
        return await self._launcher.add_job_sessions(rows, chunk)

    async def reset_for_retry(self, session_id: str, attempt: int) -> int:
        return await self._launcher.reset_for_retry(session_id, attempt)

    async def record_attempt(self, attempt: SessionAttempt, *, if_missing: bool = False) -> bool:
        return await self._launcher.record_attempt(attempt, if_missing=if_missing)

    async def update_job_session(self, session_id: str, **values: Any) -> None:
        await self._launcher.update_job_session(session_id, **values)

    async def finish_job_session(self, session_id: str, result: SessionResult) -> None:
        await self._launcher.finish_job_session(session_id, result)

    async def record_regrade(
        self,
        session_id: str,
        *,
        reward: float | None,
        eval_status: str,
        eval_reason: str | None,
        eval_detail: dict[str, Any] | None,
        eval_meta: dict[str, Any],
    ) -> dict[str, Any] | None:
        return await self._launcher.record_regrade(
            session_id,
            reward=reward,
            eval_status=eval_status,
            eval_reason=eval_reason,
            eval_detail=eval_detail,
            eval_meta=eval_meta,
        )

    async def backfill_feed(self, job_id: str) -> int:
        return await self._launcher.backfill_feed(job_id)

    async def save_workspace_archive(self, row: SessionWorkspace) -> None:
        await self._launcher.save_workspace_archive(row)

    async def workspace_archive(self, session_id: str) -> SessionWorkspace | None:
        return await self._launcher.workspace_archive(session_id)

    async def job_attempts(self, job_id: str) -> dict[str, list[SessionAttempt]]:
        return await self._launcher.job_attempts(job_id)

    async def job_sessions(self, job_id: str, *, unfinished_only: bool = False) -> list[JobEnvironment]:
        return await self._launcher.job_sessions(job_id, unfinished_only=unfinished_only)

    async def job_exists(self, job_id: str) -> bool:
        return await self._launcher.job_exists(job_id)

    def job_session_ids(self, job_id: str, *, finished_only: bool = False) -> AsyncIterator[str]:
        return self._launcher.job_session_ids(job_id, finished_only=finished_only)

    async def job_sessions_by_id(self, session_ids: Sequence[str]) -> list[JobEnvironment]:
        return await self._launcher.job_sessions_by_id(session_ids)

    async def session_attempts(self, session_ids: Sequence[str]) -> dict[str, list[SessionAttempt]]:
        return await self._launcher.session_attempts(session_ids)

    async def trajectory(self, session_id: str) -> list[SessionStep]:
        return await self._launcher.trajectory(session_id)

    async def policy_versions(self, session_id: str) -> list[int | None]:
        return await self._launcher.policy_versions(session_id)

    async def policy_version_spans(self, job_id: str) -> dict[str, list[int | None]]:
        return await self._launcher.policy_version_spans(job_id)
