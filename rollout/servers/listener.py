"""The HTTP servers the launcher's commands run themselves (viewer, feed, serve): one way to
listen, to answer only their own Host names with request-head and keep-alive
timeouts (:mod:`gateway.http_edge`), to stop on Ctrl-C or SIGTERM, and to check query
parameters. Their flags and exit codes: ``rollout.cli.verbs``."""

from __future__ import annotations

import signal
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import uvicorn
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Scope

from gateway.http_edge import (
    DEFAULT_KEEP_ALIVE_TIMEOUT_S,
    DEFAULT_REQUEST_HEAD_TIMEOUT_S,
    HostAllowList,
    Refusal,
    server_config,
    with_host_check,
)
from rollout.core.logs import notices
from wire.errors import error_body

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def bad_query_param(
    items: Iterable[tuple[str, str]], known: tuple[str, ...]
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
    busy port fails at once (OSError). A notice warns when ``host`` is not loopback: anyone who
    reaches it can read ``exposes``."""
    if host not in LOOPBACK:
        notices.warning(f"warning: serving on {host}: anyone who reaches it can read {exposes}")
    return socket.create_server(
        (host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET, backlog=128
    )  # connections wait in the backlog until the server accepts them


def url_of(sock: socket.socket) -> str:
    """``http://HOST:PORT/`` of a listening socket (IPv6 hosts in brackets)."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


@dataclass(frozen=True)
class HttpEdge:
    """What a server answers and how long it waits (:mod:`gateway.http_edge`): ``allowed_hosts``
    are Host names answered besides the loopback names and the bind address (``*``: any);
    ``request_head_timeout_s`` closes a connection without a complete request head by then,
    ``keep_alive_timeout_s`` one left idle after an answer."""

    allowed_hosts: tuple[str, ...] = ()
    request_head_timeout_s: float = DEFAULT_REQUEST_HEAD_TIMEOUT_S
    keep_alive_timeout_s: int = DEFAULT_KEEP_ALIVE_TIMEOUT_S


DEFAULT_EDGE = HttpEdge()


def json_refusal(scope: Scope, message: str) -> Response:
    """A refused Host as a 400 in the gateway's (OpenAI's) error shape: the feed's and serve's."""
    return JSONResponse(error_body(400, message, code="host_not_allowed"), status_code=400)


async def run_server(
    app: ASGIApp,
    sock: socket.socket,
    host: str,
    edge: HttpEdge = DEFAULT_EDGE,
    refuse: Refusal = json_refusal,
) -> None:
    """Serve ``app`` with uvicorn on the listening ``sock`` (bound for ``host``) until SIGINT or
    SIGTERM, then return normally (uvicorn re-raises the signal it caught once it has shut down;
    the handlers set here take it, so the caller's cleanup runs instead of the process dying on
    SIGTERM). Only the Host names of ``edge`` (and loopback, and ``host``) are answered, others
    get ``refuse``; its timeouts apply."""
    allowed = HostAllowList.for_server([host, sock.getsockname()[0]], edge.allowed_hosts)
    app = with_host_check(app, allowed, refuse)
    caught: list[int] = []
    previous = {
        sig: signal.signal(sig, lambda s, _f: caught.append(s)) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        server = uvicorn.Server(
            server_config(
                app,
                head_timeout_s=edge.request_head_timeout_s,
                keep_alive_s=edge.keep_alive_timeout_s,
                log_level="warning",
                access_log=False,
            )
        )
        await server.serve(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
