"""Group commit for the launcher's row writes: many concurrent sessions, one transaction.

Each write is an operation: a plain function of a (sync) ORM ``Session``. Operations queued while a
transaction runs go into the next one together, run by the store's ``run_batch`` (for SQLite, one
thread hop per batch on a sync connection). Each caller's ``run`` returns once the transaction
holding its operation committed (nothing is reported written before it is), with its own
operation's result. A transaction that fails is redone operation by operation, so an error reaches
the caller whose operation caused it, and the others still commit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from sqlalchemy.orm import Session

T = TypeVar("T")
Op = Callable[[Session], Any]
RunBatch = Callable[[list[Op]], Awaitable[list[Any]]]
"""Runs operations in order in one transaction, committed before it returns their results."""


class GroupCommit:
    """``await run(op)``: ``op`` runs in a transaction of ``run_batch``, possibly beside other
    callers' operations; at most ``max_batch`` operations per transaction."""

    def __init__(self, run_batch: RunBatch, max_batch: int = 256) -> None:
        self._run_batch = run_batch
        self._max_batch = max_batch
        self._pending: list[tuple[Op, asyncio.Future[Any]]] = []
        self._task: asyncio.Task[None] | None = None

    async def run(self, op: Callable[[Session], T]) -> T:
        """Run ``op`` in a committed transaction and return its result; raises what ``op`` (or
        its commit) raised. Cancelling the caller does not cancel the write once queued."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.append((op, fut))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain(), name="store-group-commit")
        result: T = await asyncio.shield(fut)
        return result

    async def _drain(self) -> None:
        batch: list[tuple[Op, asyncio.Future[Any]]] = []
        try:
            while self._pending:
                batch, self._pending = self._pending[: self._max_batch], self._pending[self._max_batch :]
                await self._commit(batch)
        except BaseException as e:  # cancelled (the loop ends): no caller waits for ever
            for _, fut in [*batch, *self._pending]:
                if not fut.done():
                    fut.set_exception(
                        e if isinstance(e, Exception) else RuntimeError(f"write abandoned: {e!r}")
                    )
            self._pending = []
            raise

    async def _commit(self, batch: list[tuple[Op, asyncio.Future[Any]]]) -> None:
        try:
            results = await self._run_batch([op for op, _ in batch])
        except Exception as e:
            if len(batch) == 1:
                if not batch[0][1].done():
                    batch[0][1].set_exception(e)
                return
            for one in batch:  # find whose operation failed; the others commit alone
                await self._commit([one])
            return
        for (_, fut), r in zip(batch, results, strict=True):
            if not fut.done():
                fut.set_result(r)

    async def aclose(self) -> None:
        """Wait for the writes queued so far."""
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
