"""The trajectory viewer: a read-only Starlette app on the store (pages listed in docs/viewer.md).

``create_app(queries, hidden)`` returns the app; ``rollout.cli.viewer`` serves it on loopback.
The routes are module-level functions of one module per page group (``job_pages``,
``session_pages``, ``compare_pages``, ``search_page``, ``api``), each reading its dependencies from
``app.state.viewer`` (``state.ViewerState``). Every route is a GET; an unknown id is a 404 page, a
bad query value a 400 page, and any other error a 500 page without a traceback (logged on the
server).
"""

from __future__ import annotations

import logging
from pathlib import Path

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

from rollout.servers.viewer import api, compare_pages, job_pages, search_page, session_pages
from rollout.servers.viewer.params import PAGE_SIZE
from rollout.servers.viewer.render import templates
from rollout.servers.viewer.report import plotly_js
from rollout.servers.viewer.state import ViewerState, state_of
from rollout.servers.viewer.stats import HiddenFields
from store.queries import ViewerQueries
from store.search import StepSearch

__all__ = ["PAGE_SIZE", "create_app", "refuse_host"]

log = logging.getLogger(__name__)
HERE = Path(__file__).resolve().parent


def refuse_host(scope: Scope, message: str) -> Response:
    """A refused Host (``rollout.servers.listener.run_server``): 400 as the viewer's other errors,
    JSON under ``/api/``, the error page elsewhere."""
    if str(scope.get("path", "")).startswith("/api/"):
        return JSONResponse({"error": message}, status_code=400)
    page = templates().get_template("error.html").render(title="rollout viewer", code=400, message=message)
    return HTMLResponse(page, status_code=400)


async def plotly(request: Request) -> Response:
    """plotly.js for the report's plots, cached a day."""
    return Response(
        plotly_js(), media_type="application/javascript", headers={"Cache-Control": "max-age=86400"}
    )


async def http_error(request: Request, exc: Exception) -> Response:
    """An HTTPException: ``{"error": ...}`` under ``/api/``, the error page elsewhere."""
    assert isinstance(exc, HTTPException)
    if request.url.path.startswith("/api/"):
        return JSONResponse({"error": exc.detail}, status_code=exc.status_code)
    return state_of(request).page(
        "error.html", status=exc.status_code, code=exc.status_code, message=exc.detail
    )


async def server_error(request: Request, exc: Exception) -> Response:
    """Any other error: logged, and a 500 page without the traceback."""
    log.exception("viewer: %s failed", request.url.path, exc_info=exc)
    return state_of(request).page(
        "error.html",
        status=500,
        code=500,
        message=f"the viewer could not show this page ({type(exc).__name__}); see the viewer's log",
    )


def create_app(
    queries: ViewerQueries,
    hidden: HiddenFields,
    *,
    title: str = "rollout viewer",
    search: StepSearch | None = None,
    search_problem: str | None = None,
) -> Starlette:
    """The viewer app on ``queries``; ``hidden`` tells which case fields the runtime was not shown;
    ``search`` answers ``/search`` (None: the page says ``search_problem``)."""
    routes: list[BaseRoute] = [
        *job_pages.routes,
        *session_pages.routes,
        *search_page.routes,
        *compare_pages.routes,
        *api.routes,
        Route("/static/plotly.min.js", plotly),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: server_error})
    app.state.viewer = ViewerState(queries, hidden, title=title, search=search, search_problem=search_problem)
    return app
