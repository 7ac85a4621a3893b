"""Group commit for the launcher's row writes: many concurrent sessions, one transaction.

Each write is an operation (an async function of an ``AsyncSession``). Operations queued while a
transaction runs go into the next one together; each caller's ``run`` returns once the
transaction holding its operation committed (so nothing is reported written before it is), with
its own operation's result. A transaction that fails is redone operation by operation, so an error
reaches the caller whose operation caused it, and the others still commit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncSession

T = TypeVar("T")
Op = Callable[[AsyncSession], Awaitable[Any]]


class GroupCommit:
    """``await run(op)``: ``op`` runs in a transaction opened by ``begin()`` (an async context
    manager yielding an ``AsyncSession`` in a transaction, committed at its exit), possibly beside
    other callers' operations. At most ``max_batch`` operations per transaction."""

    def __init__(self, begin: Callable[[], AbstractAsyncContextManager[AsyncSession]], max_batch: int = 256) -> None:
        self._begin = begin
        self._max_batch = max_batch
        self._pending: list[tuple[Op, asyncio.Future[Any]]] = []
        self._task: asyncio.Task[None] | None = None

    async def run(self, op: Callable[[AsyncSession], Awaitable[T]]) -> T:
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
                batch, self._pending = self._pending[: self._max_batch], self._pending[self._max_batch:]
                await self._commit(batch)
        except BaseException as e:  # cancelled (the loop ends): no caller waits for ever
            for _, fut in [*batch, *self._pending]:
                if not fut.done():
                    fut.set_exception(e if isinstance(e, Exception) else RuntimeError(f"write abandoned: {e!r}"))
            self._pending = []
            raise

    async def _commit(self, batch: list[tuple[Op, asyncio.Future[Any]]]) -> None:
        try:
            results = await self._transaction(batch)
        except Exception:
            for op, fut in batch:  # find whose operation failed; the others commit alone
                await self._one(op, fut)
            return
        for (_, fut), r in zip(batch, results, strict=True):
            if not fut.done():
                fut.set_result(r)

    async def _transaction(self, batch: list[tuple[Op, asyncio.Future[Any]]]) -> list[Any]:
        async with self._begin() as s:
            return [await op(s) for op, _ in batch]

    async def _one(self, op: Op, fut: asyncio.Future[Any]) -> None:
        try:
            [r] = await self._transaction([(op, fut)])
        except Exception as e:
            if not fut.done():
                fut.set_exception(e)
            return
        if not fut.done():
            fut.set_result(r)

    async def aclose(self) -> None:
        """Wait for the writes queued so far."""
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
