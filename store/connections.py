"""The engines, sessions and threads of one store, shared by its parts (the gateway's batch writer,
shared gateway sessions, the launcher's rows; :class:`store.repo.Store` wires them).

SQLite: a writer and a reader async engine (aiosqlite), plus one sync writer and one sync reader
connection used by a thread of their own for the group commit of the launcher's row writes
(``store.group``) and for short reads between its transactions. PostgreSQL: the async engines only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session

from store.engine import make_engine, make_sync_sqlite_engine, parse_db_url, sqlite_path
from store.group import GroupCommit, Op

_T = TypeVar("_T")


class Connections:
    """Everything a store opens on the database at ``url`` (a user storage URL)."""

    def __init__(self, url: str) -> None:
        self.user_url = url
        self.url = parse_db_url(url)
        self.kind = "sqlite" if self.url.startswith("sqlite") else "postgresql"
        p = sqlite_path(self.url)
        self.path: str | None = str(p) if p else None
        self.writer: AsyncEngine = make_engine(self.url, writer=True)
        self.reader: AsyncEngine = make_engine(self.url, writer=False)
        self.write_session = async_sessionmaker(self.writer, expire_on_commit=False, class_=AsyncSession)
        self.read_session = async_sessionmaker(self.reader, expire_on_commit=False, class_=AsyncSession)
        self.write_lock = asyncio.Lock()
        """Held by this store's write transactions on the writer engine (one writer at a time)."""
        self.group = GroupCommit(self._run_batch)
        """The launcher's row writes: many sessions, one transaction (``store.group``)."""
        path = self.path
        self.sync_writer = make_sync_sqlite_engine(Path(path), writer=True) if path is not None else None
        self.sync_reader = make_sync_sqlite_engine(Path(path), writer=False) if path is not None else None
        self._group_thread: ThreadPoolExecutor | None = None

    def group_executor(self) -> ThreadPoolExecutor:
        """The one thread of the sync SQLite connections (made on first use)."""
        if self._group_thread is None:
            self._group_thread = ThreadPoolExecutor(1, thread_name_prefix="store-group")
        return self._group_thread

    def _sync_batch(self, ops: list[Op]) -> list[Any]:
        assert self.sync_writer is not None
        with Session(self.sync_writer, expire_on_commit=False) as s, s.begin():
            return [op(s) for op in ops]

    async def _run_batch(self, ops: list[Op]) -> list[Any]:
        """Run ``ops`` in one write transaction (``store.group``): for SQLite in one hop to a thread
        of its own with a sync connection, else through the async writer."""
        async with self.write_lock:
            if self.sync_writer is not None:
                return await asyncio.get_running_loop().run_in_executor(
                    self.group_executor(), self._sync_batch, ops
                )
            async with self.write_session() as s, s.begin():
                return await s.run_sync(lambda sync: [op(sync) for op in ops])

    async def read_sync(self, fn: Callable[[Connection], _T]) -> _T:
        """``fn(connection)`` in one read transaction: on SQLite in one hop to the grouped writes'
        thread (between their transactions) on its sync reader connection, else on the async
        reader (``run_sync``)."""
        reader = self.sync_reader
        if reader is not None:

            def read() -> _T:
                with reader.connect() as conn:  # closing it ends the read transaction
                    return fn(conn)

            return await asyncio.get_running_loop().run_in_executor(self.group_executor(), read)
        async with self.reader.connect() as aconn:
            return await aconn.run_sync(fn)

    async def close_group(self) -> None:
        """Wait for the queued row writes, stop their thread, close the sync connections."""
        await self.group.aclose()
        if self._group_thread is not None:
            self._group_thread.shutdown(wait=True)
        for engine in (self.sync_writer, self.sync_reader):
            if engine is not None:
                engine.dispose()

    async def dispose(self) -> None:
        """Dispose both async engines (closes every pooled connection)."""
        await self.writer.dispose()
        await self.reader.dispose()
