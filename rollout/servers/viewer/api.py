"""The viewer's JSON: the paired comparison of two jobs, and the progress a live page polls.
An error is ``{"error": ...}`` (the app's handler for paths under ``/api/``)."""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rollout.servers.viewer.params import check_params, opt_str
from rollout.servers.viewer.state import state_of
from rollout.servers.viewer.stats import compare_paired


async def compare_json(request: Request) -> Response:
    """``/api/compare?a=JOB&b=JOB``: the paired comparison, per env and over all envs."""
    v = state_of(request)
    check_params(request, ("a", "b"))
    a, b = opt_str(request, "a"), opt_str(request, "b")
    if not a or not b:
        raise HTTPException(400, "give a and b (two jobs)")
    await v.need_job(a)
    await v.need_job(b)
    rows, every = compare_paired(await v.queries.case_outcomes(a), await v.queries.case_outcomes(b))
    return JSONResponse({"a": a, "b": b, "all": every.as_json(), "envs": [r.as_json() for r in rows]})


async def jobs_progress(request: Request) -> Response:
    """``/api/jobs``: each job's sessions, finished and running (the home page polls it)."""
    return JSONResponse(
        [
            {k: j[k] for k in ("job_id", "sessions", "finished", "running")}
            for j in await state_of(request).queries.jobs()
        ]
    )


async def job_progress(request: Request) -> Response:
    """``/api/jobs/ID/progress``: what a running job's pages poll."""
    info = await state_of(request).need_job(request.path_params["job_id"])
    return JSONResponse({k: info[k] for k in ("sessions", "finished", "running", "errors", "scored")})


async def session_progress(request: Request) -> Response:
    """``/api/sessions/ID/progress``: what a running session's page polls."""
    p = await state_of(request).queries.progress(request.path_params["session_id"])
    if p is None:
        raise HTTPException(404, "no such session")
    return JSONResponse(p)


routes = [
    Route("/api/jobs", jobs_progress),
    Route("/api/compare", compare_json),
    Route("/api/jobs/{job_id}/progress", job_progress),
    Route("/api/sessions/{session_id}/progress", session_progress),
]
