"""App factory and lifespan: ``create_app(settings)`` builds the FastAPI app with its store,
telemetry writer, session manager and upstream client, started and stopped with the app."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.auth import with_auth
from gateway.errors import GatewayError, install_error_handlers
from gateway.fastpath import ModelCallPaths, method_not_allowed, serve
from gateway.metrics import Metrics
from gateway.recorder import TelemetryWriter
from gateway.request_log import RequestLog
from gateway.sessions import SessionManager
from gateway.settings import GatewaySettings
from gateway.state import GatewayState
from gateway.upstream import UpstreamClient
from gateway.wire import CloseSessionRequest, check_session_id
from store import Store

log = logging.getLogger(__name__)


def _model_object(key: str) -> dict[str, object]:
    """A route key as an OpenAI model object (API reference, "The model object")."""
    return {"id": key, "object": "model", "created": 0, "owned_by": "gateway"}


class GatewayApp(FastAPI):
    """The gateway's FastAPI app, with the model-call endpoints served ahead of FastAPI's routing
    and middleware (:mod:`gateway.fastpath`); every other request goes through FastAPI. Every
    request, both ways, first passes ``front``: the API-key check when auth is on
    (:func:`gateway.auth.with_auth`)."""

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


def create_app(settings: GatewaySettings) -> GatewayApp:
    """Build the gateway app. The store and the upstream pool open in the lifespan startup and
    close (after the telemetry queue is drained) at shutdown."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = Store(settings.storage_config.db_url)
        await store.init()
        metrics = Metrics()
        tel = settings.telemetry
        writer = TelemetryWriter(store, metrics, strict=tel.mode == "strict", batch_max=tel.batch_max,
                                 queue_max=tel.queue_max)
        upstream = UpstreamClient(settings.llm_routes)
        await upstream.start()
        writer.start()
        request_log = RequestLog(settings.request_log) if settings.request_log.enabled else None
        if request_log is not None:
            request_log.start()
        app.state.gw = GatewayState(settings, store, SessionManager(store, settings.max_steps), upstream,
                                    writer, metrics, request_log)
        interrupted = await store.mark_interrupted()  # left active by an earlier gateway process
        log.info("gateway ready: storage=%s routes=%s; sessions left active by an earlier gateway, now "
                 "interrupted: %d", store.identity(), ",".join(settings.llm_routes), interrupted)
        try:
            yield
        finally:
            await app.state.gw.stop_detached()  # their steps are queued before the writer drains
            await writer.stop()
            await upstream.close()
            await store.close()
            if request_log is not None:
                request_log.stop()

    app = GatewayApp(title="rollout gateway", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.model_call_paths = ModelCallPaths(settings.base_session_path)
    install_error_handlers(app)
    app.front = with_auth(app.dispatch, settings)  # API keys of the gateway's clients; off without keys
    sp = settings.base_session_path

    def gw(request: Request) -> GatewayState:
        return request.app.state.gw  # type: ignore[no-any-return]

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz(request: Request) -> JSONResponse:
        g = gw(request)
        body = {"status": "ready", "storage_type": g.store.kind, "db_url": g.store.identity(),
                "max_steps": g.settings.max_steps, "routes": sorted(g.settings.llm_routes),
                "base_session_path": sp, "telemetry_mode": g.settings.telemetry.mode}
        try:
            await g.store.ping()
        except Exception as e:
            body.update(status="unavailable", error=f"{type(e).__name__}: {e}")
            return JSONResponse(body, status_code=503)
        route = request.query_params.get("route")  # ?route=KEY: is that route's upstream up too?
        if route is not None and route in g.settings.llm_routes:
            why = await g.upstream.probe(route)
            if why is not None:
                body.update(status="unavailable", error=why)
                return JSONResponse(body, status_code=503)
        return JSONResponse(body)

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        g = gw(request)
        for key, n in g.upstream.in_flight.items():
            g.metrics.in_flight.labels(key).set(n)
        return Response(g.metrics.render(), media_type="text/plain; version=0.0.4")

    def model_list(request: Request) -> dict[str, object]:
        return {"object": "list", "data": [_model_object(key) for key in gw(request).settings.llm_routes]}

    def model_object(request: Request, model: str) -> dict[str, object]:
        if model not in gw(request).settings.llm_routes:
            raise GatewayError(404, f"The model `{model}` does not exist (no such route)", code="model_not_found",
                               param="model")
        return _model_object(model)

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, object]:
        """The route keys, in OpenAI's "List models" shape (what ``client.models.list()`` reads)."""
        return model_list(request)

    @app.get(sp + "/{session_id}/models")
    async def session_models(session_id: str, request: Request) -> dict[str, object]:
        """``GET /v1/models`` for a client whose base URL is a session URL."""
        return model_list(request)

    @app.get("/v1/models/{model:path}")
    async def model(model: str, request: Request) -> dict[str, object]:
        """One route key as an OpenAI model object (``client.models.retrieve(key)``); 404 otherwise."""
        return model_object(request, model)

    @app.get(sp + "/{session_id}/models/{model:path}")
    async def session_model(session_id: str, model: str, request: Request) -> dict[str, object]:
        """``GET /v1/models/{model}`` for a client whose base URL is a session URL."""
        return model_object(request, model)

    @app.get(sp + "/{session_id}")
    async def session_status(session_id: str, request: Request) -> dict[str, object]:
        st = await gw(request).sessions.get(check_session_id(session_id))
        if st is None:
            raise GatewayError(404, f"unknown session {session_id}", code="session_not_found")
        return {"session_id": st.session_id, "status": st.status, "max_steps": st.max_steps,
                "total_steps": st.total_steps, "refunded_steps": st.refunded_steps,
                "step_counts": st.step_counts or {}, "close_reason": st.close_reason,
                "completion_mode": st.completion_mode}

    @app.post(sp + "/{session_id}/close")
    async def close_session(session_id: str, request: Request) -> dict[str, object]:
        """Close a session. Answers once every call of the session in flight has been recorded
        (strict telemetry: committed), waiting at most ``close_grace_s``; calls still running then
        are recorded later as ``after_close`` steps (see ``SessionManager.close``)."""
        check_session_id(session_id)
        g = gw(request)
        raw = await request.body()
        try:
            req = CloseSessionRequest.model_validate_json(raw) if raw.strip() else CloseSessionRequest()
        except ValueError as e:
            raise GatewayError(400, f"invalid close request: {e}") from None
        snap, truncated = await g.sessions.close(session_id, req.reason, req.completion_mode,
                                                 g.settings.close_grace_s)
        # dropped from memory once the closed state is stored (best_effort: never if that fails, so
        # the session stays closed in memory instead of reloading from the store as active)
        await g.writer.record(None, snap, on_commit=lambda: g.sessions.forget(session_id))
        return {"session_id": session_id, "status": snap.status, "total_steps": snap.total_steps,
                "truncated": truncated, "close_reason": snap.close_reason,
                "completion_mode": snap.completion_mode}

    return app
