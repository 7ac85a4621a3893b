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


def open_store(url: str) -> Store:
    """A Store for ``url``; SetupError for bad URLs or a missing database driver."""
    try:
        return Store(url)
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
