"""Admin endpoints of the upstream worker pools (:mod:`gateway.workers`), under the gateway's admin
keys (:mod:`gateway.auth`; open when auth is off) and JSON bodies only (:mod:`gateway.csrf`).

* ``GET /admin/routes/{route}/workers``: the pool (each worker's health, last error, calls open);
* ``POST /admin/routes/{route}/workers`` with ``{"base_url": "..."}``: add a worker (checked at
  once; sessions it wins by rendezvous hashing move to it);
* ``DELETE /admin/routes/{route}/workers?base_url=...``: remove one; its calls in flight finish
  there, its sessions move (the last worker cannot be removed: 409).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict

from gateway.errors import GatewayError
from gateway.settings import check_worker_url
from gateway.state import GatewayState
from store import redact_url


class AddWorker(BaseModel):
    """``POST /admin/routes/{route}/workers`` body."""

    model_config = ConfigDict(extra="forbid")

    base_url: str


def _pool_answer(gw: GatewayState, route: str) -> dict[str, object]:
    pool = gw.upstream.pools[route]
    return {
        "route": route,
        "pooled": gw.upstream.pooled(route),
        "workers": [w.as_json() for w in pool.workers.values()],
    }


def _route(request: Request, route: str) -> GatewayState:
    gw: GatewayState = request.app.state.gw
    if route not in gw.settings.llm_routes:
        raise GatewayError(404, f"no route {route!r}", code="route_not_found", param="route")
    if gw.settings.llm_routes[route].per_session:
        raise GatewayError(
            400,
            f"route {route!r} has a per-session base_url; it cannot have a pool of workers",
            code="route_not_pooled",
            param="route",
        )
    return gw


async def list_workers(route: str, request: Request) -> dict[str, object]:
    return _pool_answer(_route(request, route), route)


async def add_worker(route: str, body: AddWorker, request: Request) -> dict[str, object]:
    gw = _route(request, route)
    url = body.base_url.rstrip("/")
    try:
        check_worker_url(url)
    except ValueError as e:
        raise GatewayError(400, str(e), code="invalid_worker", param="base_url") from None
    gw.upstream.pools[route].add(url)
    await gw.upstream.check_workers(route)
    return _pool_answer(gw, route)


async def remove_worker(route: str, base_url: str, request: Request) -> dict[str, object]:
    gw = _route(request, route)
    try:
        gw.upstream.pools[route].remove(base_url.rstrip("/"))
    except KeyError:
        raise GatewayError(
            404,
            f"route {route!r} has no worker {redact_url(base_url)!r}",
            code="worker_not_found",
            param="base_url",
        ) from None
    except ValueError as e:
        raise GatewayError(409, str(e), code="last_worker") from None
    return _pool_answer(gw, route)


def build_workers_router() -> APIRouter:
    r = APIRouter()
    r.add_api_route("/admin/routes/{route}/workers", list_workers, methods=["GET"])
    r.add_api_route("/admin/routes/{route}/workers", add_worker, methods=["POST"])
    r.add_api_route("/admin/routes/{route}/workers", remove_worker, methods=["DELETE"])
    return r
