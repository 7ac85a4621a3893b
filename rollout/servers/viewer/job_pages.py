"""The job pages: the home page (every job), a job, its groups, one group, its live report, and
the list of sessions without a job."""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from rollout.servers.viewer.params import (
    GROUP_PARAMS,
    JOBLESS_PARAMS,
    PAGE_SIZE,
    check_params,
    one_of,
    page_count,
    page_number,
)
from rollout.servers.viewer.report import build_report
from rollout.servers.viewer.state import job_live, live_every, state_of
from rollout.servers.viewer.stats import counted_scores, job_spreads, spread_of
from rollout.servers.viewer.trajectory_view import divergence, step_views
from store.queries import JOBLESS_SORTS


async def jobs(request: Request) -> Response:
    """``/``: every job, and how many sessions have none."""
    v = state_of(request)
    rows = await v.queries.jobs()
    live = any(j["finished"] < j["sessions"] for j in rows)
    return v.page(
        "jobs.html",
        jobs=rows,
        spreads=job_spreads(await v.queries.case_means()),
        jobless=await v.queries.jobless_count(),
        live_url="/api/jobs" if live else None,
    )


async def jobless(request: Request) -> Response:
    """``/gateway-sessions``: the sessions without a job, paged and sorted."""
    v = state_of(request)
    check_params(request, JOBLESS_PARAMS)
    sort = request.query_params.get("sort", "created")
    if sort not in JOBLESS_SORTS:
        raise HTTPException(400, f"sort={sort!r}: sort by one of {', '.join(JOBLESS_SORTS)}")
    descending = (one_of(request, "dir", ["asc", "desc"]) or "desc") == "desc"
    n = page_number(request)
    result = await v.queries.jobless_page(
        sort=sort, descending=descending, offset=(n - 1) * PAGE_SIZE, limit=PAGE_SIZE
    )
    pages = page_count(result.total, n)
    return v.page("jobless.html", result=result, sort=sort, descending=descending, page_no=n, pages=pages)


async def job(request: Request) -> Response:
    """``/jobs/ID``: the summary, the first groups, counts and the lowest scores."""
    v = state_of(request)
    job_id = request.path_params["job_id"]
    info = await v.need_job(job_id)
    first = await v.queries.groups(job_id, limit=PAGE_SIZE)
    return v.page(
        "job.html",
        job=info,
        groups=first,
        group_spreads=await v.group_spreads(job_id, first),
        summary=list((await v.job_summary(job_id, info)).values()),
        statuses=await v.queries.status_counts(job_id),
        worst=await v.queries.worst_sessions(job_id, 5),
        reasons=await v.queries.failure_reasons(job_id, 10),
        other_jobs=[j for j in await v.queries.job_ids() if j != job_id],
        live_url=job_live(info),
        live_every=live_every(info),
    )


async def groups(request: Request) -> Response:
    """``/jobs/ID/groups``: every group of a job, paged."""
    v = state_of(request)
    job_id = request.path_params["job_id"]
    check_params(request, GROUP_PARAMS)
    info = await v.need_job(job_id)
    n = page_number(request)
    result = await v.queries.groups(job_id, offset=(n - 1) * PAGE_SIZE, limit=PAGE_SIZE)
    pages = page_count(result.total, n)
    return v.page(
        "groups.html",
        job=info,
        groups=result,
        group_spreads=await v.group_spreads(job_id, result),
        page_no=n,
        pages=pages,
    )


async def group(request: Request) -> Response:
    """``/groups/ID``: a group's samples side by side, where they first diverge."""
    v = state_of(request)
    gid = request.path_params["group_id"]
    members = await v.queries.group(gid)
    if not members:
        raise HTTPException(404, f"no group {gid!r} in this store")
    by_sid = await v.queries.steps_of([m["env_id"] for m in members])
    samples = [step_views(by_sid[m["env_id"]]) for m in members]
    common, diffs = divergence(samples)
    return v.page(
        "group.html",
        group_id=gid,
        members=members,
        spread=spread_of(counted_scores(members)),
        samples=samples,
        common=common,
        diffs=diffs,
        longest=max((len(s) for s in samples), default=0),
    )


async def report(request: Request) -> Response:
    """``/jobs/ID/report``: the HTML report, built live."""
    v = state_of(request)
    job_id = request.path_params["job_id"]
    await v.need_job(job_id)
    return HTMLResponse(await build_report(v.queries, job_id, viewer_url="", inline_js=False))


routes = [
    Route("/", jobs),
    Route("/gateway-sessions", jobless),
    Route("/jobs/{job_id}/report", report),
    Route("/jobs/{job_id}", job),
    Route("/jobs/{job_id}/groups", groups),
    Route("/groups/{group_id}", group),
]
