"""The tables at start: created when missing, and the columns an older version's database lacks
added in place. Run by :meth:`store.Store.init` in the gateway and in the launcher."""

from __future__ import annotations

from sqlalchemy import Connection, inspect, text
from sqlalchemy.schema import CreateColumn
from sqlmodel import SQLModel

import store.models  # noqa: F401  (the tables are registered in SQLModel.metadata on import)

_SCHEMA_LOCK_KEY = 0x726F6C6C  # PostgreSQL advisory lock held while the tables are created or upgraded


class SchemaError(RuntimeError):
    """The database has a table of ours without a column this version needs, and the column
    cannot be added in place (NOT NULL without a server default)."""


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def add_missing_columns(conn: Connection) -> list[str]:
    """Add to every table of ours the columns it lacks (``ALTER TABLE ... ADD COLUMN``, with the
    column's server default), so a database written by an older version keeps working. Returns
    the ``table.column`` names added. Raises SchemaError for a missing NOT NULL column without a
    server default (no value for the existing rows)."""
    insp = inspect(conn)
    existing_tables = set(insp.get_table_names())
    added: list[str] = []
    for table in SQLModel.metadata.sorted_tables:
        if table.name not in existing_tables:
            continue
        have = {c["name"] for c in insp.get_columns(table.name)}
        for column in table.columns:
            if column.name in have:
                continue
            if not column.nullable and column.server_default is None:
                raise SchemaError(
                    f"table {table.name} has no column {column.name} (NOT NULL, no default): "
                    "this database was made by an incompatible version"
                )
            ddl = CreateColumn(column).compile(dialect=conn.dialect)
            conn.execute(text(f"ALTER TABLE {_q(table.name)} ADD COLUMN {ddl}"))
            added.append(f"{table.name}.{column.name}")
    return added


def create_or_upgrade(conn: Connection) -> list[str]:
    """In the caller's write transaction: create the missing tables, then
    :func:`add_missing_columns` (returns what it added). On PostgreSQL an advisory lock first, so
    two processes starting at once run their DDL one after the other."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _SCHEMA_LOCK_KEY})
    SQLModel.metadata.create_all(conn)
    return add_missing_columns(conn)
