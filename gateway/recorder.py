"""The telemetry writer: one task committing queued step rows and session states in batches; a
session state is copied at commit (docs/gateway-semantics.md, "Strict vs best-effort telemetry")."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
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

    def __init__(
        self,
        store: Store,
        metrics: Metrics,
        *,
        strict: bool,
        batch_max: int,
        queue_max: int,
        release_in_flight: bool = False,
        on_lost: Callable[[StepRow], None] | None = None,
        on_unrecorded: Callable[[str], None] | None = None,
    ) -> None:
        """``release_in_flight``: each step lowers its session's ``in_flight`` (shared sessions);
        ``on_lost`` gets each step record dropped or refused; ``on_unrecorded`` the session id of
        each step lost to the gateway itself: a full queue, or a store failed as a whole
        (``is_unavailable``), not a record it refused."""
        self._store = store
        self._release = release_in_flight
        self._on_lost = on_lost
        self._on_unrecorded = on_unrecorded
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

    def enqueue(
        self, step: StepRow | None, session: SessionRow | None, on_commit: Callable[[], None] | None = None
    ) -> asyncio.Future[None] | None:
        """Queue a record (committed at once when the writer is idle and the store need not wait). Returns
        a future resolved at commit (strict), or None (best_effort); ``on_commit`` runs once committed.
        Raises RuntimeError in strict mode when the queue is full."""
        fut: asyncio.Future[None] | None = asyncio.get_running_loop().create_future() if self.strict else None
        item = _Item(step, session, fut, on_commit)
        if (
            self._task is not None
            and not self._release
            and not self._busy
            and self._queue.empty()
            and self._commit_now([item])
        ):
            return fut
        try:
            self._queue.put_nowait(item)
        except asyncio.QueueFull:
            if self.strict:
                self._unrecorded([item])
                raise RuntimeError("telemetry queue is full") from None
            self._lost([item], ours=True)
            self._metrics.telemetry_dropped.inc()
            log.error("telemetry queue full: record dropped (best_effort mode)")
            return None
        self._metrics.telemetry_queue_depth.set(self._queue.qsize())
        return fut

    async def commit(
        self, step: StepRow | None, session: SessionRow | None, on_commit: Callable[[], None] | None = None
    ) -> None:
        """:meth:`enqueue`, then in strict mode wait until the record is committed (raises the DB
        error)."""
        fut = self.enqueue(step, session, on_commit)
        if fut is not None:
            await asyncio.shield(fut)

    def _commit_now(self, batch: list[_Item]) -> bool:
        """The one inline path: commit ``batch`` on this thread if the store can without waiting
        (True, settled; a DB error settles it as failed), else False (nothing written)."""
        steps = [it.step for it in batch if it.step is not None]
        sessions = [it.session for it in batch if it.session is not None]
        try:
            written = self._store.commit_now(steps, sessions)
        except Exception as e:
            log.error("telemetry record failed: %s: %s", type(e).__name__, e)
            self._settle(batch, e)
            return True
        if written:
            self._settle(batch, None)
        return written

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
        """Commit ``batch`` in one transaction; when that fails, each record alone (one refused record
        fails only itself), unless the database as a whole is unavailable."""
        if len(batch) == 1 and not self._release and self._commit_now(batch):  # low load: no thread hop
            return
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
            await self._store.write_batch(steps, sessions, release_in_flight=self._release)
        except Exception as e:  # the DB failed: every waiter learns it, nothing is silent
            log.error("telemetry batch of %d records failed: %s: %s", len(batch), type(e).__name__, e)
            return e
        return None

    def _lost(self, batch: list[_Item], ours: bool) -> None:
        if self._on_lost is not None:
            for it in batch:
                if it.step is not None:
                    self._on_lost(it.step)
        if ours:
            self._unrecorded(batch)

    def _unrecorded(self, batch: list[_Item]) -> None:
        if self._on_unrecorded is not None:
            for it in batch:
                if it.step is not None:
                    self._on_unrecorded(
                        it.step["session_id"] if isinstance(it.step, Mapping) else it.step.session_id
                    )

    def _settle(self, batch: list[_Item], err: BaseException | None) -> None:
        if err is None:
            self._metrics.steps_recorded.inc(sum(it.step is not None for it in batch))
        else:
            self._lost(batch, ours=is_unavailable(err))
            if not self.strict:
                self._metrics.telemetry_dropped.inc(len(batch))
        for it in batch:
            if err is None and it.on_commit is not None:
                it.on_commit()
            if it.done is not None and not it.done.done():
                if err is None:
                    it.done.set_result(None)
                else:
                    it.done.set_exception(err)
