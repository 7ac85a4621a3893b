"""Opening the store for reading (the viewer and the report never create or write rows)."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from rollout.errors import RolloutError
from store.engine import DbUrlError, make_engine, parse_db_url, sqlite_path
from store.queries import ViewerQueries


class ViewerError(RolloutError, RuntimeError):
    """The store cannot be read (bad URL, no such file, not a trajectory store), or the report
    cannot be written where asked; the message says why."""


async def open_queries(url: str) -> tuple[AsyncEngine, ViewerQueries]:
    """An engine on ``url`` (``sqlite://PATH`` or ``postgresql://...``) and its queries. A SQLite
    file must exist already and hold the launcher's tables. Raises ViewerError otherwise."""
    try:
        async_url = parse_db_url(url)
    except DbUrlError as e:
        raise ViewerError(str(e)) from e
    path = sqlite_path(async_url)
    if path is not None and not path.is_file():
        raise ViewerError(f"no trajectory store at {path} (run a job first, or pass --db-path)")
    try:
        engine = make_engine(async_url, writer=False)
    except DbUrlError as e:  # a missing driver
        raise ViewerError(f"--db-path {url}: {e}") from e
    except ModuleNotFoundError as e:
        raise ViewerError(f"--db-path {url}: the database driver is not installed ({e.name})") from e
    queries = ViewerQueries(engine)
    try:
        ok = await queries.has_store()
    except Exception as e:
        await engine.dispose()
        orig = getattr(e, "orig", None)  # the driver's error, without SQLAlchemy's statement and link
        raise ViewerError(f"cannot read {url}: {type(orig or e).__name__}: {orig or e}") from e
    if not ok:
        await engine.dispose()
        raise ViewerError(f"{url} holds no job_environments/session_steps tables: not a trajectory store")
    return engine, queries
