"""The only code that calls model servers: one aiohttp ClientSession for all routes (aiohttp
measured several times faster than httpx here). No total timeout: ``connect_timeout_s`` to
connect, ``read_timeout_s`` between two reads."""

from __future__ import annotations

import asyncio
import io
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from urllib.parse import quote

import aiohttp

from gateway.errors import GatewayError
from gateway.settings import SESSION_ID_PLACEHOLDER, RouteSettings
from gateway.workers import Worker, WorkerPool
from store import hide_secrets, redact_url

log = logging.getLogger(__name__)

LARGE_BODY_BYTES = 2**20
"""A request body over this size is sent from a ``BytesIO`` (aiohttp writes it in chunks,
yielding to the loop between them, and warns when given such a body as one ``bytes``)."""


def route_base_url(route_key: str, route: RouteSettings, session_id: str | None) -> str:
    """The ``base_url`` of ``route`` for a call of ``session_id`` (None: sessionless). A per-session
    route gets ``{session_id}`` replaced by ``quote(session_id, safe="")``, one path segment (RFC
    3986 section 2.1). Raises GatewayError(400, ``session_required``) without a session id or for
    ``.`` / ``..``, which URL normalization (RFC 3986 section 5.2.4) would remove."""
    if not route.per_session:
        return route.base_url
    if session_id is None:
        raise GatewayError(
            400,
            f"route `{route_key}` sends each call to a per-session URL "
            f"({redact_url(route.base_url)}); "
            "call it through a session URL (.../v1/sessions/{session_id}/...), not the "
            "sessionless endpoint",
            code="session_required",
            param="model",
        )
    if session_id in (".", ".."):
        raise GatewayError(
            400,
            f"the session id {session_id!r} cannot be put in the per-session URL of route `{route_key}`",
            code="session_required",
        )
    return route.base_url.replace(SESSION_ID_PLACEHOLDER, quote(session_id, safe=""))


class UpstreamClient:
    """Pooled HTTP client toward the upstreams: one semaphore (``max_concurrency``) and one
    :class:`gateway.workers.WorkerPool` per route. ``await start()`` in the loop, ``await close()``
    at shutdown."""

    def __init__(self, routes: dict[str, RouteSettings]) -> None:
        self._routes = routes
        self._session: aiohttp.ClientSession | None = None
        self._limits: dict[str, asyncio.Semaphore] = {
            key: asyncio.Semaphore(r.max_concurrency) for key, r in routes.items() if r.max_concurrency
        }
        self.in_flight: dict[str, int] = dict.fromkeys(routes, 0)
        self.pools: dict[str, WorkerPool] = {key: WorkerPool(key, r.workers) for key, r in routes.items()}
        self._checked_at: dict[str, float] = {}
        self._health: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Open the connection pool (no limit on total connections; per-route caps apply) and
        start the health checks."""
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, enable_cleanup_closed=True)
        self._session = aiohttp.ClientSession(
            connector=connector,
            auto_decompress=False,
            read_bufsize=2**16,
            skip_auto_headers=("User-Agent",),
        )
        self._health = asyncio.create_task(self._health_loop(), name="upstream-health-checks")

    async def close(self) -> None:
        """Stop the health checks and close every pooled connection."""
        if self._health is not None:
            self._health.cancel()
            await asyncio.wait({self._health})
            self._health = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    def pooled(self, route_key: str) -> bool:
        """True when the route has a pool of workers (``base_urls``, or workers added at run
        time): its workers are health-checked and taken out when they fail."""
        return bool(self._routes[route_key].base_urls) or len(self.pools[route_key].workers) > 1

    def pick(self, route_key: str, session_id: str | None) -> Worker:
        """The worker a call of ``session_id`` goes to now (:meth:`WorkerPool.pick`)."""
        return self.pools[route_key].pick(session_id)

    async def _probe_url(self, route: RouteSettings, base_url: str, timeout_s: float) -> str | None:
        if self._session is None:
            raise RuntimeError("UpstreamClient.start() was not called")
        url = base_url.rstrip("/") + ("/v1/models" if route.api == "anthropic" else "/models")
        try:
            async with self._session.get(
                url, timeout=aiohttp.ClientTimeout(total=timeout_s), allow_redirects=False
            ) as resp:
                if resp.status >= 500:
                    return f"answered HTTP {resp.status}"
        except (aiohttp.ClientError, TimeoutError) as e:
            return hide_secrets(f"does not answer: {type(e).__name__}: {e}", base_url)
        return None

    async def probe(self, route_key: str, timeout_s: float = 5.0) -> str | None:
        """Why the route's upstream does not answer ``GET <base_url>/models`` (``/v1/models`` for
        ``anthropic``) below 500, or None when it does (a pool: one worker; per-session: not probed)."""
        route = self._routes[route_key]
        if route.per_session:
            return None
        workers = list(self.pools[route_key].workers.values())
        whys = []
        for w in workers:
            why = await self._probe_url(route, w.base_url, timeout_s)
            if why is None:
                return None
            whys.append(why if len(workers) == 1 else f"{w.shown} {why}")
        return (
            f"upstream of route {route_key} " + "; ".join(whys)
            if len(workers) == 1
            else (f"no worker of route {route_key} answers: " + "; ".join(whys))
        )

    async def check_workers(self, route_key: str | None = None) -> None:
        """Health-check every worker of the pooled routes (or of ``route_key``) now, at once: a
        worker whose probe fails is taken out, one whose probe passes is back."""
        keys = [route_key] if route_key is not None else [k for k in self._routes if self.pooled(k)]
        checks = []
        for key in keys:
            route, pool = self._routes[key], self.pools[key]
            self._checked_at[key] = time.monotonic()
            timeout = min(route.connect_timeout_s, route.health_check_interval_s, 5.0)
            checks += [self._check_one(pool, route, w.base_url, timeout) for w in list(pool.workers.values())]
        if checks:
            await asyncio.gather(*checks)

    async def _check_one(
        self, pool: WorkerPool, route: RouteSettings, base_url: str, timeout_s: float
    ) -> None:
        why = await self._probe_url(route, base_url, timeout_s)
        pool.set_health(base_url, why is None, None if why is None else f"health check: {why}")

    async def _health_loop(self) -> None:
        """Check each pooled route every ``health_check_interval_s``; wakes every second (or the
        smallest interval, if shorter), so a pool made at run time is checked too."""
        while True:
            due = [
                k
                for k in self._routes
                if self.pooled(k)
                and time.monotonic() - self._checked_at.get(k, 0.0) >= self._routes[k].health_check_interval_s
            ]
            for key in due:
                try:
                    await self.check_workers(key)
                except Exception:
                    log.exception("health check of route %s failed", key)
            intervals = [r.health_check_interval_s for r in self._routes.values()]
            await asyncio.sleep(min([1.0, *intervals]))

    @asynccontextmanager
    async def post(
        self,
        route_key: str,
        path: str,
        body: bytes,
        headers: dict[str, str],
        session_id: str | None = None,
        *,
        base: Callable[[str], str] | None = None,
        worker: Worker | None = None,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """POST ``body`` to ``<base_url><path>`` (the ``worker``'s, else :meth:`pick`'s; ``base`` maps it
        first), holding the route's concurrency slot while the response is open; yields it with its
        headers read, and leaving the block releases (unread: closes) the connection. A pooled worker
        refusing the connection is taken out. Raises aiohttp connection errors and timeouts, and
        :func:`route_base_url`'s GatewayError before anything else."""
        if self._session is None:
            raise RuntimeError("UpstreamClient.start() was not called")
        route = self._routes[route_key]
        w = worker or self.pick(route_key, session_id)
        base_url = route_base_url(route_key, route, session_id) if route.per_session else w.base_url
        if base is not None:
            base_url = base(base_url)
        timeout = aiohttp.ClientTimeout(
            total=None,
            connect=route.connect_timeout_s,
            sock_connect=route.connect_timeout_s,
            sock_read=route.read_timeout_s,
        )
        sem = self._limits.get(route_key)
        if sem is not None:
            await sem.acquire()
        self.in_flight[route_key] = self.in_flight.get(route_key, 0) + 1
        w.in_flight += 1
        try:
            data = io.BytesIO(body) if len(body) > LARGE_BODY_BYTES else body
            connected = False
            try:
                async with self._session.post(
                    base_url + path, data=data, headers=headers, timeout=timeout, allow_redirects=False
                ) as resp:
                    connected = True
                    yield resp
            except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as e:
                if not connected and self.pooled(route_key):
                    self.pools[route_key].set_health(
                        w.base_url,
                        False,
                        hide_secrets(f"connect failed: {type(e).__name__}: {e}", w.base_url),
                    )
                raise
        finally:
            w.in_flight -= 1
            self.in_flight[route_key] -= 1
            if sem is not None:
                sem.release()
