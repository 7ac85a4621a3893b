"""App factory and lifespan: ``create_app(settings)`` builds the FastAPI app with its store,
telemetry writer, session manager and upstream client, started and stopped with the app; the
model calls are served by :mod:`gateway.fastpath`, every other route by :mod:`gateway.routes`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.admin import build_admin_router
from gateway.admin_workers import build_workers_router
from gateway.auth import with_auth
from gateway.csrf import with_csrf_guard
from gateway.errors import install_error_handlers
from gateway.fastpath import ModelCallPaths, method_not_allowed, serve
from gateway.http_edge import with_host_check
from gateway.idle import idle_loop
from gateway.metrics import Metrics
from gateway.recorder import TelemetryWriter
from gateway.rejections import RejectedCalls
from gateway.request_log import RequestLog
from gateway.routes import build_router
from gateway.sessions import SessionManager
from gateway.settings import GatewaySettings
from gateway.shared_sessions import SharedSessionManager
from gateway.state import GatewayState
from gateway.upstream import UpstreamClient
from store import Store
from wire.errors import error_body, shaped

log = logging.getLogger(__name__)


class GatewayApp(FastAPI):
    """The gateway's FastAPI app, with the model-call endpoints served ahead of FastAPI's routing
    and middleware (:mod:`gateway.fastpath`); every other request goes through FastAPI. Every
    request, both ways, first passes ``front``: the Host check (:mod:`gateway.http_edge`), then
    the API-key check when auth is on (:func:`gateway.auth.with_auth`), then the refusal of
    cross-site requests and non-JSON bodies (:mod:`gateway.csrf`)."""

    model_call_paths: ModelCallPaths
    front: ASGIApp

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope["app"] = self
        await self.front(scope, receive, send)

    async def dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve a model call directly (another method on its path: 405), anything else through
        FastAPI."""
        hit = self.model_call_paths.match(scope["path"]) if scope["type"] == "http" else None
        if hit is None:
            await super().__call__(scope, receive, send)
        elif scope["method"] == "POST":
            await serve(self.state.gw, hit[0], hit[1], scope, receive, send)
        else:
            await method_not_allowed(scope, receive, send)


def _refuse_host(scope: Scope, message: str) -> Response:
    """A request for a Host this gateway does not answer: 400 ``host_not_allowed`` in the path's
    error shape, counted and noted like the gateway's other refusals."""
    path: str = scope["path"]
    gw = getattr(getattr(scope.get("app"), "state", None), "gw", None)
    if gw is not None:
        gw.metrics.error_responses.labels("400", "host_not_allowed").inc()
        gw.rejections.note(
            method=str(scope.get("method")), path=path, status=400, reason="host_not_allowed", message=message
        )
    return JSONResponse(shaped(path, 400, error_body(400, message, code="host_not_allowed")), status_code=400)


def create_app(settings: GatewaySettings) -> GatewayApp:
    """Build the gateway app. The store and the upstream pool open in the lifespan startup and
    close (after the telemetry queue is drained) at shutdown."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = Store(settings.storage_config.db_url)
        await store.init()
        metrics = Metrics()
        tel = settings.telemetry
        shared = settings.sessions_shared
        sessions = (SharedSessionManager if shared else SessionManager)(store, settings.max_steps)
        writer = TelemetryWriter(
            store,
            metrics,
            strict=tel.mode == "strict",
            batch_max=tel.batch_max,
            queue_max=tel.queue_max,
            release_in_flight=shared,
            on_lost=sessions.lost if isinstance(sessions, SharedSessionManager) else None,
            on_unrecorded=sessions.note_unrecorded,
        )
        upstream = UpstreamClient(settings.llm_routes)
        await upstream.start()
        writer.start()
        request_log = RequestLog(settings.request_log) if settings.request_log.enabled else None
        if request_log is not None:
            request_log.start()
        app.state.gw = GatewayState(
            settings,
            store,
            sessions,
            upstream,
            writer,
            metrics,
            request_log,
            RejectedCalls(settings.base_session_path, request_log),
        )
        if shared:  # other gateways may be serving the sessions left active
            log.info(
                "gateway ready: storage=%s routes=%s; sessions shared with other gateways",
                store.identity(),
                ",".join(settings.llm_routes),
            )
        else:
            interrupted = await store.mark_interrupted()  # left active by an earlier gateway process
            log.info(
                "gateway ready: storage=%s routes=%s; sessions left active by an earlier gateway, now "
                "interrupted: %d",
                store.identity(),
                ",".join(settings.llm_routes),
                interrupted,
            )
        sweeper = asyncio.ensure_future(idle_loop(app.state.gw))
        try:
            yield
        finally:
            sweeper.cancel()
            await asyncio.gather(sweeper, return_exceptions=True)
            await app.state.gw.stop_detached()  # their steps are queued before the writer drains
            await writer.stop()
            if isinstance(sessions, SharedSessionManager):
                await sessions.aclose()
            await upstream.close()
            await store.close()
            if request_log is not None:
                request_log.stop()

    app = GatewayApp(title="rollout gateway", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.model_call_paths = ModelCallPaths(settings.base_session_path)
    install_error_handlers(app)
    # the Host check (DNS rebinding: only the gateway's own names), API keys (off without keys),
    # then the refusal of requests a web page could make
    app.front = with_host_check(
        with_auth(with_csrf_guard(app.dispatch, settings.base_session_path), settings),
        settings.host_allow_list(),
        _refuse_host,
    )
    app.include_router(build_router(settings.base_session_path))
    app.include_router(build_workers_router())  # upstream worker pools
    app.include_router(build_admin_router())
    return app
