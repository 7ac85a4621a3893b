"""One launcher per job at a time: a lease in the store (``job_locks``), so it holds for SQLite and
for a PostgreSQL store shared by several hosts.

``async with JobLease(store, job_id):`` takes the job or raises :class:`JobLocked` naming the live
holder (pid, host, start time). While held, the heartbeat is refreshed every ``heartbeat_s``; a
holder is live while its heartbeat is younger than ``stale_after_s`` and, on this host, its
process still runs, so a launcher that died (even by SIGKILL) is taken over at once on its own
host and after ``stale_after_s`` from any other. A holder whose lease was taken over (its
heartbeats failed for that long) is stopped: the task that entered the lease is cancelled and
:class:`JobLockLost` raised at its exit. Details: docs/outcomes.md ("One launcher per job").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from datetime import UTC, datetime

from rollout.errors import RolloutError
from store import JobLock, Store

log = logging.getLogger(__name__)

HEARTBEAT_S = 10.0
STALE_AFTER_S = 60.0


class JobLockError(RolloutError, RuntimeError):
    """The job's lock is not (or no longer) this launcher's; the message says whose it is."""


class JobLocked(JobLockError):
    """Another live launcher runs the job."""


class JobLockLost(JobLockError):
    """Another launcher took the job over while this one ran it."""


def process_alive(pid: int) -> bool:
    """Whether a process with ``pid`` exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def holder_gone(host: str, pid: int) -> bool:
    """A job's holder has ended: it ran on this host and its pid no longer exists."""
    return host == socket.gethostname() and pid > 0 and not process_alive(pid)


def _when(t: datetime) -> str:
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def describe(holder: JobLock) -> str:
    """``pid P on host H, started T, last heartbeat T``."""
    return (
        f"pid {holder.pid} on host {holder.host}, started {_when(holder.started_at)}, "
        f"last heartbeat {_when(holder.heartbeat_at)}"
    )


class JobLease:
    """The lease of ``job_id`` in ``store`` while the ``async with`` block runs (module docstring)."""

    def __init__(
        self,
        store: Store,
        job_id: str,
        *,
        heartbeat_s: float = HEARTBEAT_S,
        stale_after_s: float = STALE_AFTER_S,
    ) -> None:
        if not 0 < heartbeat_s < stale_after_s:
            raise ValueError("heartbeat_s must be positive and below stale_after_s")
        self.store = store
        self.job_id = job_id
        self.heartbeat_s = heartbeat_s
        self.stale_after_s = stale_after_s
        self.lock = JobLock(job_id=job_id, owner=uuid.uuid4().hex, pid=os.getpid(), host=socket.gethostname())
        self.lost: str | None = None
        self._beat: asyncio.Task[None] | None = None
        self._holder_task: asyncio.Task[object] | None = None

    async def take(self) -> None:
        """Take the job, or raise :class:`JobLocked` naming its live holder; then keep it
        (heartbeats) until :meth:`release`."""
        holder = await self.store.take_job_lock(
            self.lock, self.stale_after_s, lambda h: holder_gone(h.host, h.pid)
        )
        if holder is not None:
            raise JobLocked(
                f"job {self.job_id} is running in another launcher ({describe(holder)}); wait for it "
                f"to finish or stop it (a dead one's lock is taken over {self.stale_after_s:g} s after "
                "its last heartbeat, at once on its own host)"
            )
        self._holder_task = asyncio.current_task()
        self._beat = asyncio.create_task(self._heartbeat(), name=f"job-lock-{self.job_id}")

    async def release(self) -> None:
        """Stop the heartbeats and drop the lock (unless another launcher took it over)."""
        if self._beat is None:
            return
        self._beat.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._beat
        self._beat = None
        if self.lost is None:
            with contextlib.suppress(Exception):  # a store gone away: the lease goes stale by itself
                await asyncio.shield(self.store.release_job_lock(self.job_id, self.lock.owner))

    def lost_error(self, exc: BaseException) -> JobLockLost | None:
        """For ``exc`` ending the holder's work: the :class:`JobLockLost` to raise instead when it
        is the cancellation this lease made on losing the job (that cancel is withdrawn), else None."""
        if self.lost is None or not isinstance(exc, asyncio.CancelledError):
            return None
        if self._holder_task is not None:
            self._holder_task.uncancel()
        return JobLockLost(self.lost)

    async def __aenter__(self) -> JobLease:
        await self.take()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        await self.release()
        lost = self.lost_error(exc) if exc is not None else None
        if lost is not None:
            raise lost from None

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_s)
            try:
                held = await self.store.beat_job_lock(self.job_id, self.lock.owner)
            except (
                Exception
            ) as e:  # the store unreachable: try again; the lease goes stale after stale_after_s
                log.warning("job %s: cannot refresh its lock: %s: %s", self.job_id, type(e).__name__, e)
                continue
            if not held:
                self.lost = (
                    f"job {self.job_id} was taken over by another launcher (this one's lock went "
                    f"unrefreshed for more than {self.stale_after_s:g} s); this launcher stopped"
                )
                log.error("%s", self.lost)
                if self._holder_task is not None:
                    self._holder_task.cancel()
                return
