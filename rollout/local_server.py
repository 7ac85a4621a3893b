"""The HTTP servers the launcher's commands run themselves (viewer, feed, serve): one way to
listen, to say where, and to stop on Ctrl-C or SIGTERM."""

from __future__ import annotations

import signal
import socket
import sys

import uvicorn
from starlette.types import ASGIApp

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def listen(host: str, port: int, *, exposes: str) -> socket.socket:
    """A listening socket on ``host:port`` (0: a free port), bound before the app starts so a
    busy port fails at once (OSError). Warns on stderr when ``host`` is not loopback: anyone who
    reaches it can read ``exposes``."""
    if host not in LOOPBACK:
        print(f"warning: serving on {host}: anyone who reaches it can read {exposes}", file=sys.stderr)
    return socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET,
                                backlog=128)  # connections wait in the backlog until the server accepts them


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
