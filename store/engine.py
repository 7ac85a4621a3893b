"""Database URLs and engines. SQLite: WAL and a long ``busy_timeout`` on every connection; writes
start with ``BEGIN IMMEDIATE`` (no ``SQLITE_BUSY`` at once for a read-then-write); reads use a
second engine, read only on a file this process cannot write. PostgreSQL: asyncpg (``.[postgres]``).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import sqlite3
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote_plus

from sqlalchemy import URL, Engine, create_engine, event, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import StaticPool

BUSY_TIMEOUT_MS = 60_000
SQLITE_PAGE_SIZE = 4096
"""The page size of a SQLite file this store creates (an existing file keeps its own; docs/storage.md)."""


REDACTED = "***"
_SECRET_PARAM = re.compile(r"pass|pwd|secret|token|key|auth|credential|sig", re.IGNORECASE)


def _split_url(url: str) -> tuple[str, str | None, str, str, str] | None:
    """``(scheme://, userinfo or None, host and path, query, fragment)`` of ``url`` (query and
    fragment with their ``?`` / ``#``), or None when it has no ``://``. The user info ends at the
    last ``@`` before the query (a password may hold ``/`` or ``@``)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return None
    rest, hash_, fragment = rest.partition("#")
    rest, qmark, query = rest.partition("?")
    userinfo, at, hostpath = rest.rpartition("@")
    return scheme + sep, userinfo if at else None, hostpath, qmark + query, hash_ + fragment


def _secret_param(part: str) -> bool:
    return bool(_SECRET_PARAM.search(unquote_plus(part.partition("=")[0])))


def redact_url(url: str, *, drop_user: bool = False) -> str:
    """``url`` with the password of its user info (all of it with ``drop_user``) and every
    credential-like query parameter as ``***``; a string without ``://`` is returned as is."""
    parts = _split_url(url)
    if parts is None:
        return url
    scheme, userinfo, hostpath, query, fragment = parts
    user = ""
    if userinfo is not None and not drop_user:
        name, colon, _ = userinfo.partition(":")
        user = f"{name}:{REDACTED}@" if colon else f"{name}@"
    if query:
        query = "?" + "&".join(
            f"{p.partition('=')[0]}={REDACTED}" if _secret_param(p) else p for p in query[1:].split("&")
        )
    return scheme + user + hostpath + query + fragment


def url_secrets(url: str) -> list[str]:
    """The credential values ``url`` holds (what :func:`redact_url` hides), raw and
    percent-decoded, longest first; for :func:`hide_secrets`."""
    parts = _split_url(url)
    if parts is None:
        return []
    _, userinfo, _, query, _ = parts
    found: list[str] = []
    if userinfo is not None and ":" in userinfo:
        found.append(userinfo.partition(":")[2])
    if query:
        found += [p.partition("=")[2] for p in query[1:].split("&") if _secret_param(p)]
    values = {v for raw in found for v in (raw, unquote_plus(raw)) if v}
    return sorted(values, key=len, reverse=True)


def hide_secrets(text: str, *urls: str) -> str:
    """``text`` (an error, a log line) with every credential of ``urls`` as ``***``."""
    for url in urls:
        for secret in url_secrets(url):
            text = text.replace(secret, REDACTED)
    return text


class DbUrlError(ValueError):
    """The storage URL is not ``sqlite://PATH``, ``sqlite:///ABS``, ``sqlite+aiosqlite://...`` or
    ``postgresql://...``."""


def shown_url(url: str) -> str:
    """The storage URL as printed, the same from any folder: a SQLite file's absolute path
    (``sqlite:///abs.db``), PostgreSQL without credentials; as given when it does not parse."""
    try:
        parsed = parse_db_url(url)
    except DbUrlError:
        return url
    if parsed.startswith("sqlite"):
        return "sqlite://" + (make_url(parsed).database or "")
    return "postgresql://" + redact_url(parsed, drop_user=True).split("://", 1)[1]


def parse_db_url(url: str) -> str:
    """A user storage URL as a SQLAlchemy async URL: ``sqlite://rel.db``, ``sqlite:///abs.db`` or a plain
    path give ``sqlite+aiosqlite:///<abs path>``; ``postgresql://`` gives ``postgresql+asyncpg://``.
    Raises DbUrlError otherwise, or for a SQLite path whose folder is missing or that is a folder.
    (Never opens the file: closing a descriptor of it would drop this process's SQLite locks.)"""
    if url.startswith("sqlite+aiosqlite:///"):
        url = "sqlite:///" + (make_url(url).database or "")
    if url.startswith("sqlite://") or ("://" not in url and url.strip()):
        rest = url[len("sqlite://") :] if url.startswith("sqlite://") else url
        if rest.startswith("//"):  # sqlite:////abs -> /abs
            rest = rest[1:]
        if not rest or rest == "/":
            raise DbUrlError(f"no database path in {url!r}")
        if rest == ":memory:":
            raise DbUrlError("an in-memory SQLite database cannot be shared by gateway and launcher")
        path = Path(rest).expanduser()
        if not path.is_absolute():
            path = Path.cwd() / path
        path = path.resolve()
        if path.is_dir():
            raise DbUrlError(f"storage {url!r}: {path} is a folder, not a SQLite file")
        if not path.parent.is_dir():
            raise DbUrlError(
                f"storage {url!r}: the folder {path.parent} of the SQLite file does not exist "
                "(create it first)"
            )
        # a URL object, so that ``?``, ``%`` or ``#`` in the path stay part of the file name
        return URL.create("sqlite+aiosqlite", database=str(path)).render_as_string(hide_password=False)
    if url.startswith(("postgresql://", "postgres://")):
        return "postgresql+asyncpg://" + url.split("://", 1)[1]
    if url.startswith("postgresql+asyncpg://"):
        return url
    raise DbUrlError(
        f"unsupported storage URL {redact_url(url)!r}: use a file path, sqlite://PATH or postgresql://..."
    )


def sqlite_path(async_url: str) -> Path | None:
    """The file path of a ``sqlite+aiosqlite:///`` URL, or None for other databases."""
    if not async_url.startswith("sqlite+aiosqlite:///"):
        return None
    return Path(make_url(async_url).database or "")


def _json_default(obj: Any) -> Any:
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def _json_floats(obj: Any) -> Any:
    """Replace non-finite floats (which JSON cannot represent) by their string names."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return repr(obj)
    if isinstance(obj, dict):
        return {k: _json_floats(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_json_floats(v) for v in obj]
    return obj


def json_dumps(obj: Any) -> str:
    """Serializer for JSON columns: strict JSON (NaN/Infinity as 'nan'/'inf'); a value holding a
    lone surrogate is written with ``\\uXXXX`` escapes (UTF-8 cannot carry it) so its row is stored exactly."""
    try:
        text = json.dumps(obj, ensure_ascii=False, allow_nan=False, default=_json_default)
    except ValueError:
        obj = _json_floats(obj)
        text = json.dumps(obj, ensure_ascii=False, allow_nan=False, default=_json_default)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(obj, ensure_ascii=True, allow_nan=False, default=_json_default)
    return text


def _sqlite_connection(dbapi_conn: Any, _record: Any) -> None:
    """Every SQLite connection: page size (before WAL), WAL, busy timeout, ``synchronous=NORMAL``,
    no implicit transactions (we emit ``BEGIN`` ourselves)."""
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    cur.execute(f"PRAGMA page_size={SQLITE_PAGE_SIZE}")
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


def sqlite_read_only(path: Path) -> bool:
    """Whether the SQLite file ``path`` exists and this process cannot write it or its folder."""
    return path.is_file() and not (os.access(path, os.W_OK) and os.access(path.parent, os.W_OK))


def read_only_uri(path: Path) -> str:
    """The URI opening ``path`` read only (``mode=ro``, plus ``immutable=1`` unless a live WAL is beside it)."""
    live_wal = all(path.with_name(path.name + end).exists() for end in ("-wal", "-shm"))
    return f"file:{quote(str(path.absolute()))}?mode=ro{'' if live_wal else '&immutable=1'}"


def make_sync_sqlite_engine(path: Path, *, writer: bool) -> Engine:
    """A one-connection sync engine on ``path`` set up as the async ones (``store.group``)."""
    begin_sql = "BEGIN IMMEDIATE" if writer else "BEGIN"
    kw: dict[str, Any] = {}
    if not writer and sqlite_read_only(path):
        uri = read_only_uri(path)
        kw["creator"] = lambda: sqlite3.connect(
            uri, uri=True, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False
        )
    engine = create_engine(
        f"sqlite:///{path}",
        json_serializer=json_dumps,
        poolclass=StaticPool,
        connect_args={"timeout": BUSY_TIMEOUT_MS / 1000, "check_same_thread": False},
        **kw,
    )

    event.listen(engine, "connect", _sqlite_connection)

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql(begin_sql)

    return engine


def make_engine(async_url: str, *, writer: bool) -> AsyncEngine:
    """An async engine; SQLite: as :func:`_sqlite_connection`, ``BEGIN IMMEDIATE`` for the writer."""
    if async_url.startswith("sqlite"):
        kw: dict[str, Any] = {}
        path = sqlite_path(async_url)
        if not writer and path is not None and sqlite_read_only(path):
            import aiosqlite  # the driver SQLAlchemy loads for these URLs

            uri = read_only_uri(path)
            kw["async_creator"] = lambda: aiosqlite.connect(uri, uri=True, timeout=BUSY_TIMEOUT_MS / 1000)
        engine = create_async_engine(
            async_url,
            json_serializer=json_dumps,
            connect_args={"timeout": BUSY_TIMEOUT_MS / 1000},
            pool_size=1 if writer else 4,
            max_overflow=0 if writer else 4,
            **kw,
        )
        begin_sql = "BEGIN IMMEDIATE" if writer else "BEGIN"

        event.listen(engine.sync_engine, "connect", _sqlite_connection)

        @event.listens_for(engine.sync_engine, "begin")
        def _on_begin(conn: Any) -> None:
            conn.exec_driver_sql(begin_sql)

        return engine
    if async_url.startswith("postgresql+asyncpg") and importlib.util.find_spec("asyncpg") is None:
        raise DbUrlError(
            "a postgresql:// storage URL needs the asyncpg driver, which is not installed: "
            "pip install 'rollout-factory[postgres]' (or pip install asyncpg)"
        )
    # PostgreSQL: READ COMMITTED (its default); the writer's pool also serves the session
    # reservations of shared gateways (store.repo.Store.reserve_step), one short transaction each
    return create_async_engine(
        async_url,
        json_serializer=json_dumps,
        pool_pre_ping=True,
        pool_size=8 if writer else 4,
        max_overflow=8 if writer else 4,
    )
