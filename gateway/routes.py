"""The gateway's routes other than model calls: health, readiness, metrics, the model list (as
OpenAI's "List models"), session status, close and client score, ``HEAD`` of a session's base URL, and
Anthropic's count_tokens (:mod:`gateway.count_tokens`)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from gateway.bodies import check_session_id, read_control_body
from gateway.count_tokens import handle as count_tokens_handle
from gateway.errors import GatewayError, parse_body
from gateway.state import GatewayState
from wire.requests import CloseSessionRequest, ScoreSessionRequest


def _gw(request: Request) -> GatewayState:
    gw: GatewayState = request.app.state.gw
    return gw


def _model_object(key: str) -> dict[str, object]:
    """A route key as an OpenAI model object (API reference, "The model object")."""
    return {"id": key, "object": "model", "created": 0, "owned_by": "gateway"}


def _model_list(request: Request) -> dict[str, object]:
    """Every route key, then every exact alias (a pattern cannot be listed)."""
    routes = _gw(request).settings.llm_routes
    names = [*routes, *(a for r in routes.values() for a in r.aliases)]
    return {"object": "list", "data": [_model_object(name) for name in names]}


def _model(request: Request, model: str) -> dict[str, object]:
    if _gw(request).settings.resolve_route(model) is None:
        raise GatewayError(
            404,
            f"The model `{model}` does not exist (no such route or alias)",
            code="model_not_found",
            param="model",
        )
    return _model_object(model)


async def healthz() -> dict[str, str]:
    return {"status": "ok"}


async def readyz(request: Request) -> JSONResponse:
    """Ready when the store answers (and, with ``?route=KEY``, that route's upstream); names the
    database so a launcher can check it is its own (``Store.identity``: no credential in it)."""
    g = _gw(request)
    body = {
        "status": "ready",
        "storage_type": g.store.kind,
        "db_url": g.store.identity(),
        "max_steps": g.settings.max_steps,
        "routes": sorted(g.settings.llm_routes),
        "base_session_path": g.settings.base_session_path,
        "telemetry_mode": g.settings.telemetry.mode,
        "shared_sessions": g.sessions.persists_itself,
    }
    try:
        await g.store.ping()
    except Exception as e:
        body.update(status="unavailable", error=g.store.hide_secrets(f"{type(e).__name__}: {e}"))
        return JSONResponse(body, status_code=503)
    route = request.query_params.get("route")  # ?route=KEY: is that route's upstream up too?
    if route is not None and route in g.settings.llm_routes:
        why = await g.upstream.probe(route)
        if why is not None:
            body.update(status="unavailable", error=why)
            return JSONResponse(body, status_code=503)
    return JSONResponse(body)


async def metrics(request: Request) -> Response:
    g = _gw(request)
    for key, n in g.upstream.in_flight.items():
        g.metrics.in_flight.labels(key).set(n)
    g.metrics.worker_healthy.clear()  # removed workers go away
    for key, pool in g.upstream.pools.items():
        if g.upstream.pooled(key):
            for w in pool.workers.values():
                g.metrics.worker_healthy.labels(key, w.shown).set(1 if w.healthy else 0)
    return Response(g.metrics.render(), media_type="text/plain; version=0.0.4")


async def models(request: Request) -> dict[str, object]:
    """The route keys, in OpenAI's "List models" shape (what ``client.models.list()`` reads)."""
    return _model_list(request)


async def session_models(session_id: str, request: Request) -> dict[str, object]:
    """``GET /v1/models`` for a client whose base URL is a session URL."""
    return _model_list(request)


async def model(model: str, request: Request) -> dict[str, object]:
    """One route key as an OpenAI model object (``client.models.retrieve(key)``); 404 otherwise."""
    return _model(request, model)


async def session_model(session_id: str, model: str, request: Request) -> dict[str, object]:
    """``GET /v1/models/{model}`` for a client whose base URL is a session URL."""
    return _model(request, model)


async def session_status(session_id: str, request: Request) -> dict[str, object]:
    st = await _gw(request).sessions.get(check_session_id(session_id))
    if st is None:
        raise GatewayError(404, f"unknown session {session_id}", code="session_not_found")
    return {
        "session_id": st.session_id,
        "status": st.status,
        "max_steps": st.max_steps,
        "total_steps": st.total_steps,
        "refunded_steps": st.refunded_steps,
        "step_counts": st.step_counts or {},
        "close_reason": st.close_reason,
        "completion_mode": st.completion_mode,
        "rejected_calls": _rejected(request, session_id),
        "unrecorded_calls": _gw(request).sessions.unrecorded(st.session_id),
        **await _versions(_gw(request), st.session_id),
    }


def _rejected(request: Request, session_id: str) -> dict[str, int]:
    """The session's calls the gateway answered itself, by reason (:mod:`gateway.rejections`)."""
    rejections = _gw(request).rejections
    return rejections.of(session_id) if rejections is not None else {}


async def _versions(g: GatewayState, session_id: str) -> dict[str, object]:
    """``policy_versions`` (distinct versions of the session's committed steps, null for steps
    made before any version was set) and ``spans_policy_versions`` (more than one)."""
    versions = await g.store.policy_versions(session_id)
    return {"policy_versions": versions, "spans_policy_versions": len(versions) > 1}


async def close_session(session_id: str, request: Request) -> dict[str, object]:
    """Close a session. Answers once every call of the session in flight has been recorded
    (strict telemetry: committed), waiting at most ``close_grace_s``; calls still running then
    are recorded later as ``after_close`` steps (see ``SessionManager.close``). A session the
    gateway does not know (``SessionManager.known``) is a 404 ``session_not_found``: nothing is
    created."""
    check_session_id(session_id)
    g = _gw(request)
    req = parse_body(
        await read_control_body(request), CloseSessionRequest, "invalid close request", optional=True
    )
    if not await g.sessions.known(session_id):
        raise GatewayError(
            404,
            f"unknown session {session_id}: it never called the model and no launcher registered it",
            code="session_not_found",
            param="session_id",
        )
    return await close_and_store(g, session_id, req.reason, req.completion_mode)


async def close_and_store(
    g: GatewayState, session_id: str, reason: str | None, completion_mode: str | None
) -> dict[str, object]:
    """Close a known session, store its closed state and forget it; the close answer."""
    snap, truncated = await g.sessions.close(session_id, reason, completion_mode, g.settings.close_grace_s)
    # dropped from memory once the closed state is stored (best_effort: never if that fails, so
    # the session stays closed in memory instead of reloading from the store as active)
    if g.sessions.persists_itself:  # shared sessions: the closed state is committed already
        g.sessions.forget(session_id)
    else:
        await g.writer.commit(None, snap, on_commit=lambda: g.sessions.forget(session_id))
    g.prefixes.drop(session_id)
    g.encoder.drop(session_id)
    rejected = g.rejections.of(session_id) if g.rejections is not None else {}
    return {
        "session_id": session_id,
        "status": snap.status,
        "total_steps": snap.total_steps,
        "max_steps": snap.max_steps,
        "refunded_steps": snap.refunded_steps,
        "truncated": truncated,
        "close_reason": snap.close_reason,
        "completion_mode": snap.completion_mode,
        "rejected_calls": rejected,
        "unrecorded_calls": g.sessions.unrecorded(session_id),  # after the close's commit: every step settled
        # no step reserved, none recorded (a step row is written for a reserved step only)
        **(
            {"policy_versions": [], "spans_policy_versions": False}
            if snap.total_steps == 0
            else await _versions(g, session_id)
        ),
    }


async def score_session(session_id: str, request: Request) -> dict[str, object]:
    """Record the score a client gave a session (an admin key: :mod:`gateway.auth`), provenance
    ``client``, kept apart from any grader's reward. 404 for a session the gateway does not know."""
    check_session_id(session_id)
    g = _gw(request)
    req = parse_body(await read_control_body(request), ScoreSessionRequest, "invalid score request")
    if g.sessions.live(session_id) is None and await g.store.gateway_session_or_context(session_id) == (
        None,
        None,
    ):
        raise GatewayError(
            404,
            f"unknown session {session_id}: it never called the model and no launcher registered it",
            code="session_not_found",
            param="session_id",
        )
    row = await g.store.set_client_score(session_id, req.as_score(), req.reason)
    return {
        "session_id": session_id,
        "client_score": row.score,
        "reason": row.reason,
        "provenance": row.provenance,
        "recorded_at": row.recorded_at.isoformat(),
    }


async def head_ok(request: Request) -> Response:
    """``HEAD`` of a session's base URL (a client's warm-up or connectivity check): 200, no
    body, whether or not the session was used yet."""
    sid = request.path_params.get("session_id")
    if sid is not None:
        check_session_id(sid)
    return Response(status_code=200)


async def count_tokens(request: Request) -> Response:
    """Sessionless ``POST /v1/messages/count_tokens`` (:mod:`gateway.count_tokens`)."""
    return await count_tokens_handle(request)


async def session_count_tokens(session_id: str, request: Request) -> Response:
    """``POST {base}/{sid}/v1/messages/count_tokens``: never a step of the session."""
    return await count_tokens_handle(request, session_id)


def build_router(session_path: str) -> APIRouter:
    """The routes, with session routes under ``session_path`` (e.g. ``/v1/sessions``)."""
    r = APIRouter()
    sp = session_path
    r.add_api_route("/healthz", healthz, methods=["GET"])
    r.add_api_route("/readyz", readyz, methods=["GET"])
    r.add_api_route("/metrics", metrics, methods=["GET"])
    r.add_api_route("/v1/models", models, methods=["GET"])
    r.add_api_route(sp + "/{session_id}/models", session_models, methods=["GET"])
    r.add_api_route("/v1/models/{model:path}", model, methods=["GET"])
    r.add_api_route(sp + "/{session_id}/models/{model:path}", session_model, methods=["GET"])
    r.add_api_route(sp + "/{session_id}", session_status, methods=["GET"])
    r.add_api_route(sp + "/{session_id}/close", close_session, methods=["POST"])
    r.add_api_route(sp + "/{session_id}/score", score_session, methods=["POST"])
    r.add_api_route("/v1/messages/count_tokens", count_tokens, methods=["POST"])
    r.add_api_route(sp + "/{session_id}/v1/messages/count_tokens", session_count_tokens, methods=["POST"])
    for head in ("", "/", "/v1", "/v1/"):  # the forms of a session base URL a client may probe
        r.add_api_route(sp + "/{session_id}" + head, head_ok, methods=["HEAD"])
    r.add_api_route("/", head_ok, methods=["HEAD"])
    r.add_api_route("/v1", head_ok, methods=["HEAD"])
    return r
