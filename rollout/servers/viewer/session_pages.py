"""The session pages: a job's session list, one session (with or without a job), one step, and
the session's kept workspace (as a tree, and a file's raw bytes)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rollout.servers.viewer.params import (
    EVAL_STATUSES,
    LIST_PARAMS,
    PAGE_SIZE,
    SESSION_PARAMS,
    SESSION_STATUSES,
    WORKSPACE_PARAMS,
    check_params,
    list_args,
    one_of,
    opt_float,
    opt_str,
    page_count,
    page_number,
)
from rollout.servers.viewer.state import ViewerState, job_live, live_every, state_of
from rollout.servers.viewer.trajectory_view import start_request_view, step_views
from rollout.servers.viewer.workspace_tree import WorkspaceError, entries, path_param, read_file
from store.queries import SORTS, SessionFilter

CSP_TEXT = "default-src 'none'; sandbox"
"""The Content-Security-Policy of a raw workspace file: nothing loads, nothing runs."""


async def list_filter(
    v: ViewerState, request: Request, job_id: str, *, menus: bool = True
) -> tuple[SessionFilter, str, bool, dict[str, list[str]]]:
    """The session list's filter, sort key and direction of a request, and the filter values
    (read unless no ``menus`` are shown and no status is filtered)."""
    needed = menus or any(request.query_params.get(k) for k in ("status", "eval"))
    values = await v.queries.filter_values(job_id) if needed else {"status": [], "eval_status": []}
    # a status this version does not know still filters
    flt = SessionFilter(
        env_name=opt_str(request, "env"),
        case_id=opt_str(request, "case"),
        llm_model=opt_str(request, "model"),
        status=one_of(request, "status", sorted({*SESSION_STATUSES, *values["status"]})),
        eval_status=one_of(request, "eval", sorted({*EVAL_STATUSES, *values["eval_status"]})),
        group_id=opt_str(request, "group"),
        score_min=opt_float(request, "score_min"),
        score_max=opt_float(request, "score_max"),
    )
    if flt.score_min is not None and flt.score_max is not None and flt.score_min > flt.score_max:
        raise HTTPException(
            400, f"score_min={flt.score_min:g} is above score_max={flt.score_max:g}: no score can match"
        )
    sort = request.query_params.get("sort", "order")
    if sort not in SORTS:
        raise HTTPException(400, f"sort={sort!r}: sort by one of {', '.join(SORTS)}")
    return flt, sort, one_of(request, "dir", ["asc", "desc"]) == "desc", values


async def sessions(request: Request) -> Response:
    """``/jobs/ID/sessions``: a job's sessions, filtered, sorted and paged in SQL."""
    v = state_of(request)
    job_id = request.path_params["job_id"]
    check_params(request, SESSION_PARAMS)
    info = await v.need_job(job_id)
    flt, sort, descending, values = await list_filter(v, request, job_id)
    n = page_number(request)
    result = await v.queries.session_page(
        job_id, flt, sort=sort, descending=descending, offset=(n - 1) * PAGE_SIZE, limit=PAGE_SIZE
    )
    pages = page_count(result.total, n)
    args = {k: val for k, val in request.query_params.items() if k != "page" and val}
    return v.page(
        "sessions.html",
        job=info,
        result=result,
        flt=flt,
        sort=sort,
        descending=descending,
        page_no=n,
        pages=pages,
        args=args,
        values=values,
        list_query=list_args(request),
        live_url=job_live(info),
        live_every=live_every(info),
    )


async def jobless_session(v: ViewerState, sid: str) -> Response:
    """A session the gateway recorded without a launcher row: its steps and gateway state."""
    gateway = await v.queries.gateway_session(sid)
    steps = await v.queries.steps(sid)
    if gateway is None and not steps:
        raise HTTPException(404, f"no session {sid!r} in this store")
    return v.page(
        "jobless_session.html",
        sid=sid,
        steps=step_views(steps),
        gateway=gateway,
        client=await v.queries.client_score(sid),
    )


async def session(request: Request) -> Response:
    """``/sessions/ID``: the verdict, every step, and the rest of what the store holds of it."""
    v = state_of(request)
    sid = request.path_params["session_id"]
    check_params(request, LIST_PARAMS)
    row = await v.queries.session(sid)
    if row is None:
        return await jobless_session(v, sid)
    flt, sort, descending, _ = await list_filter(v, request, row["job_id"], menus=False)
    near = await v.queries.neighbours(row["job_id"], flt, sid, sort=sort, descending=descending)
    if near is not None:
        near["list_page"] = (near["position"] - 1) // PAGE_SIZE + 1
    steps = step_views(await v.queries.steps(sid))
    attempts: dict[str, list[Any]] = {}
    for s in await v.queries.earlier_attempt_steps(sid):
        attempts.setdefault(s["session_id"], []).append(s)
    hidden_fields = v.hidden.of(row["env_name"])
    evaluation = None
    for view in reversed(steps):
        meta = view.row.get("meta_json") or {}
        if isinstance(meta, dict) and "evaluation" in meta:
            evaluation = meta["evaluation"]
            break
    return v.page(
        "session.html",
        s=row,
        steps=steps,
        start=start_request_view(row, hidden_fields),
        near=near,
        list_query=list_args(request),
        workspace=await v.queries.workspace(sid, archive=False),
        hidden_fields=hidden_fields,
        dataset=(row.get("env_params") or {}).get("dataset"),
        evaluation=evaluation,
        attempts={k: step_views(s) for k, s in attempts.items()},
        gateway=await v.queries.gateway_session(sid),
        optional=await v.queries.optional_rows(sid),
        client=await v.queries.client_score(sid),
        live_url=None if row["finished"] else f"/api/sessions/{quote(sid, safe='')}/progress",
    )


async def step(request: Request) -> Response:
    """``/sessions/ID/steps/SEQ``: one step's whole conversation and raw request and response."""
    v = state_of(request)
    sid, raw_seq = request.path_params["session_id"], request.path_params["seq"]
    row = await v.queries.step(sid, int(raw_seq)) if raw_seq.isdigit() else None
    if row is None:
        raise HTTPException(404, f"no step {raw_seq!r} of session {sid!r} in this store")
    return v.page("step.html", st=step_views([row])[0], r=row, owner=sid.split("~a", 1)[0])


async def workspace(request: Request) -> Response:
    """``/sessions/ID/workspace``: the kept final workspace as a file tree, one file shown."""
    v = state_of(request)
    sid = request.path_params["session_id"]
    check_params(request, WORKSPACE_PARAMS)
    row = await v.queries.session(sid)
    if row is None:
        raise HTTPException(404, f"no session {sid!r} in this store")
    kept = await v.queries.workspace(sid)
    if kept is None or kept["archive"] is None:
        reason = kept["reason"] if kept else "the store holds no final workspace of this session"
        return v.page(
            "workspace.html", s=row, kept=kept, reason=reason, tree=[], more=0, file=None, path=None
        )
    raw = path_param(request.scope["query_string"])
    try:
        tree, more = entries(kept["archive"])
        file = read_file(kept["archive"], raw) if raw else None
    except WorkspaceError as e:
        raise HTTPException(404 if raw else 500, str(e)) from None
    return v.page("workspace.html", s=row, kept=kept, reason=None, tree=tree, more=more, file=file, path=raw)


async def workspace_raw(request: Request) -> Response:
    """``/sessions/ID/workspace/raw``: a kept file's bytes as inert text."""
    v = state_of(request)
    sid = request.path_params["session_id"]
    check_params(request, WORKSPACE_PARAMS)
    kept = await v.queries.workspace(sid)
    if kept is None or kept["archive"] is None:
        raise HTTPException(404, f"no kept workspace of session {sid!r}")
    try:
        file = read_file(kept["archive"], path_param(request.scope["query_string"]) or "")
    except WorkspaceError as e:
        raise HTTPException(404, str(e)) from None
    return Response(
        file.head,
        media_type="text/plain; charset=utf-8",
        headers={
            "X-Content-Type-Options": "nosniff",
            "Content-Security-Policy": CSP_TEXT,
            "Content-Disposition": "inline",
            "Cache-Control": "no-store",
        },
    )


routes = [
    Route("/jobs/{job_id}/sessions", sessions),
    Route("/sessions/{session_id}", session),
    Route("/sessions/{session_id}/steps/{seq}", step),
    Route("/sessions/{session_id}/workspace", workspace),
    Route("/sessions/{session_id}/workspace/raw", workspace_raw),
]
