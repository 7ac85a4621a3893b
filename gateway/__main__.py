"""``python -m gateway --config configs/gateway.yaml [--host H] [--port P] [--db-url URL]``.

Flags override the config file. Exit code 2 on a config error."""

from __future__ import annotations

import argparse
import logging
import sys

import uvicorn

from gateway.app import create_app
from gateway.settings import ConfigError, load_settings


def main(argv: list[str] | None = None) -> int:
    """Parse flags, load the config, serve until interrupted."""
    ap = argparse.ArgumentParser(prog="python -m gateway", description="Session gateway: records every model call.")
    ap.add_argument("--config", default="configs/gateway.yaml", help="gateway YAML (default: %(default)s)")
    ap.add_argument("--host", help="override listen_host")
    ap.add_argument("--port", type=int, help="override listen_port")
    ap.add_argument("--db-url", help="override storage_config.db_url, e.g. sqlite://env_trajs.db or "
                    "postgresql://user:pw@host/db")
    args = ap.parse_args(argv)
    try:
        settings = load_settings(args.config)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    updates: dict[str, object] = {}
    if args.host:
        updates["listen_host"] = args.host
    if args.port is not None:
        updates["listen_port"] = args.port
    if args.db_url:
        updates["storage_config"] = settings.storage_config.model_copy(update={"db_url": args.db_url})
        updates["storage_type"] = "postgresql" if args.db_url.startswith("postgres") else "sqlite"
    settings = settings.model_copy(update=updates)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvicorn.run(create_app(settings), host=settings.listen_host, port=settings.listen_port,
                log_level=settings.log_level, access_log=False, timeout_graceful_shutdown=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
