"""The store's facade: :class:`Store`, one object per database URL, used by the gateway and by the
launcher, each in its own process. Its methods delegate to the modules named by their caller:

- ``store.batch_writer``: the gateway's recorded steps and session snapshots (batches);
- ``store.gateway_sessions``: a gateway's session rows, shared by gateways under the row's lock;
- ``store.launcher_rows``: the launcher's sessions, attempts, kept workspaces and reads, with the
  evaluation written back through ``store.launcher_rows.write_evaluation`` (both tables, one function);
- ``store.job_lock``: one launcher per job; ``store.schema``: tables made and upgraded at start.

SQLite WAL + busy_timeout make the two processes' writes wait for each other instead of failing
with "database is locked" (``store.engine``). Who writes which table: docs/storage.md.
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
    """True when ``exc`` from a store call means the database as a whole failed (locked past the
    busy timeout, disk I/O, a lost connection: an OperationalError of sqlite3 or SQLAlchemy), as
    opposed to one row it refused (a constraint, a value it cannot store). PostgreSQL: a lost or
    refused connection (SQLAlchemy marks it ``connection_invalidated``; ``OSError`` from the
    driver's connect)."""
    if isinstance(exc, sqlite3.OperationalError | sa_exc.OperationalError | OSError):
        return True
    return isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated


class StoreUnavailable(RuntimeError):
    """The database cannot be opened: a file that is not SQLite, a folder SQLite cannot write in,
    a PostgreSQL server that refuses the connection or the credentials."""


def _open_failure(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None)
    return f"{type(orig or exc).__name__}: {orig or exc}".strip()


_KERNEL_FS = ("/proc", "/sys", "/dev")


def file_cause(path: str) -> str | None:
    """Why the SQLite file ``path`` cannot be opened for writing, when the system says so (the
    driver only says "unable to open database file"); None when it can be. A file this creates
    to find out is removed again."""
    p = Path(path)
    existed = p.exists()
    try:
        os.close(os.open(p, os.O_RDWR | os.O_CREAT, 0o644))
    except OSError as e:
        kernel = next((f"; {k} is a kernel filesystem: no store can be kept there" for k in _KERNEL_FS
                       if p == Path(k) or Path(k) in p.parents), "")
        return f"{path}: {e.strerror or e}{kernel}"
    if not existed:
        p.unlink(missing_ok=True)
    return None


class Store:
    """The trajectory store at one URL (``sqlite://PATH`` or ``postgresql://...``).

    Call ``await init()`` once (creates the tables if missing) and ``await close()`` at the end
    (disposes the engines, so no aiosqlite thread keeps the interpreter alive).
    """

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
        (:func:`store.schema.create_or_upgrade`). Idempotent; safe when two processes start at
        once. Raises SchemaError when a missing column cannot be added automatically,
        StoreUnavailable when the database cannot be opened (the reason in its message)."""
        try:
            async with self._db.write_lock, self.writer.begin() as conn:
                added = await conn.run_sync(create_or_upgrade)
        except (sa_exc.DBAPIError, sqlite3.Error, OSError) as e:
            cause = file_cause(str(self.path)) if self.path else None
            raise StoreUnavailable(f"storage {self.identity()}: cannot open the database "
                                   f"({self.hide_secrets(_open_failure(e))}"
                                   f"{f'; {cause}' if cause else ''})") from e
        for name in added:
            log.warning("store %s: added column %s (the database was made by an older version)",
                        self.identity(), name)

    async def close(self) -> None:
        """Wait for queued row writes, close the SQLite batch writer's connection and stop its
        thread, then dispose both engines (closes every pooled connection)."""
        await self._db.close_group()
        await self._batch.close()
        await self._gateway.close()
        await self._db.dispose()

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

    # ------------------------------------------------------------------ the gateway's batches
    def commit_now(self, steps: Sequence[StepRow], sessions: Iterable[SessionRow]) -> bool:
        """Commit ``steps`` and ``sessions`` (as :meth:`write_batch`) synchronously on the calling
        thread if that needs no waiting: SQLite, no batch being written by this store, and the
        database's write lock free at once. Returns False, having written nothing, otherwise
        (always on PostgreSQL); raises the driver's error when the commit fails."""
        return self._batch.commit_now(steps, sessions)

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
        await self._batch.write(steps, sessions, release=release_in_flight)

    # ------------------------------------------------------------------ gateway sessions
    async def load_gateway_session(self, session_id: str) -> GatewaySession | None:
        """The persisted gateway state of a session, or None."""
        return await self._gateway.load(session_id)

    async def gateway_session_or_context(
            self, session_id: str) -> tuple[GatewaySession | None, SessionContext | None]:
        """The persisted gateway state of a session, and when there is none what the launcher's
        row says of it (None as well when the session was not created by a launcher), in one read."""
        return await self._gateway.load_or_context(session_id)

    async def mark_interrupted(self) -> int:
        """Mark every gateway session left ``active`` by an earlier gateway process as
        ``interrupted`` (a gateway that died mid-session leaves no session "running"
        for ever). Called at gateway start; the session's budget, step counts and step ids are
        kept, and its next call makes it ``active`` again. Returns how many were marked."""
        return await self._gateway.mark_interrupted()

    async def change_gateway_session(self, session_id: str, change: Callable[[GatewaySession], _T],
                                     create: Callable[[JobEnvironment | None], GatewaySession]) -> _T:
        """Read, change and write one ``gateway_sessions`` row in one transaction that holds the
        row's lock (PostgreSQL ``SELECT ... FOR UPDATE``; SQLite's write lock), so gateway
        processes sharing the store change a session one at a time. A missing row is made first
        by ``create(launcher's job_environments row or None)`` (inserted unless another process
        did it meanwhile). ``change`` mutates the state it gets and returns what this call
        returns; it runs inside the transaction (keep it short, no I/O); an exception from it
        rolls back."""
        return await self._gateway.change(session_id, change, create)

    async def reserve_step(self, session_id: str, model: str) -> Reservation | None:
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
        return await self._gateway.reserve(session_id, model)

    async def release_in_flight(self, session_id: str, n: int = 1) -> None:
        """Lower a session's ``in_flight`` by ``n`` (not below 0), for reserved steps whose row
        will never be written (the call ended without one, or its record was lost)."""
        await self._gateway.release(session_id, n)

    async def set_client_score(self, session_id: str, score: float, reason: str | None) -> SessionClientScore:
        """Record (replace) the score 0..10 a client gave a session (``session_client_scores``,
        provenance ``client``; never a grader's reward)."""
        return await self._gateway.set_client_score(session_id, score, reason)

    async def idle_sessions(self, before: datetime) -> list[str]:
        """Open sessions without a job whose gateway row last changed before ``before``."""
        return await self._gateway.idle_sessions(before)

    async def attach_sessions(self, rows: Sequence[JobEnvironment]) -> None:
        """Make sessions recorded without a job sessions of one (``launcher.py grade``): insert
        their ``job_environments`` rows and stamp their steps with the job, env and group, in
        one transaction. ValueError naming a session that already has a launcher row."""
        await self._launcher.attach_sessions(rows)

    # ------------------------------------------------------------------ job locks
    async def take_job_lock(self, lock: JobLock, stale_after_s: float,
                            gone: Callable[[JobLock], bool]) -> JobLock | None:
        """Make ``lock`` (job, owner token, pid, host) the job's holder unless a live one holds it
        (:func:`store.job_lock.take`: a heartbeat within ``stale_after_s`` and not ``gone``);
        returns None when taken, else the holder."""
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
        """Insert session rows that do not exist yet, in one transaction (Core inserts, ``chunk``
        rows per statement batch; ``rows`` may be a generator, never held whole); returns how
        many were inserted."""
        return await self._launcher.add_job_sessions(rows, chunk)

    async def reset_for_retry(self, session_id: str, attempt: int) -> int:
        """Prepare a session for its next attempt (a retry, or ``--resume``): the steps of attempt
        ``attempt`` are kept but moved to session id ``<session_id>~a<attempt>``
        (:func:`store.models.attempt_session_id`) and marked not trainable, and the gateway's
        state of the session is dropped so the budget starts afresh (call it once the gateway has
        answered the session's close). Returns the number of steps moved."""
        return await self._launcher.reset_for_retry(session_id, attempt)

    async def record_attempt(self, attempt: SessionAttempt, *, if_missing: bool = False) -> bool:
        """Write one attempt row (replacing the row of the same session and attempt number, or,
        with ``if_missing``, only when there is none). Returns whether it was written."""
        return await self._launcher.record_attempt(attempt, if_missing=if_missing)

    async def update_job_session(self, session_id: str, **values: Any) -> None:
        """Set columns of one ``job_environments`` row (ValueError for a key that is not one)."""
        await self._launcher.update_job_session(session_id, **values)

    async def finish_job_session(self, session_id: str, result: SessionResult) -> None:
        """Finish a session in one transaction, writing its ``result`` to both tables
        (:func:`store.launcher_rows.write_evaluation`): on the session's last step
        ``reward``/``step_reward`` (and ``result.evaluation`` into ``meta_json["evaluation"]``),
        marked terminal and session-completed; on its ``job_environments`` row the result's
        columns plus ``finished=True`` and ``finished_at``. When this finishes the last unfinished
        session of its group, the group's feed entry is appended in the same transaction
        (:func:`store.feed.append_if_ready`). KeyError for an unknown session."""
        await self._launcher.finish_job_session(session_id, result)

    async def record_regrade(
        self, session_id: str, *, reward: float | None, eval_status: str, eval_reason: str | None,
        eval_detail: dict[str, Any] | None, eval_meta: dict[str, Any],
    ) -> dict[str, Any] | None:
        """Write a new evaluation of a session in one transaction, keeping the previous one
        (:func:`store.launcher_rows.write_evaluation` with ``keep_previous``, the same write as
        :meth:`finish_job_session`'s).

        ``job_environments``: the previous ``eval_status``/``reward``/``eval_reason``/``eval_detail``
        are appended to ``eval_history`` (with ``replaced_at``, ISO UTC) unless the session was never
        evaluated, then the new values are set. Last step (if any): ``meta_json["evaluation"]`` is
        appended to ``meta_json["evaluation_history"]``, ``eval_meta`` takes its place and
        ``reward``/``step_reward`` become ``reward``. Nothing else changes (steps, status, attempts).
        Returns the previous entry (None when there was none); raises KeyError for an unknown session."""
        return await self._launcher.record_regrade(session_id, reward=reward, eval_status=eval_status,
                                                   eval_reason=eval_reason, eval_detail=eval_detail,
                                                   eval_meta=eval_meta)

    async def backfill_feed(self, job_id: str) -> int:
        """Append feed entries for the complete groups of a job recorded before the feed existed
        (:func:`store.feed.backfill`); returns how many."""
        return await self._launcher.backfill_feed(job_id)

    async def save_workspace_archive(self, row: SessionWorkspace) -> None:
        """Insert the kept workspace of ``row.session_id``, replacing an earlier one (a new attempt
        of the session replaces what its earlier attempt left)."""
        await self._launcher.save_workspace_archive(row)

    async def workspace_archive(self, session_id: str) -> SessionWorkspace | None:
        """The kept workspace of a session (archive bytes included), or None."""
        return await self._launcher.workspace_archive(session_id)

    async def job_attempts(self, job_id: str) -> dict[str, list[SessionAttempt]]:
        """Every attempt row of a job: session id -> its attempts in order."""
        return await self._launcher.job_attempts(job_id)

    async def job_sessions(self, job_id: str, *, unfinished_only: bool = False) -> list[JobEnvironment]:
        """The session rows of a job, ordered by env, case, sample."""
        return await self._launcher.job_sessions(job_id, unfinished_only=unfinished_only)

    async def job_exists(self, job_id: str) -> bool:
        """Whether the job has any session row."""
        return await self._launcher.job_exists(job_id)

    def job_session_ids(self, job_id: str, *, finished_only: bool = False) -> AsyncIterator[str]:
        """The session ids of a job in the order of :meth:`job_sessions` (env, case, sample),
        streamed (not read into memory at once)."""
        return self._launcher.job_session_ids(job_id, finished_only=finished_only)

    async def job_sessions_by_id(self, session_ids: Sequence[str]) -> list[JobEnvironment]:
        """The session rows of ``session_ids`` (unknown ones left out), in that order."""
        return await self._launcher.job_sessions_by_id(session_ids)

    async def session_attempts(self, session_ids: Sequence[str]) -> dict[str, list[SessionAttempt]]:
        """The attempt rows of ``session_ids``: session id -> its attempts in order (sessions
        without any left out)."""
        return await self._launcher.session_attempts(session_ids)

    async def trajectory(self, session_id: str) -> list[SessionStep]:
        """Every recorded step of a session, in call order (``seq``), with every value in full
        (:func:`store.stepcodec.decode_rows`). On SQLite read in the grouped writes' thread (one
        hop, between their transactions)."""
        return await self._launcher.trajectory(session_id)

    async def policy_versions(self, session_id: str) -> list[int | None]:
        """The distinct ``policy_version`` values of a session's steps, ascending, None (steps
        recorded before any version was set) first; empty when the session has no step."""
        return await self._launcher.policy_versions(session_id)

    async def policy_version_spans(self, job_id: str) -> dict[str, list[int | None]]:
        """The sessions of a job whose steps span more than one policy version (None counting as
        one): session id -> its distinct versions, as :meth:`policy_versions` orders them."""
        return await self._launcher.policy_version_spans(job_id)
