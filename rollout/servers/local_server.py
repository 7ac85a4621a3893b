"""The HTTP servers the launcher's commands run themselves (viewer, feed, serve): one way to
listen, to say where, to answer only their own Host names with request-head and keep-alive
timeouts (:mod:`gateway.http_edge`), to stop on Ctrl-C or SIGTERM, and to check query
parameters."""

from __future__ import annotations

import argparse
import asyncio
import signal
import socket
import sys
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import uvicorn
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Scope

from gateway.errors import error_body
from gateway.http_edge import (
    DEFAULT_KEEP_ALIVE_TIMEOUT_S,
    DEFAULT_REQUEST_HEAD_TIMEOUT_S,
    HostAllowList,
    Refusal,
    server_config,
    with_host_check,
)
from rollout.core.argtypes import finite_float, int_at_least

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


def add_edge_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of :class:`HttpEdge` on a server command's parser."""
    parser.add_argument("--allowed-host", action="append", default=[], dest="allowed_hosts", type=_host_entry,
                        metavar="NAME[:PORT]", help="a Host name to answer besides loopback and --host "
                        "(repeatable; '*': any, which lets web pages read it by DNS rebinding)")
    parser.add_argument("--request-head-timeout-s", type=finite_float(positive=True),
                        default=DEFAULT_REQUEST_HEAD_TIMEOUT_S, help="close a connection that has not sent a "
                        f"complete request head within this time (default {DEFAULT_REQUEST_HEAD_TIMEOUT_S:g} s)")
    parser.add_argument("--keep-alive-timeout-s", type=int_at_least(1), default=DEFAULT_KEEP_ALIVE_TIMEOUT_S,
                        help=f"close a connection idle this long after an answer (default {DEFAULT_KEEP_ALIVE_TIMEOUT_S} s)")


def _host_entry(value: str) -> str:
    try:
        HostAllowList([value])
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return value


def edge_of(args: argparse.Namespace) -> HttpEdge:
    """The :class:`HttpEdge` of parsed :func:`add_edge_flags` flags."""
    return HttpEdge(tuple(args.allowed_hosts), args.request_head_timeout_s, args.keep_alive_timeout_s)


def json_refusal(scope: Scope, message: str) -> Response:
    """A refused Host as a 400 in the gateway's (OpenAI's) error shape: the feed's and serve's."""
    return JSONResponse(error_body(400, message, code="host_not_allowed"), status_code=400)


async def run_server(app: ASGIApp, sock: socket.socket, host: str, edge: HttpEdge = DEFAULT_EDGE,
                     refuse: Refusal = json_refusal) -> None:
    """Serve ``app`` with uvicorn on the listening ``sock`` (bound for ``host``) until SIGINT or
    SIGTERM, then return normally (uvicorn re-raises the signal it caught once it has shut down;
    the handlers set here take it, so the caller's cleanup runs instead of the process dying on
    SIGTERM). Only the Host names of ``edge`` (and loopback, and ``host``) are answered, others
    get ``refuse``; its timeouts apply."""
    allowed = HostAllowList.for_server([host, sock.getsockname()[0]], edge.allowed_hosts)
    app = with_host_check(app, allowed, refuse)
    caught: list[int] = []
    previous = {sig: signal.signal(sig, lambda s, _f: caught.append(s)) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server = uvicorn.Server(server_config(app, head_timeout_s=edge.request_head_timeout_s,
                                              keep_alive_s=edge.keep_alive_timeout_s, log_level="warning",
                                              access_log=False))
        await server.serve(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
