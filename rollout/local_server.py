"""The HTTP servers the launcher's commands run themselves (viewer, feed, serve): one way to
listen, to say where, to stop on Ctrl-C or SIGTERM, and to check query parameters."""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, Literal

import uvicorn
from starlette.types import ASGIApp

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def bad_query_param(items: Iterable[tuple[str, str]], known: tuple[str, ...]
                    ) -> tuple[Literal["unknown", "repeated"], str] | None:
    """The first query parameter of ``items`` (``request.query_params.multi_items()``) that is not
    in ``known`` (a typo would otherwise fall back to the default silently) or is given again
    (which one counts would be a guess), with what is wrong; None when all are fine."""
    seen: set[str] = set()
    for name, _ in items:
        if name not in known:
            return "unknown", name
        if name in seen:
            return "repeated", name
        seen.add(name)
    return None


def listen(host: str, port: int, *, exposes: str) -> socket.socket:
    """A listening socket on ``host:port`` (0: a free port), bound before the app starts so a
    busy port fails at once (OSError). Warns on stderr when ``host`` is not loopback: anyone who
    reaches it can read ``exposes``."""
    if host not in LOOPBACK:
        print(f"warning: serving on {host}: anyone who reaches it can read {exposes}", file=sys.stderr)
    return socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET,
                                backlog=128)  # connections wait in the backlog until the server accepts them


def run_command(start: Callable[[], Coroutine[Any, Any, object]], host: str, port: int,
                setup_errors: tuple[type[Exception], ...]) -> int:
    """Run a server command (``start()`` builds its coroutine, inside the error handling) until it
    stops; the exit code: 0 when stopped (Ctrl-C, SIGTERM), 1 with ``error: ...`` on stderr for
    one of ``setup_errors`` or a port it cannot listen on (OSError)."""
    try:
        asyncio.run(start())
    except setup_errors as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"error: cannot listen on {host}:{port}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    return 0


def url_of(sock: socket.socket) -> str:
    """``http://HOST:PORT/`` of a listening socket (IPv6 hosts in brackets)."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


async def run_server(app: ASGIApp, sock: socket.socket) -> None:
    """Serve ``app`` with uvicorn on the listening ``sock`` until SIGINT or SIGTERM, then return
    normally (uvicorn re-raises the signal it caught once it has shut down; the handlers set
    here take it, so the caller's cleanup runs instead of the process dying on SIGTERM)."""
    caught: list[int] = []
    previous = {sig: signal.signal(sig, lambda s, _f: caught.append(s)) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
        await server.serve(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
