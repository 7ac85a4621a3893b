"""The only code that calls model servers: one aiohttp ClientSession for all routes.

aiohttp is the forwarding client because it measured several times faster than httpx here.
Timeouts: ``connect_timeout_s`` to connect, ``read_timeout_s`` between two reads (caps
time-to-first-token and stalls, never a progressing stream); no total timeout. Bodies are read
as they arrive, with no line-length limit. A route whose ``base_url`` holds ``{session_id}`` is
called at a per-session URL (:func:`route_base_url`).
"""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from urllib.parse import quote

import aiohttp

from gateway.errors import GatewayError
from gateway.settings import SESSION_ID_PLACEHOLDER, RouteSettings

log = logging.getLogger(__name__)

LARGE_BODY_BYTES = 2**20
"""A request body over this size is sent from a ``BytesIO`` (aiohttp writes it in chunks,
yielding to the loop between them, and warns when given such a body as one ``bytes``)."""


def route_base_url(route_key: str, route: RouteSettings, session_id: str | None) -> str:
    """The ``base_url`` of ``route`` for a call of session ``session_id`` (None: a sessionless
    passthrough call). A per-session route gets ``{session_id}`` replaced by
    ``urllib.parse.quote(session_id, safe="")`` (one path segment, RFC 3986 section 2.1: ``/``,
    ``?``, ``#``, ``%``, spaces and non-ASCII are percent-encoded; aiohttp's URL class then
    sends the characters a path segment allows, ``:@!$&'()*,;=``, unencoded, RFC 3986 section
    3.3, which a server decoding the path reads the same); any other route's ``base_url`` is
    returned as is.

    Raises GatewayError(400, code ``session_required``) for a per-session route called without
    a session, or with the session id ``.`` or ``..`` (URL normalization, RFC 3986 section
    5.2.4, would remove that segment and send the call elsewhere)."""
    if not route.per_session:
        return route.base_url
    if session_id is None:
        raise GatewayError(400, f"route `{route_key}` sends each call to a per-session URL ({route.base_url}); "
                                "call it through a session URL (.../v1/sessions/{session_id}/...), not the "
                                "sessionless endpoint", code="session_required", param="model")
    if session_id in (".", ".."):
        raise GatewayError(400, f"the session id {session_id!r} cannot be put in the per-session URL of route "
                                f"`{route_key}`", code="session_required")
    return route.base_url.replace(SESSION_ID_PLACEHOLDER, quote(session_id, safe=""))


class UpstreamClient:
    """Pooled HTTP client toward the upstreams, with one semaphore per route (``max_concurrency``).

    Use ``await start()`` once inside the event loop and ``await close()`` at shutdown.
    """

    def __init__(self, routes: dict[str, RouteSettings]) -> None:
        self._routes = routes
        self._session: aiohttp.ClientSession | None = None
        self._limits: dict[str, asyncio.Semaphore] = {
            key: asyncio.Semaphore(r.max_concurrency) for key, r in routes.items() if r.max_concurrency
        }
        self.in_flight: dict[str, int] = dict.fromkeys(routes, 0)

    async def start(self) -> None:
        """Open the connection pool (no limit on total connections; per-route caps apply)."""
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, enable_cleanup_closed=True)
        self._session = aiohttp.ClientSession(
            connector=connector, auto_decompress=False, read_bufsize=2**16,
            skip_auto_headers=("User-Agent",),
        )

    async def close(self) -> None:
        """Close every pooled connection."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def probe(self, route_key: str, timeout_s: float = 5.0) -> str | None:
        """Whether the route's upstream answers: GET its model list (``<base_url>/models``, or
        ``<base_url>/v1/models`` for an ``api: anthropic`` route) without credentials. Any HTTP
        answer below 500 (a 401 or 404 included: the server is up) is None; a connect failure,
        timeout or 5xx is why not. A per-session route is not probed (None)."""
        if self._session is None:
            raise RuntimeError("UpstreamClient.start() was not called")
        route = self._routes[route_key]
        if route.per_session:
            return None
        url = route.base_url.rstrip("/") + ("/v1/models" if route.api == "anthropic" else "/models")
        try:
            async with self._session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s),
                                         allow_redirects=False) as resp:
                if resp.status >= 500:
                    return f"upstream of route {route_key} answered HTTP {resp.status}"
        except (aiohttp.ClientError, TimeoutError) as e:
            return f"upstream of route {route_key} does not answer: {type(e).__name__}: {e}"
        return None

    @asynccontextmanager
    async def post(self, route_key: str, path: str, body: bytes, headers: dict[str, str],
                   session_id: str | None = None, *, base: Callable[[str], str] | None = None
                   ) -> AsyncIterator[aiohttp.ClientResponse]:
        """POST ``body`` to ``<base_url><path>`` (the route's ``base_url`` for ``session_id``, see
        :func:`route_base_url`; None for a passthrough call), holding the route's concurrency
        slot for as long as the response is open. Yields the response with headers read; the
        body is read by the caller. Leaving the block releases (or, if unread, closes) the
        connection. ``base``, when given, maps the ``base_url`` first (e.g. to its origin).

        Raises ``aiohttp.ClientConnectionError`` / ``asyncio.TimeoutError`` for connect failures
        and read timeouts, and GatewayError(400) from :func:`route_base_url` (before taking a
        concurrency slot or connecting).
        """
        if self._session is None:
            raise RuntimeError("UpstreamClient.start() was not called")
        route = self._routes[route_key]
        base_url = route_base_url(route_key, route, session_id)
        if base is not None:
            base_url = base(base_url)
        timeout = aiohttp.ClientTimeout(total=None, connect=route.connect_timeout_s,
                                        sock_connect=route.connect_timeout_s,
                                        sock_read=route.read_timeout_s)
        sem = self._limits.get(route_key)
        if sem is not None:
            await sem.acquire()
        self.in_flight[route_key] = self.in_flight.get(route_key, 0) + 1
        try:
            data = io.BytesIO(body) if len(body) > LARGE_BODY_BYTES else body
            async with self._session.post(base_url + path, data=data, headers=headers,
                                          timeout=timeout, allow_redirects=False) as resp:
                yield resp
        finally:
            self.in_flight[route_key] -= 1
            if sem is not None:
                sem.release()
