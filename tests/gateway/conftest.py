"""Shared fixtures of the gateway contract tests: the real gateway app served by uvicorn on a
loopback port (in-process, lifespan on), in front of the one scripted fake upstream
(:mod:`tests.fake_upstream`), with a per-test SQLite file. ``upstream``: a started fake;
``start_gateway(**overrides)``: a gateway with route ``m`` on the fake (``routes=`` replaces the
table); ``gw``: one with the defaults. :class:`Gateway` hands out real clients (openai and
anthropic SDKs, raw httpx) and reads back what was recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sqlite3
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from anthropic import AsyncAnthropic
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import create_app
from gateway.http_edge import server_config
from gateway.settings import GatewaySettings, RouteSettings
from store import JobEnvironment, SessionStep, Store, parse_db_url
from store.engine import sqlite_path
from tests.fake_upstream import FakeUpstream
from tests.raw_sql import raw_sql_sync

ROUTE_KEY = "sk-route-SECRET-7f3c19d2"
CLIENT_KEY = "sk-client-SECRET-91ab44e0"
MESSAGES = [{"role": "user", "content": "hi"}]
NO_RETRY: dict[str, Any] = {"retry": {"max_attempts": 1}}  # route fields: upstream errors relayed at once


class _Server(uvicorn.Server):
    """uvicorn server that leaves the process' signal handlers alone (pytest keeps Ctrl-C)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def eventually(
    pred: Callable[[], Awaitable[bool]] | Callable[[], bool], timeout: float = 5.0, interval: float = 0.01
) -> None:
    """Poll ``pred`` (sync or async) until it is true; AssertionError after ``timeout`` seconds.
    For state that offers nothing to await (rows committed by the gateway's writer task)."""
    deadline = time.monotonic() + timeout
    while True:
        res = pred()
        if isinstance(res, Awaitable):
            res = await res
        if res:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(interval)


class Gateway:
    """One running gateway: ``url`` (``http://127.0.0.1:PORT``), its settings, its app, and
    helpers to call it and to read the trajectory store behind it."""

    def __init__(
        self, settings: GatewaySettings, server: _Server, task: asyncio.Task[None], port: int
    ) -> None:
        self.settings = settings
        self.server = server
        self.task = task
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.db_url = settings.storage_config.db_url
        self.db_path = sqlite_path(parse_db_url(self.db_url)) or Path()
        self._clients: list[AsyncOpenAI | AsyncAnthropic | httpx.AsyncClient] = []

    @property
    def app_state(self) -> Any:
        """The app's GatewayState (``app.state.gw``)."""
        return self.server.config.app.state.gw

    def session_base(self, sid: str) -> str:
        """The OpenAI ``base_url`` of a session: ``.../v1/sessions/{sid}``."""
        return f"{self.url}{self.settings.base_session_path}/{sid}"

    def client(self, sid: str | None = None, **kw: Any) -> AsyncOpenAI:
        """The real openai SDK pointed at a session (or at ``/v1`` when ``sid`` is None), with
        the client api key :data:`CLIENT_KEY` and no retries (unless ``max_retries`` is given)."""
        base = self.session_base(sid) if sid is not None else f"{self.url}/v1"
        kw.setdefault("api_key", CLIENT_KEY)
        kw.setdefault("timeout", 20.0)
        kw.setdefault("max_retries", 0)
        c = AsyncOpenAI(base_url=base, **kw)
        self._clients.append(c)
        return c

    def anthropic(self, sid: str | None = None, **kw: Any) -> AsyncAnthropic:
        """The real anthropic SDK pointed at a session URL (it appends ``/v1/messages``), or at the
        gateway's origin when ``sid`` is None, with the client api key :data:`CLIENT_KEY` and no
        retries."""
        base = self.session_base(sid) if sid is not None else self.url
        kw.setdefault("api_key", CLIENT_KEY)
        kw.setdefault("timeout", 20.0)
        c = AsyncAnthropic(base_url=base, max_retries=0, **kw)
        self._clients.append(c)
        return c

    def hold_write_lock(self) -> sqlite3.Connection:
        """Take SQLite's write lock from a second connection (``BEGIN IMMEDIATE``): the gateway's
        next commit waits until the caller ends it with ``rollback()``."""
        con = sqlite3.connect(self.db_path, timeout=30, isolation_level=None)
        con.execute("BEGIN IMMEDIATE")
        return con

    def http(self, **kw: Any) -> httpx.AsyncClient:
        """A raw httpx client on the gateway origin (closed at teardown)."""
        kw.setdefault("timeout", 20.0)
        c = httpx.AsyncClient(base_url=self.url, **kw)
        self._clients.append(c)
        return c

    async def steps(self, sid: str) -> list[SessionStep]:
        """The recorded trajectory of ``sid`` (``Store.trajectory``: ordered by ``seq``)."""
        store = Store(self.db_url)
        try:
            return await store.trajectory(sid)
        finally:
            await store.close()

    async def register(self, *sids: str, max_steps: int | None = None) -> None:
        """Register sessions as a launcher does before they run (their ``job_environments`` rows)."""
        store = Store(self.db_url)
        try:
            await store.add_job_sessions(
                [
                    JobEnvironment(
                        session_id=sid,
                        job_id="job",
                        env_name="env",
                        case_id="0",
                        llm_model="m",
                        group_id="g",
                        max_steps=max_steps,
                    )
                    for sid in sids
                ]
            )
        finally:
            await store.close()

    async def wait_steps(self, sid: str, n: int, timeout: float = 5.0) -> list[SessionStep]:
        """Wait until ``sid`` has at least ``n`` recorded steps; return them."""
        found: list[SessionStep] = []

        async def enough() -> bool:
            nonlocal found
            found = await self.steps(sid)
            return len(found) >= n

        await eventually(enough, timeout)
        return found

    def sql(self, query: str, *params: Any) -> list[Any]:
        """Run a read query (``?`` placeholders) below the Store: plain sqlite3 on the SQLite file
        (sees the WAL), asyncpg on PostgreSQL (:mod:`tests.raw_sql`)."""
        if self.db_url.startswith("postgres"):
            return raw_sql_sync(self.db_url, query, *params, records=True)
        con = sqlite3.connect(self.db_path, timeout=30)
        con.row_factory = sqlite3.Row
        try:
            return list(con.execute(query, params))
        finally:
            con.close()

    def db_dump(self) -> str:
        """Every row of every table, as SQL text (``iterdump``), then the text of every step's
        compressed values (``packed``, a zlib stream), to search for leaked secrets."""
        con = sqlite3.connect(self.db_path, timeout=30)
        try:
            packed = [
                zlib.decompress(p).decode("utf-8")
                for (p,) in con.execute("SELECT packed FROM session_steps WHERE packed IS NOT NULL")
            ]
            return "\n".join([*con.iterdump(), *packed])
        finally:
            con.close()

    async def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """``GET /metrics`` parsed: ``{(sample name, sorted labels): value}``."""
        async with httpx.AsyncClient(base_url=self.url) as c:
            r = await c.get("/metrics")
        assert r.status_code == 200
        out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for fam in text_string_to_metric_families(r.text):
            for s in fam.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out

    async def metric(self, name: str, **labels: str) -> float:
        """One sample of ``/metrics`` (0.0 when absent, as Prometheus reads a missing counter)."""
        return (await self.metrics()).get((name, tuple(sorted(labels.items()))), 0.0)

    async def stop(self) -> None:
        """Close the clients, then shut the server down (lifespan shutdown drains the writer)."""
        for c in self._clients:
            with contextlib.suppress(Exception):
                await (c.aclose() if isinstance(c, httpx.AsyncClient) else c.close())
        self._clients.clear()
        if not self.task.done():
            self.server.should_exit = True
            await asyncio.wait_for(self.task, 15)


StartGateway = Callable[..., Awaitable[Gateway]]
"""The ``start_gateway`` fixture's type: ``await start_gateway(**GatewaySettings overrides)``."""


def anthropic_routes(upstream: FakeUpstream, **anthropic_route: Any) -> dict[str, dict[str, Any]]:
    """Routes ``m`` (openai, ``base_url`` ending in ``/v1``) and ``a`` (``api: anthropic``,
    ``base_url`` = the fake upstream's origin, as the anthropic SDK takes it); extra fields go to
    route ``a``."""
    return {"m": {}, "a": {"api": "anthropic", "base_url": upstream.origin, **anthropic_route}}


def make_settings(upstream: FakeUpstream, db_url: str, **overrides: Any) -> GatewaySettings:
    """Gateway settings for tests: route ``m`` on the fake upstream with :data:`ROUTE_KEY`,
    strict telemetry, the given SQLite URL; ``routes`` and any GatewaySettings field override."""
    routes_in = overrides.pop("routes", None) or {"m": {}}
    routes = {}
    for key, r in routes_in.items():
        fields = {"base_url": upstream.base_url, "api_key": ROUTE_KEY, **r}
        routes[key] = RouteSettings(**fields)
    data: dict[str, Any] = {"listen_port": 0, "storage_config": {"db_url": db_url}, "llm_routes": routes}
    data.update(overrides)
    return GatewaySettings.model_validate(data)


async def serve(settings: GatewaySettings) -> Gateway:
    """Serve ``create_app(settings)`` with uvicorn on an ephemeral loopback port; returns once
    the server has started (lifespan startup done, socket listening)."""
    app = create_app(settings)
    config = server_config(
        app,
        head_timeout_s=settings.request_head_timeout_s,  # as python -m gateway
        keep_alive_s=settings.keep_alive_timeout_s,
        host="127.0.0.1",
        port=0,
        lifespan="on",
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=3,
    )
    server = _Server(config)
    task = asyncio.create_task(server.serve(), name="uvicorn-gateway")
    async with asyncio.timeout(15):
        while not server.started:
            if task.done():
                task.result()  # raises the startup failure
                raise RuntimeError("gateway server exited during startup")
            await asyncio.sleep(0.005)
    port = server.servers[0].sockets[0].getsockname()[1]
    return Gateway(settings, server, task, port)


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    async with FakeUpstream() as up:
        yield up


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite://{tmp_path}/gw.db"


@pytest.fixture
async def start_gateway(
    upstream: FakeUpstream, db_url: str
) -> AsyncIterator[Callable[..., Awaitable[Gateway]]]:
    started: list[Gateway] = []

    async def start(**overrides: Any) -> Gateway:
        url = overrides.pop("db_url", db_url)
        g = await serve(make_settings(upstream, url, **overrides))
        started.append(g)
        return g

    yield start
    for g in reversed(started):
        await g.stop()


@pytest.fixture
async def gw(start_gateway: Callable[..., Awaitable[Gateway]]) -> Gateway:
    return await start_gateway()


class StreamReader:
    """A streamed call read piece by piece as the gateway sends it, for tests that hold the
    gateway's commit: ``until(marker)``, ``assert_nothing_more()``, ``rest()``."""

    def __init__(self, http: httpx.AsyncClient, path: str, body: dict[str, Any]) -> None:
        self.pieces: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._task = asyncio.ensure_future(self._read(http, path, body))

    async def _read(self, http: httpx.AsyncClient, path: str, body: dict[str, Any]) -> None:
        async with http.stream("POST", path, json=body) as r:
            async for piece in r.aiter_raw():
                await self.pieces.put(piece)
        await self.pieces.put(None)

    async def until(self, marker: bytes) -> bytes:
        """What arrived up to the piece that completes ``marker``."""
        got = b""
        while marker not in got:
            piece = await asyncio.wait_for(self.pieces.get(), 30)
            assert piece is not None, f"the stream ended before {marker!r}: {got!r}"
            got += piece
        return got

    async def assert_nothing_more(self, seconds: float = 0.4) -> None:
        """No piece arrives within ``seconds`` (the rest waits for the held commit)."""
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(self.pieces.get(), seconds)

    async def rest(self, on_piece: Callable[[bytes], None] | None = None) -> bytes:
        """Every further piece until the stream ends; ``on_piece(received so far)`` after each."""
        rest = b""
        while (piece := await asyncio.wait_for(self.pieces.get(), 30)) is not None:
            rest += piece
            if on_piece is not None:
                on_piece(rest)
        await self._task
        return rest

    async def aclose(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


def sse_payloads(raw: bytes) -> list[str]:
    """The ``data:`` payloads of a complete SSE body, in order (test-side reader, LF framing as
    the gateway relays what the fake upstream writes)."""
    out = []
    for block in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        lines = [ln[5:].lstrip(b" ") for ln in block.split(b"\n") if ln.startswith(b"data:")]
        if lines:
            out.append(b"\n".join(lines).decode())
    return out


def sse_json(raw: bytes) -> list[Any]:
    """The JSON ``data:`` payloads of an SSE body (``[DONE]`` left out)."""
    return [json.loads(p) for p in sse_payloads(raw) if p != "[DONE]"]


def events_of(raw: bytes) -> list[tuple[str | None, dict[str, Any]]]:
    """``(event: line value, JSON data)`` of each event of an SSE body."""
    out = []
    for block in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        lines = block.split(b"\n")
        name = next((ln[6:].strip().decode() for ln in lines if ln.startswith(b"event:")), None)
        data = b"\n".join(ln[5:].lstrip(b" ") for ln in lines if ln.startswith(b"data:"))
        if data:
            out.append((name, json.loads(data)))
    return out


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A local port where a connection is refused for the whole test: bound, so no other test's
    server can take it meanwhile, and never listening."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])
