"""The telemetry writer: ONE task that commits queued records in batches (group commit).

Callers enqueue a step row and/or a session state: a snapshot, or the live state object of
:class:`gateway.sessions.SessionManager`, copied when its batch is committed (the last state of a
session in a batch wins, so a batch copies each session once). In ``strict`` mode they get a future
that resolves when the batch holding their record is committed (or raises the DB error); in
``best_effort`` mode nothing waits, and records lost to a full queue or a DB failure are counted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.metrics import Metrics
from store import SessionRow, StepRow, Store, is_unavailable

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Item:
    step: StepRow | None
    session: SessionRow | None
    done: asyncio.Future[None] | None = field(default=None)
    on_commit: Callable[[], None] | None = field(default=None)


class TelemetryWriter:
    """Group-committing writer. ``start()`` in the loop, ``stop()`` at shutdown (drains first)."""

    def __init__(self, store: Store, metrics: Metrics, *, strict: bool, batch_max: int, queue_max: int) -> None:
        self._store = store
        self._metrics = metrics
        self.strict = strict
        self._batch_max = batch_max
        self._queue: asyncio.Queue[_Item | None] = asyncio.Queue(maxsize=queue_max)
        self._task: asyncio.Task[None] | None = None
        self._busy = False  # a batch is being written

    def start(self) -> None:
        """Start the writer task."""
        self._task = asyncio.create_task(self._run(), name="telemetry-writer")

    async def stop(self) -> None:
        """Write everything queued, then end the task."""
        if self._task is None:
            return
        await self._queue.put(None)
        await self._task
        self._task = None

    def submit(self, step: StepRow | None, session: SessionRow | None,
               on_commit: Callable[[], None] | None = None) -> asyncio.Future[None] | None:
        """Queue a record without waiting. Returns a future resolved at commit (strict mode), or
        None (best_effort). ``on_commit`` is called once the record is committed (never when it
        is dropped or its batch fails). Raises ``RuntimeError`` in strict mode when the queue is
        full."""
        fut: asyncio.Future[None] | None = asyncio.get_running_loop().create_future() if self.strict else None
        item = _Item(step, session, fut, on_commit)
        if self._task is not None and not self._busy and self._queue.empty() and self._write_now(item):
            return fut
        try:
            self._queue.put_nowait(item)
        except asyncio.QueueFull:
            if self.strict:
                raise RuntimeError("telemetry queue is full") from None
            self._metrics.telemetry_dropped.inc()
            log.error("telemetry queue full: record dropped (best_effort mode)")
            return None
        self._metrics.telemetry_queue_depth.set(self._queue.qsize())
        return fut

    def _write_now(self, item: _Item) -> bool:
        """Commit ``item`` right here when the writer is idle (nothing queued, no batch being
        written: so no record queued earlier can commit after it) and the store can commit at
        once without waiting (:meth:`store.Store.write_now`: SQLite with its write lock free).
        At low load this saves the queue hand-off to the writer task. Returns False when the
        record must be queued; a DB error settles the record as failed (True)."""
        steps = [item.step] if item.step is not None else []
        sessions = [item.session] if item.session is not None else []
        try:
            written = self._store.write_now(steps, sessions)
        except Exception as e:
            log.error("telemetry record failed: %s: %s", type(e).__name__, e)
            self._settle([item], e)
            return True
        if written:
            self._settle([item], None)
        return written

    async def record(self, step: StepRow | None, session: SessionRow | None,
                     on_commit: Callable[[], None] | None = None) -> None:
        """Queue a record; in strict mode wait until it is committed (raises the DB error).
        ``on_commit`` as in :meth:`submit`."""
        fut = self.submit(step, session, on_commit)
        if fut is not None:
            await asyncio.shield(fut)

    async def _run(self) -> None:
        stopping = False
        while not stopping:
            first = await self._queue.get()
            if first is None:
                break
            batch = [first]
            while len(batch) < self._batch_max and not self._queue.empty():
                nxt = self._queue.get_nowait()
                if nxt is None:
                    stopping = True
                    break
                batch.append(nxt)
            self._metrics.telemetry_queue_depth.set(self._queue.qsize())
            self._busy = True
            try:
                await self._commit(batch)
            finally:
                self._busy = False

    async def _commit(self, batch: list[_Item]) -> None:
        """Commit ``batch`` in one transaction. When that fails and the batch holds more than one
        record, each record is committed on its own, so one record the DB refuses (or a bug
        in one row) fails that record only, not the other sessions' steps of its batch; not
        when the database as a whole failed (:func:`store.is_unavailable`: locked, I/O), which
        one row at a time would only repeat."""
        err = await self._write(batch)
        if err is not None and len(batch) > 1 and not is_unavailable(err):
            for it in batch:
                self._settle([it], await self._write([it]))
            return
        self._settle(batch, err)

    async def _write(self, batch: list[_Item]) -> BaseException | None:
        steps = [it.step for it in batch if it.step is not None]
        sessions = [it.session for it in batch if it.session is not None]
        try:
            # a lone record (low load: nobody else waits on the loop) may commit without the
            # thread hop when the DB is free at once (Store.write_batch(inline=True))
            await self._store.write_batch(steps, sessions, inline=len(batch) == 1)
        except Exception as e:  # the DB failed: every waiter learns it, nothing is silent
            log.error("telemetry batch of %d records failed: %s: %s", len(batch), type(e).__name__, e)
            return e
        return None

    def _settle(self, batch: list[_Item], err: BaseException | None) -> None:
        if err is None:
            self._metrics.steps_recorded.inc(sum(it.step is not None for it in batch))
        elif not self.strict:
            self._metrics.telemetry_dropped.inc(len(batch))
        for it in batch:
            if err is None and it.on_commit is not None:
                it.on_commit()
            if it.done is not None and not it.done.done():
                if err is None:
                    it.done.set_result(None)
                else:
                    it.done.set_exception(err)
