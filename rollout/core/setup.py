"""What every job needs before its first session: the store opened, the gateway config read; a
problem is a ``SetupError`` (the CLI prints it and exits 1)."""

from __future__ import annotations

from pathlib import Path

from gateway.settings import ConfigError, GatewaySettings, load_settings
from rollout.errors import RolloutError
from store import DbUrlError, SchemaError, Store, StoreUnavailable


class SetupError(RolloutError, RuntimeError):
    """The job cannot start; the message tells the user what to fix."""


def load_gateway_settings(path: Path) -> GatewaySettings:
    """The gateway config file, as SetupError on problems."""
    try:
        return load_settings(path)
    except ConfigError as e:
        raise SetupError(str(e)) from e


def open_store(url: str, *, existing: bool = False) -> Store:
    """A Store for ``url``; SetupError for bad URLs or a missing database driver, and with
    ``existing`` for a SQLite file that is not there (a resume or a regrade never makes one)."""
    try:
        store = Store(url)
        if existing and store.path is not None and not Path(store.path).is_file():
            raise SetupError(f"no trajectory store at {store.path} (pass the job's --db-path)")
        return store
    except DbUrlError as e:
        raise SetupError(str(e)) from e
    except ModuleNotFoundError as e:
        raise SetupError(
            f"--db-path {url}: the database driver is not installed ({e.name}); "
            "pip install asyncpg for PostgreSQL"
        ) from e


async def init_store(store: Store) -> None:
    """``store.init()``, a database that cannot be opened (or upgraded) as SetupError."""
    try:
        await store.init()
    except (StoreUnavailable, SchemaError) as e:
        raise SetupError(str(e)) from e
