"""``python -m gateway --config configs/gateway.yaml [--host H] [--port P] [--db-url URL]``.

Flags override the config file. Exit code 2 on a config error, 3 when the address cannot be bound
(checked before the app starts, so such a gateway never touches the store), 4 when the store
cannot be opened (checked before serving) or the app fails to start."""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import sys

import uvicorn

from gateway.app import create_app
from gateway.http_edge import server_config
from gateway.settings import ConfigError, GatewaySettings, load_settings
from store import SchemaError, Store, StoreUnavailable


async def _check_store(settings: GatewaySettings) -> None:
    """Open the store (tables created or upgraded) and close it: StoreUnavailable / SchemaError."""
    store = Store(settings.storage_config.db_url)
    try:
        await store.init()
    finally:
        await store.close()


def uvicorn_config(settings: GatewaySettings) -> uvicorn.Config:
    """The uvicorn config serving the gateway app of ``settings``, with its request-head and
    keep-alive timeouts (:mod:`gateway.http_edge`)."""
    return server_config(
        create_app(settings),
        head_timeout_s=settings.request_head_timeout_s,
        keep_alive_s=settings.keep_alive_timeout_s,
        log_level=settings.log_level,
        access_log=False,
        timeout_graceful_shutdown=10,
    )


def managed_warnings(settings: GatewaySettings) -> list[str]:
    """One line per route whose model server the launcher starts (``managed``): a gateway run on
    its own does not, so the route answers only once something serves its ``base_url``."""
    return [
        f"warning: route {key!r} is served by a model server the launcher starts (managed: "
        f"{route.managed.kind}); this gateway does not start it: start one on {route.base_url} "
        "(configs/gateway.yaml says how) or its calls fail"
        for key, route in settings.llm_routes.items()
        if route.managed is not None
    ]


def main(argv: list[str] | None = None) -> int:
    """Parse flags, load the config, serve until interrupted."""
    ap = argparse.ArgumentParser(
        prog="python -m gateway", description="Session gateway: records every model call."
    )
    ap.add_argument("--config", default="configs/gateway.yaml", help="gateway YAML (default: %(default)s)")
    ap.add_argument("--host", help="override listen_host")
    ap.add_argument("--port", type=int, help="override listen_port (0..65535; 0: any free port)")
    ap.add_argument(
        "--db-url",
        help="override storage_config.db_url, e.g. env_trajs.db, sqlite://env_trajs.db or "
        "postgresql://user:pw@host/db",
    )
    args = ap.parse_args(argv)
    try:
        settings = load_settings(args.config, host=args.host, port=args.port, db_url=args.db_url)
    except ConfigError as e:
        for line in str(e).splitlines():  # one line per problem
            print(f"error: {line}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    host, port = settings.listen_host, settings.listen_port
    try:  # bound before the app starts: a gateway that cannot listen must not touch the store
        sock = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    except OSError as e:
        print(f"error: cannot listen on {host}:{port}: {e}", file=sys.stderr)
        return 3
    try:
        asyncio.run(_check_store(settings))
    except (StoreUnavailable, SchemaError) as e:
        sock.close()
        print(f"error: {e}", file=sys.stderr)
        return 4
    for line in managed_warnings(settings):
        print(line, file=sys.stderr)
    server = uvicorn.Server(uvicorn_config(settings))
    server.run(sockets=[sock])
    return 0 if server.started else 4


if __name__ == "__main__":
    sys.exit(main())
