"""The gateway bridge of a sandboxed session: a socket served by the launcher that relays HTTP
requests to the gateway, only those under the session's own URL prefix.

The socket is the session's loopback port itself, listening in the sandbox's network (made before
the sandbox, ``rollout.sandbox.netns``); or, where that network cannot be made, a Unix socket bound
into the sandbox, which the forwarder inside (``rollout/contract/forwarder.py``) relays its
loopback port to.
Each request is parsed (h11) and its target checked: ``<prefix>`` or ``<prefix>/...`` (the
prefix is the session URL's path, ``/v1/sessions/<sid>``), a path of printable ASCII without
``%``, ``#`` or ``\\``, no dot segments or ``//``, no fragment, not ``<prefix>/close`` in any spelling (case, trailing dots or
slash, ``;``; the launcher closes sessions). Anything else gets a 403 and the connection is
closed; so a runtime cannot make sessionless (unrecorded) calls or reach another session. Answers
are relayed byte for byte as they arrive (streams stay streams).

The bridge is the launcher's own view of whether the gateway could be reached: ``unreachable``
says why its last connection to the gateway failed (None once one succeeds), evidence the
runtime cannot write (docs/trust-model.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import re
import socket
import ssl
from pathlib import Path
from urllib.parse import urlsplit

import h11

from rollout.errors import RolloutError

log = logging.getLogger(__name__)


_UNREACHABLE_ERRNOS = frozenset(
    {
        errno.ECONNREFUSED,
        errno.ECONNRESET,
        errno.ECONNABORTED,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        errno.EHOSTDOWN,
        errno.ENETDOWN,
        errno.ETIMEDOUT,
    }
)


def gateway_down(exc: OSError) -> bool:
    """Whether a failed connection to the gateway says the gateway could not be reached (refused,
    reset, no route, timed out, name not resolved), not that this process ran out of something
    (file descriptors, memory: a runtime could cause that by opening connections). asyncio's
    ``Multiple exceptions`` error (every address of a host name failed) counts when each of them did."""
    if isinstance(exc, (TimeoutError, socket.gaierror)) or exc.errno in _UNREACHABLE_ERRNOS:
        return True
    codes = [int(c) for c in re.findall(r"\[Errno (\d+)\]", str(exc))] if exc.errno is None else []
    return bool(codes) and all(c in _UNREACHABLE_ERRNOS for c in codes)


class BridgeError(RolloutError, RuntimeError):
    """The bridge cannot be set up (bad gateway URL, socket path unusable)."""


def gateway_address(url: str) -> tuple[str, int, bool, str]:
    """(host, port, tls, path) of a session URL such as ``http://127.0.0.1:8000/v1/sessions/s1``.
    Raises BridgeError for a scheme other than http/https or a URL without a host."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BridgeError(f"cannot bridge to gateway URL {url!r}: need http(s)://HOST[:PORT]/...")
    tls = parts.scheme == "https"
    return parts.hostname, parts.port or (443 if tls else 80), tls, parts.path.rstrip("/")


_PLAIN_PATH = re.compile(r"[A-Za-z0-9\-._~/!$&'()*+,;=:@]*")
"""What a request path may hold: no ``%`` (an encoded ``/``, ``.`` or ``#`` a server may decode),
no ``\\``, nothing outside printable ASCII."""
_PLAIN_QUERY = re.compile(r"[\x21-\x7e]*")


def refusal(target: bytes, prefix: str) -> str | None:
    """Why a request target is refused (None: allowed), see the module docstring."""
    path, _, query = target.decode("latin-1").partition("?")
    if "#" in query or not _PLAIN_QUERY.fullmatch(query):
        return f"request target {target.decode('latin-1')[:200]!r} has a fragment or a byte no URL holds"
    if not _PLAIN_PATH.fullmatch(path) or any(seg in (".", "..") for seg in path.split("/")) or "//" in path:
        return f"request path {path[:200]!r} is not a plain path"
    if path != prefix and not path.startswith(prefix + "/"):
        return f"only this session's URL ({prefix}/...) is reachable from the sandbox, not {path!r}"
    # the close route in any spelling a server might route there (case, trailing dots, ;params, a slash after)
    first = path[len(prefix) + 1 :].split("/", 1)[0].split(";", 1)[0].rstrip(".").lower()
    if first == "close":
        return "the launcher closes the session; a runtime cannot"
    return None


def _error(status: int, message: str) -> bytes:
    body = json.dumps(
        {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": None,
                "code": "sandbox_forbidden" if status == 403 else "bad_request",
            }
        }
    ).encode()
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
    conn.next_event()
    conn.next_event()
    return b"".join(
        [
            conn.send(
                h11.Response(
                    status_code=status,
                    headers=[
                        ("content-type", "application/json"),
                        ("content-length", str(len(body))),
                        ("connection", "close"),
                    ],
                )
            )
            or b"",
            conn.send(h11.Data(data=body)) or b"",
            conn.send(h11.EndOfMessage()) or b"",
        ]
    )


async def _next_event(conn: h11.Connection, reader: asyncio.StreamReader) -> object:
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        conn.receive_data(await reader.read(65536))


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass  # the client went away; the relay ends with this connection
    writer.close()  # the gateway closed: so does the client's connection (it sees EOF, not a dead socket)


MAX_CONNECTIONS = 64
"""Connections one session's bridge holds at once; more are closed as they come (each is an open
file of the launcher's, shared by every session: a sandbox must not exhaust them)."""


class GatewayBridge:
    """``async with GatewayBridge(socket_path, session_url):`` serves ``socket_path`` while open
    (with ``listener``, a listening socket, that socket instead; ``socket_path`` None).
    Connections still open at exit are closed; past :data:`MAX_CONNECTIONS` at once a new one is
    closed at once (``over_cap`` counts them). Raises BridgeError (from the constructor for a bad
    URL, from ``__aenter__`` when the socket cannot be served). ``connect_failures`` counts the
    connections to the gateway that failed because it could not be reached (``gateway_down``);
    ``unreachable`` is why the last connection failed, None when it succeeded (or none was made)."""

    def __init__(
        self, socket_path: Path | None, session_url: str, listener: socket.socket | None = None
    ) -> None:
        self.socket_path = socket_path
        self.listener = listener
        self.host, self.port, tls, self.prefix = gateway_address(session_url)
        self._ssl = ssl.create_default_context() if tls else None
        default = 443 if tls else 80
        self._host_header = (self.host if self.port == default else f"{self.host}:{self.port}").encode()
        self._server: asyncio.AbstractServer | None = None
        self._conns: set[asyncio.Task[None]] = set()
        self.refused = 0
        self.over_cap = 0
        self.connect_failures = 0
        self.unreachable: str | None = None

    async def __aenter__(self) -> GatewayBridge:
        try:
            if self.listener is not None:
                self._server = await asyncio.start_server(self._handle, sock=self.listener)
            else:
                self._server = await asyncio.start_unix_server(self._handle, path=str(self.socket_path))
        except OSError as e:
            raise BridgeError(
                f"cannot serve the gateway bridge on {self.socket_path or 'its socket'}: {e}"
            ) from e
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
        for t in list(self._conns):
            t.cancel()
        await asyncio.gather(*self._conns, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
        if self.socket_path is not None:
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._conns) >= MAX_CONNECTIONS:
            self.over_cap += 1
            if self.over_cap == 1:
                log.warning(
                    "gateway bridge %s: more than %d connections at once; the next are closed",
                    self.prefix,
                    MAX_CONNECTIONS,
                )
            writer.close()
            return
        self._conns.add(task)
        up_w: asyncio.StreamWriter | None = None
        back: asyncio.Task[None] | None = None
        try:
            leftover = b""
            while back is None or not back.done():
                conn = h11.Connection(h11.SERVER)  # one per request: answers are relayed raw, not parsed
                if leftover:  # (receive_data(b"") would mean EOF)
                    conn.receive_data(leftover)
                request = await _next_event(conn, reader)
                if not isinstance(request, h11.Request):  # the client closed the connection
                    if up_w is not None and back is not None:
                        up_w.write_eof()
                        await back
                    return
                why = refusal(request.target, self.prefix)
                if why is not None:
                    self.refused += 1
                    if self.refused == 1:  # the first only: a runtime may send millions
                        log.warning(
                            "gateway bridge refused %s %r: %s (later refusals of this session are counted only)",
                            request.method,
                            request.target[:200],
                            why,
                        )
                    writer.write(_error(403, why))
                    await writer.drain()
                    return
                if up_w is None:
                    try:
                        up_r, up_w = await asyncio.open_connection(
                            self.host,
                            self.port,
                            ssl=self._ssl,
                            server_hostname=self.host if self._ssl else None,
                        )
                    except OSError as e:
                        log.warning("gateway bridge: cannot reach %s:%s: %s", self.host, self.port, e)
                        if gateway_down(e):
                            self.connect_failures += 1
                            self.unreachable = f"{type(e).__name__}: {e}"
                        return
                    self.unreachable = None
                    back = asyncio.create_task(_pump(up_r, writer))
                out = h11.Connection(h11.CLIENT)
                # the gateway's Host, also for an HTTP/1.0 request that sent none (h11 needs one)
                headers = [
                    (b"host", self._host_header),
                    *((k, v) for k, v in request.headers if k != b"host"),
                ]
                if request.http_version == b"1.0":  # relayed as HTTP/1.1: the answer must end the connection
                    headers = [(k, v) for k, v in headers if k != b"connection"] + [(b"connection", b"close")]
                up_w.write(
                    out.send(h11.Request(method=request.method, target=request.target, headers=headers))
                    or b""
                )
                while True:
                    event = await _next_event(conn, reader)
                    if isinstance(event, h11.Data):
                        up_w.write(out.send(h11.Data(data=event.data)) or b"")
                        await up_w.drain()
                    elif isinstance(event, h11.EndOfMessage):
                        up_w.write(out.send(h11.EndOfMessage()) or b"")
                        await up_w.drain()
                        break
                    else:
                        return  # the client went away mid-request
                leftover = conn.trailing_data[0]
        except h11.RemoteProtocolError as e:
            with contextlib.suppress(ConnectionError, OSError):
                writer.write(_error(400, f"malformed HTTP request: {e}"))
                await writer.drain()
        except (ConnectionError, OSError):
            pass  # either side went away: this connection ends
        except asyncio.CancelledError:
            # the bridge closes (``__aexit__`` cancels its connections): end quietly, since Python
            # 3.11's stream server logs a handler task that ends cancelled as an error
            pass
        finally:
            if back is not None and not back.done():
                back.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await back
            if up_w is not None:
                up_w.close()
            writer.close()
            self._conns.discard(task)
