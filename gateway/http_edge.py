"""The HTTP edge shared by the gateway and the launcher's own servers: the ``Host`` names a server
answers (DNS rebinding) and the deadline for a request head (docs/gateway-protocols.md, "HTTP edge")."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

import h11
import uvicorn
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.auto import AutoHTTPProtocol

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
"""Host names every server answers (with any port): a page elsewhere cannot be served as these."""
WILDCARD_ADDRESSES = frozenset({"", "0.0.0.0", "::", "[::]", "*"})
"""Bind addresses that name no one host: they add nothing to a server's allowed names."""
ANY_HOST = "*"
"""An allowed-host entry that turns the check off."""

DEFAULT_REQUEST_HEAD_TIMEOUT_S = 30.0
DEFAULT_KEEP_ALIVE_TIMEOUT_S = 5


def split_host(value: str) -> tuple[str, int | None] | None:
    """``(name, port)`` of a ``Host`` value or entry (``name``, ``name:port``, ``[v6]``, ``[v6]:port``, a
    bare IPv6), the name lowercased; None when malformed."""
    value = value.strip().lower()
    if not value:
        return None
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[: end + 1], value[end + 1 :]
        try:
            ipaddress.IPv6Address(name[1:-1])
        except ValueError:
            return None
    elif value.count(":") > 1:  # a bare IPv6 address (a bind address, never a Host header)
        try:
            return f"[{ipaddress.IPv6Address(value).compressed}]", None
        except ValueError:
            return None
    else:
        name, sep, port = value.partition(":")
        rest = sep + port
    if not name or any(c in name for c in "/?#@ \t\\"):
        return None
    if not rest:
        return name, None
    if not rest.startswith(":") or not rest[1:].isdigit() or not 0 < int(rest[1:]) < 65536:
        return None
    return name, int(rest[1:])


def host_of_url(url: str) -> str:
    """The ``Host`` a client of ``url`` sends (``name:port``, or the name alone); ValueError without one."""
    parts = urlsplit(url)
    if not parts.hostname:
        raise ValueError(f"{url!r} has no host")
    name = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{name}:{parts.port}" if parts.port else name


class HostAllowList:
    """The ``Host`` names a server answers: ``name`` (any port), ``name:port``, or ``*`` (any).
    Raises ValueError for a malformed entry."""

    def __init__(self, entries: Iterable[str]) -> None:
        self.any = False
        self._names: set[str] = set()
        self._pairs: set[tuple[str, int]] = set()
        self.entries: list[str] = []
        for entry in entries:
            if entry.strip() == ANY_HOST:
                self.any = True
                self.entries.append(ANY_HOST)
                continue
            parsed = split_host(entry)
            if parsed is None:
                raise ValueError(f"{entry!r} is not a host name, NAME:PORT or {ANY_HOST!r}")
            name, port = parsed
            if port is None:
                self._names.add(name)
            else:
                self._pairs.add((name, port))
            self.entries.append(name if port is None else f"{name}:{port}")

    @classmethod
    def for_server(cls, bind_hosts: Iterable[str], extra: Iterable[str] = ()) -> HostAllowList:
        """The loopback names, each of ``bind_hosts`` that names one host (not a wildcard), and ``extra``."""
        own = [h for h in bind_hosts if h.strip().lower() not in WILDCARD_ADDRESSES]
        return cls([*LOOPBACK_NAMES, *own, *extra])

    def allows(self, headers: Iterable[tuple[bytes, bytes]]) -> bool:
        """Whether a request with these raw ASGI headers may be answered."""
        if self.any:
            return True
        hosts = [v for k, v in headers if k == b"host"]
        if len(hosts) != 1:
            return False
        parsed = split_host(hosts[0].decode("latin-1"))
        if parsed is None:
            return False
        name, port = parsed
        return name in self._names or (port is not None and (name, port) in self._pairs)

    def describe(self) -> str:
        """The entries, for messages."""
        return ", ".join(dict.fromkeys(self.entries))


Refusal = Callable[[Scope, str], Response]
"""A server's answer to a refused Host, in its own error shape: (scope, message) -> response."""


class HostCheck:
    """ASGI middleware: a request whose ``Host`` is not allowed is answered ``refuse(scope, message)``."""

    def __init__(self, app: ASGIApp, allowed: HostAllowList, refuse: Refusal) -> None:
        self.app = app
        self.allowed = allowed
        self.refuse = refuse

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.allowed.allows(scope["headers"]):
            await self.app(scope, receive, send)
            return
        given = [v.decode("latin-1") for k, v in scope["headers"] if k == b"host"]
        what = (
            f"Host {given[0][:200]!r}"
            if len(given) == 1
            else "a request without a Host header"
            if not given
            else "a request with several Host headers"
        )
        message = (
            f"this server does not answer {what}; it answers {self.allowed.describe()} "
            "(a name it is reached by must be allowed in its configuration)"
        )
        await self.refuse(scope, message)(scope, receive, send)


def with_host_check(app: ASGIApp, allowed: HostAllowList, refuse: Refusal) -> ASGIApp:
    """``app`` behind :class:`HostCheck`, or ``app`` itself when ``allowed`` allows any Host."""
    return app if allowed.any else HostCheck(app, allowed, refuse)


def origin_form(method: bytes, target: bytes) -> bool:
    """Whether a request target is one a server takes (RFC 9112 3.2): ``/path?query``, or ``*`` for
    ``OPTIONS``; the absolute form (``http://host/path``) is for proxies, the authority form for
    ``CONNECT``."""
    return target.startswith(b"/") or (target == b"*" and method == b"OPTIONS")


class _NotOriginForm(Exception):
    """Raised from a parser callback: uvicorn answers it with its 400 (``send_400_response``)."""


class _OriginFormH11(h11.Connection):
    """h11's server connection refusing a request whose target is not in origin form (``refused``
    says why)."""

    refused: str | None = None

    def next_event(self) -> Any:
        event = super().next_event()
        if isinstance(event, h11.Request) and not origin_form(event.method, event.target):
            self.refused = _refused_target(event.target)
            raise h11.RemoteProtocolError(self.refused)
        return event


def _refused_target(target: bytes) -> str:
    shown = target[:200].decode("ascii", "backslashreplace")
    return f"request target {shown!r} is not a path: this server is not a proxy"


class _HeadDeadline:
    """Mixed into uvicorn's HTTP protocol: each request head must be complete within
    ``head_timeout_s`` of the connection's start or of the first byte after an answer, else the
    connection is closed; an answer in progress is never cut. A request target that is not a path
    (absolute or authority form) is answered 400 and the connection closed."""

    head_timeout_s: float = DEFAULT_REQUEST_HEAD_TIMEOUT_S
    _head_timer: asyncio.TimerHandle | None = None
    _target_refused: str | None = None
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    cycle: Any
    parser: Any

    def __init__(self, config: uvicorn.Config, *args: Any, **kw: Any) -> None:
        super().__init__(config, *args, **kw)  # type: ignore[call-arg]
        if isinstance(getattr(self, "conn", None), h11.Connection):  # uvicorn's h11 protocol
            size = config.h11_max_incomplete_event_size
            self.conn = _OriginFormH11(h11.SERVER) if size is None else _OriginFormH11(h11.SERVER, size)

    def on_headers_complete(self) -> None:  # uvicorn's httptools protocol (h11's never calls it)
        url: bytes = getattr(self, "url", b"")
        if not origin_form(self.parser.get_method(), url):
            self._target_refused = _refused_target(url)
            raise _NotOriginForm(self._target_refused)
        super().on_headers_complete()  # type: ignore[misc]

    def send_400_response(self, msg: str) -> None:
        """uvicorn's 400 for a request it cannot take, saying why when it is the target."""
        why = self._target_refused or getattr(getattr(self, "conn", None), "refused", None)
        super().send_400_response(why or msg)  # type: ignore[misc]

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)  # type: ignore[misc]
        if self.cycle is None or self.cycle.response_complete:  # still waiting for a whole head
            self._arm_head_timer()
        else:
            self._disarm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)  # type: ignore[misc]

    def _arm_head_timer(self) -> None:
        if self._head_timer is None and not self.transport.is_closing():
            self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if (self.cycle is None or self.cycle.response_complete) and not self.transport.is_closing():
            self.transport.close()


def head_timeout_protocol(
    head_timeout_s: float, base: type[asyncio.Protocol] = AutoHTTPProtocol
) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol ``base`` (default: httptools or h11, as uvicorn picks it) with a
    deadline for each request head (see ``_HeadDeadline``)."""
    if head_timeout_s <= 0:
        raise ValueError("head_timeout_s must be positive")
    return type("HeadDeadlineProtocol", (_HeadDeadline, base), {"head_timeout_s": head_timeout_s})


def server_config(
    app: ASGIApp,
    *,
    head_timeout_s: float = DEFAULT_REQUEST_HEAD_TIMEOUT_S,
    keep_alive_s: int = DEFAULT_KEEP_ALIVE_TIMEOUT_S,
    **kw: Any,
) -> uvicorn.Config:
    """A uvicorn config serving ``app`` with a request-head deadline of ``head_timeout_s`` and
    idle keep-alive connections closed after ``keep_alive_s``; ``kw`` go to ``uvicorn.Config``."""
    return uvicorn.Config(
        app, http=head_timeout_protocol(head_timeout_s), timeout_keep_alive=keep_alive_s, **kw
    )
