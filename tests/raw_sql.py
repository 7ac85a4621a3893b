"""Plain SQL on a test store, below the Store class (sqlite3 for SQLite, asyncpg for PostgreSQL):
to build a database as an older version left it, or to read back exactly what was stored.

Queries use ``?`` placeholders on both backends (turned into ``$1, $2, ...`` for asyncpg)."""

from __future__ import annotations

import asyncio
import re
import sqlite3
import threading
from typing import Any

from store import parse_db_url
from store.engine import sqlite_path


def _pg_query(query: str) -> str:
    n = 0

    def repl(_m: re.Match[str]) -> str:
        nonlocal n
        n += 1
        return f"${n}"

    return re.sub(r"\?", repl, query)


async def raw_sql(url: str, query: str, *params: Any, records: bool = False) -> list[Any]:
    """Run one statement on the store at ``url`` (autocommit); its rows as dicts, or with
    ``records`` as the driver's rows (``sqlite3.Row`` / ``asyncpg.Record``: by name and as tuples)."""
    path = sqlite_path(parse_db_url(url))
    if path is not None:
        con = sqlite3.connect(path, timeout=30, isolation_level=None)
        try:
            con.row_factory = sqlite3.Row
            rows = con.execute(query, params).fetchall()
            return rows if records else [dict(r) for r in rows]
        finally:
            con.close()
    import asyncpg

    pg = await asyncpg.connect(url)
    try:
        got = await pg.fetch(_pg_query(query), *params)
        return list(got) if records else [dict(r) for r in got]
    finally:
        await pg.close()


def raw_sql_sync(url: str, query: str, *params: Any, records: bool = False) -> list[Any]:
    """:func:`raw_sql` from synchronous code, also while an event loop runs on this thread (the
    statement then runs on a loop of its own in another thread)."""
    out: list[list[Any]] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            out.append(asyncio.run(raw_sql(url, query, *params, records=records)))
        except BaseException as e:  # handed to the caller below
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if errors:
        raise errors[0]
    return out[0]
