"""The trajectory viewer: a read-only Starlette app on the store (pages listed in docs/viewer.md).

``create_app(queries, hidden)`` returns the app; ``rollout.cli.viewer`` serves it on loopback.
Every route is a GET; an unknown id is a 404 page, a bad query value a 400 page, and any other
error a 500 page without a traceback (logged on the server).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any
from urllib.parse import quote

from markupsafe import Markup, escape
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

from rollout.results.estimates import Spread
from rollout.results.report import SummaryRow
from rollout.servers.local_server import bad_query_param
from rollout.servers.viewer.render import templates
from rollout.servers.viewer.report import build_report, plotly_js
from rollout.servers.viewer.stats import (
    HiddenFields,
    compare_cases,
    compare_paired,
    counted_scores,
    job_spreads,
    records_of,
    row_key,
    spread_of,
    summary,
)
from rollout.servers.viewer.trajectory_view import divergence, start_request_view, step_views
from rollout.servers.viewer.workspace_tree import WorkspaceError, entries, path_param, read_file
from store.queries import JOBLESS_SORTS, SORTS, Page, SessionFilter, ViewerQueries
from store.search import MARK_END, MARK_START, StepSearch
from wire.text import display_text

log = logging.getLogger(__name__)
HERE = Path(__file__).resolve().parent
PAGE_SIZE = 50
COMPARE_PAGE = 100


LIST_PARAMS = ("env", "case", "model", "status", "eval", "group", "score_min", "score_max", "sort", "dir")
"""The filters and order of a session list; a session page opened from a list carries them (its
previous / next session are that list's)."""
SESSION_PARAMS = (*LIST_PARAMS, "page")
SEARCH_PARAMS = ("q", "job", "page")
JOBLESS_PARAMS = ("sort", "dir", "page")
WORKSPACE_PARAMS = ("path",)
GROUP_PARAMS = ("page",)
CASE_PARAMS = ("a", "b", "env", "case")
SEARCH_PAGE = 50
SEARCH_REFRESH = 200
"""Sessions a search indexes at most before it answers (the rest: at the next search)."""
COMPARE_PARAMS = ("a", "b", "changed", "page")
SESSION_STATUSES = ("pending", "running", "retrying", "succeeded", "failed", "truncated", "timeout", "error",
                    "cancelled")
"""``job_environments.status`` values (store.models.JobEnvironment)."""
EVAL_STATUSES = ("scored", "invalid_reward", "error", "timeout", "grader_broken", "skipped", "infra_error", "none")
"""``job_environments.eval_status`` values; ``none``: not evaluated."""
MAX_PAGE = 10**9


def _check_params(request: Request, known: tuple[str, ...]) -> None:
    """400 for a query parameter not in ``known`` (a typo would otherwise be ignored silently) or
    given twice."""
    bad = bad_query_param(request.query_params.multi_items(), known)
    if bad is not None:
        kind, name = bad
        raise HTTPException(400, f"unknown parameter {name!r} (known: {', '.join(known)})" if kind == "unknown"
                            else f"parameter {name!r} is given more than once")


def _opt_float(request: Request, name: str) -> float | None:
    raw = request.query_params.get(name, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise HTTPException(400, f"{name}={raw!r} is not a number") from None
    if not math.isfinite(value):
        raise HTTPException(400, f"{name}={raw!r} is not a finite number")
    return value


def _opt_str(request: Request, name: str) -> str | None:
    raw = request.query_params.get(name, "").strip()
    return raw or None


def _one_of(request: Request, name: str, allowed: list[str]) -> str | None:
    """The value of ``name`` when it is one of ``allowed`` (None when absent), else 400."""
    value = _opt_str(request, name)
    if value is not None and value not in allowed:
        raise HTTPException(400, f"{name}={value!r}: use one of {', '.join(allowed)}")
    return value


def _page(request: Request) -> int:
    raw = request.query_params.get("page", "1").strip() or "1"
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_PAGE:
        raise HTTPException(400, f"page={raw[:40]!r} is not a page number (1 to {MAX_PAGE})")
    return int(raw)


def list_args(request: Request) -> dict[str, str]:
    """The non-empty :data:`LIST_PARAMS` of a request, in that order."""
    return {k: v for k in LIST_PARAMS if (v := request.query_params.get(k, "").strip())}


def marked(snippet: str) -> Markup:
    """A search snippet as HTML: escaped, each matched word in ``<mark>``."""
    return Markup(str(escape(snippet)).replace(MARK_START, "<mark>").replace(MARK_END, "</mark>"))


CSP_TEXT = "default-src 'none'; sandbox"
"""The Content-Security-Policy of a raw workspace file: nothing loads, nothing runs."""


def _job_live(job: dict[str, Any]) -> str | None:
    """The progress URL a job's pages poll while the job has unfinished sessions."""
    return None if job["finished"] >= job["sessions"] else f"/api/jobs/{quote(job['job_id'], safe='')}/progress"


def _live_every(job: dict[str, Any]) -> int:
    """Milliseconds between polls of a running job's pages: 2 s, 10 s from 5,000 sessions on
    (each reload of a big job's page costs the server more)."""
    return 2000 if job["sessions"] < 5000 else 10_000


def refuse_host(scope: Scope, message: str) -> Response:
    """A refused Host (``rollout.servers.local_server.run_server``): 400 as the viewer's other errors,
    JSON under ``/api/``, the error page elsewhere."""
    if str(scope.get("path", "")).startswith("/api/"):
        return JSONResponse({"error": message}, status_code=400)
    page = templates().get_template("error.html").render(title="rollout viewer", code=400, message=message)
    return HTMLResponse(page, status_code=400)


def create_app(queries: ViewerQueries, hidden: HiddenFields, *, title: str = "rollout viewer",
               search: StepSearch | None = None, search_problem: str | None = None) -> Starlette:
    """The viewer app on ``queries``; ``hidden`` tells which case fields the runtime was not shown;
    ``search`` answers ``/search`` (None: the page says ``search_problem``)."""
    env = templates()
    summaries: dict[str, tuple[tuple[Any, ...], dict[tuple[str, str], SummaryRow]]] = {}

    def page(name: str, status: int = 200, **ctx: Any) -> HTMLResponse:
        return HTMLResponse(display_text(env.get_template(name).render(title=title, **ctx)), status_code=status)

    async def group_spreads(job_id: str, groups: Page) -> dict[str, Spread]:
        scores = await queries.group_scores(job_id, [g["group_id"] for g in groups.rows])
        return {gid: spread_of(v) for gid, v in scores.items()}

    async def need_job(job_id: str) -> dict[str, Any]:
        job = await queries.job(job_id)
        if job is None:
            raise HTTPException(404, f"no job {job_id!r} in this store")
        return job

    async def jobs(request: Request) -> Response:
        rows = await queries.jobs()
        live = any(j["finished"] < j["sessions"] for j in rows)
        return page("jobs.html", jobs=rows, spreads=job_spreads(await queries.case_means()),
                    jobless=await queries.jobless_count(), live_url="/api/jobs" if live else None)

    async def jobless(request: Request) -> Response:
        _check_params(request, JOBLESS_PARAMS)
        sort = request.query_params.get("sort", "created")
        if sort not in JOBLESS_SORTS:
            raise HTTPException(400, f"sort={sort!r}: sort by one of {', '.join(JOBLESS_SORTS)}")
        descending = (_one_of(request, "dir", ["asc", "desc"]) or "desc") == "desc"
        n = _page(request)
        result = await queries.jobless_page(sort=sort, descending=descending, offset=(n - 1) * PAGE_SIZE,
                                            limit=PAGE_SIZE)
        pages = max(1, math.ceil(result.total / PAGE_SIZE))
        if n > pages:
            raise HTTPException(404, f"page {n} of {pages}: no such page")
        return page("jobless.html", result=result, sort=sort, descending=descending, page_no=n, pages=pages)

    async def jobless_session(sid: str) -> Response:
        """A session the gateway recorded without a launcher row: its steps and gateway state."""
        gateway = await queries.gateway_session(sid)
        steps = await queries.steps(sid)
        if gateway is None and not steps:
            raise HTTPException(404, f"no session {sid!r} in this store")
        return page("jobless_session.html", sid=sid, steps=step_views(steps), gateway=gateway,
                    client=await queries.client_score(sid))

    async def job(request: Request) -> Response:
        job_id = request.path_params["job_id"]
        info = await need_job(job_id)
        first = await queries.groups(job_id, limit=PAGE_SIZE)
        return page("job.html", job=info, groups=first, group_spreads=await group_spreads(job_id, first),
                    summary=list((await job_summary(job_id, info)).values()), statuses=await queries.status_counts(job_id),
                    worst=await queries.worst_sessions(job_id, 5), reasons=await queries.failure_reasons(job_id, 10),
                    other_jobs=[j for j in await queries.job_ids() if j != job_id],
                    live_url=_job_live(info), live_every=_live_every(info))

    async def list_filter(request: Request, job_id: str, *, menus: bool = True
                          ) -> tuple[SessionFilter, str, bool, dict[str, list[str]]]:
        """The session list's filter, sort key and direction of a request, and the filter values
        (read unless no ``menus`` are shown and no status is filtered)."""
        needed = menus or any(request.query_params.get(k) for k in ("status", "eval"))
        values = await queries.filter_values(job_id) if needed else {"status": [], "eval_status": []}
        # a status this version does not know still filters
        flt = SessionFilter(env_name=_opt_str(request, "env"), case_id=_opt_str(request, "case"),
                            llm_model=_opt_str(request, "model"),
                            status=_one_of(request, "status", sorted({*SESSION_STATUSES, *values["status"]})),
                            eval_status=_one_of(request, "eval", sorted({*EVAL_STATUSES, *values["eval_status"]})),
                            group_id=_opt_str(request, "group"),
                            score_min=_opt_float(request, "score_min"), score_max=_opt_float(request, "score_max"))
        if flt.score_min is not None and flt.score_max is not None and flt.score_min > flt.score_max:
            raise HTTPException(400, f"score_min={flt.score_min:g} is above score_max={flt.score_max:g}: "
                                     "no score can match")
        sort = request.query_params.get("sort", "order")
        if sort not in SORTS:
            raise HTTPException(400, f"sort={sort!r}: sort by one of {', '.join(SORTS)}")
        return flt, sort, _one_of(request, "dir", ["asc", "desc"]) == "desc", values

    async def sessions(request: Request) -> Response:
        job_id = request.path_params["job_id"]
        _check_params(request, SESSION_PARAMS)
        info = await need_job(job_id)
        flt, sort, descending, values = await list_filter(request, job_id)
        n = _page(request)
        result = await queries.session_page(job_id, flt, sort=sort, descending=descending,
                                            offset=(n - 1) * PAGE_SIZE, limit=PAGE_SIZE)
        pages = max(1, math.ceil(result.total / PAGE_SIZE))
        if n > pages:
            raise HTTPException(404, f"page {n} of {pages}: no such page")
        args = {k: v for k, v in request.query_params.items() if k != "page" and v}
        return page("sessions.html", job=info, result=result, flt=flt, sort=sort, descending=descending,
                    page_no=n, pages=pages, args=args, values=values, list_query=list_args(request),
                    live_url=_job_live(info), live_every=_live_every(info))

    async def session(request: Request) -> Response:
        sid = request.path_params["session_id"]
        _check_params(request, LIST_PARAMS)
        row = await queries.session(sid)
        if row is None:
            return await jobless_session(sid)
        flt, sort, descending, _ = await list_filter(request, row["job_id"], menus=False)
        near = await queries.neighbours(row["job_id"], flt, sid, sort=sort, descending=descending)
        in_list = list_args(request)
        if near is not None:
            near["list_page"] = (near["position"] - 1) // PAGE_SIZE + 1
        steps = step_views(await queries.steps(sid))
        earlier = await queries.earlier_attempt_steps(sid)
        attempts: dict[str, list[Any]] = {}
        for s in earlier:
            attempts.setdefault(s["session_id"], []).append(s)
        hidden_fields = hidden.of(row["env_name"])
        dataset = (row.get("env_params") or {}).get("dataset")
        evaluation = None
        for view in reversed(steps):
            meta = view.row.get("meta_json") or {}
            if isinstance(meta, dict) and "evaluation" in meta:
                evaluation = meta["evaluation"]
                break
        workspace = await queries.workspace(sid, archive=False)
        return page("session.html", s=row, steps=steps, start=start_request_view(row, hidden_fields),
                    near=near, list_query=in_list, workspace=workspace,
                    hidden_fields=hidden_fields, dataset=dataset, evaluation=evaluation,
                    attempts={k: step_views(v) for k, v in attempts.items()},
                    gateway=await queries.gateway_session(sid), optional=await queries.optional_rows(sid),
                    client=await queries.client_score(sid),
                    live_url=None if row["finished"] else f"/api/sessions/{quote(sid, safe='')}/progress")

    async def step(request: Request) -> Response:
        sid, raw_seq = request.path_params["session_id"], request.path_params["seq"]
        row = await queries.step(sid, int(raw_seq)) if raw_seq.isdigit() else None
        if row is None:
            raise HTTPException(404, f"no step {raw_seq!r} of session {sid!r} in this store")
        view = step_views([row])[0]
        return page("step.html", st=view, r=row, owner=sid.split("~a", 1)[0])

    async def workspace(request: Request) -> Response:
        sid = request.path_params["session_id"]
        _check_params(request, WORKSPACE_PARAMS)
        row = await queries.session(sid)
        if row is None:
            raise HTTPException(404, f"no session {sid!r} in this store")
        kept = await queries.workspace(sid)
        if kept is None or kept["archive"] is None:
            reason = kept["reason"] if kept else "the store holds no final workspace of this session"
            return page("workspace.html", s=row, kept=kept, reason=reason, tree=[], more=0, file=None, path=None)
        raw = path_param(request.scope["query_string"])
        try:
            tree, more = entries(kept["archive"])
            file = read_file(kept["archive"], raw) if raw else None
        except WorkspaceError as e:
            raise HTTPException(404 if raw else 500, str(e)) from None
        return page("workspace.html", s=row, kept=kept, reason=None, tree=tree, more=more, file=file, path=raw)

    async def workspace_raw(request: Request) -> Response:
        sid = request.path_params["session_id"]
        _check_params(request, WORKSPACE_PARAMS)
        kept = await queries.workspace(sid)
        if kept is None or kept["archive"] is None:
            raise HTTPException(404, f"no kept workspace of session {sid!r}")
        try:
            file = read_file(kept["archive"], path_param(request.scope["query_string"]) or "")
        except WorkspaceError as e:
            raise HTTPException(404, str(e)) from None
        return Response(file.head, media_type="text/plain; charset=utf-8",
                        headers={"X-Content-Type-Options": "nosniff", "Content-Security-Policy": CSP_TEXT,
                                 "Content-Disposition": "inline", "Cache-Control": "no-store"})

    async def find(request: Request) -> Response:
        _check_params(request, SEARCH_PARAMS)
        words = (_opt_str(request, "q") or "")[:500]
        job_id = _opt_str(request, "job")
        n = _page(request)
        ids = await queries.job_ids()
        if job_id is not None and job_id not in ids:
            raise HTTPException(404, f"no job {job_id!r} in this store")
        problem = search_problem or (None if search is not None else "this viewer was started without a search index")
        ctx: dict[str, Any] = {"q": words, "job": job_id, "ids": ids, "page_no": n, "problem": problem,
                               "hits": [], "more": False, "pending": 0, "sessions": {}}
        if search is not None and words:
            await search.refresh(SEARCH_REFRESH, wait=False)  # not behind the start's full indexing
            result = await search.search(words, job_id=job_id, offset=(n - 1) * SEARCH_PAGE, limit=SEARCH_PAGE)
            owners = {h.session_id.split("~a", 1)[0] for h in result.hits}
            ctx.update(hits=[(h, marked(h.snippet)) for h in result.hits], more=result.more, pending=result.pending,
                       sessions={sid: r for sid in owners if (r := await queries.session(sid)) is not None})
        return page("search.html", **ctx)

    async def groups(request: Request) -> Response:
        job_id = request.path_params["job_id"]
        _check_params(request, GROUP_PARAMS)
        info = await need_job(job_id)
        n = _page(request)
        result = await queries.groups(job_id, offset=(n - 1) * PAGE_SIZE, limit=PAGE_SIZE)
        pages = max(1, math.ceil(result.total / PAGE_SIZE))
        if n > pages:
            raise HTTPException(404, f"page {n} of {pages}: no such page")
        return page("groups.html", job=info, groups=result, group_spreads=await group_spreads(job_id, result),
                    page_no=n, pages=pages)

    async def compare_case(request: Request) -> Response:
        _check_params(request, CASE_PARAMS)
        a, b, env_name, case_id = (_opt_str(request, k) for k in CASE_PARAMS)
        if not (a and b and env_name and case_id):
            raise HTTPException(400, "give a, b (two jobs), env and case")
        sides = []
        for job_id in (a, b):
            await need_job(job_id)
            result = await queries.session_page(job_id, SessionFilter(env_name=env_name, case_id=case_id),
                                                limit=PAGE_SIZE)
            sides.append((job_id, result))
        return page("compare_case.html", a=a, b=b, env_name=env_name, case_id=case_id, sides=sides)

    async def group(request: Request) -> Response:
        gid = request.path_params["group_id"]
        members = await queries.group(gid)
        if not members:
            raise HTTPException(404, f"no group {gid!r} in this store")
        by_sid = await queries.steps_of([m["env_id"] for m in members])
        samples = [step_views(by_sid[m["env_id"]]) for m in members]
        common, diffs = divergence(samples)
        return page("group.html", group_id=gid, members=members, spread=spread_of(counted_scores(members)),
                    samples=samples, common=common, diffs=diffs,
                    longest=max((len(s) for s in samples), default=0))

    async def job_summary(job_id: str, info: dict[str, Any]) -> dict[tuple[str, str], SummaryRow]:
        """The launcher's summary of a job, computed again only when a session finished since."""
        key = (info["sessions"], info["finished"], info["finished_at"])
        cached = summaries.get(job_id)
        if cached is None or cached[0] != key:
            rows = summary(records_of(await queries.summary_rows(job_id)))
            cached = summaries[job_id] = (key, {row_key(r): r for r in rows})
        return cached[1]

    async def compare(request: Request) -> Response:
        _check_params(request, COMPARE_PARAMS)
        a, b = _opt_str(request, "a"), _opt_str(request, "b")
        ids = await queries.job_ids()
        if not a or not b:
            return page("compare.html", ids=ids, a=a, b=b, ready=False)
        job_a, job_b = await need_job(a), await need_job(b)
        cases_a, cases_b = await queries.case_outcomes(a), await queries.case_outcomes(b)
        paired_rows, paired_all = compare_paired(cases_a, cases_b)
        deltas = compare_cases(cases_a, cases_b)
        if request.query_params.get("changed"):
            deltas = [d for d in deltas if d.delta is None or abs(d.delta) > 1e-9]
        n = _page(request)
        pages = max(1, math.ceil(len(deltas) / COMPARE_PAGE))
        if n > pages:
            raise HTTPException(404, f"page {n} of {pages}: no such page")
        args = {k: v for k, v in request.query_params.items() if k != "page" and v}
        return page("compare.html", ids=ids, a=a, b=b, ready=True, job_a=job_a, job_b=job_b,
                    sum_a=await job_summary(a, job_a), sum_b=await job_summary(b, job_b),
                    paired_rows=paired_rows, paired_all=paired_all,
                    deltas=deltas[(n - 1) * COMPARE_PAGE:n * COMPARE_PAGE], n_cases=len(deltas),
                    page_no=n, pages=pages, args=args)

    async def compare_json(request: Request) -> Response:
        _check_params(request, ("a", "b"))
        a, b = _opt_str(request, "a"), _opt_str(request, "b")
        if not a or not b:
            raise HTTPException(400, "give a and b (two jobs)")
        await need_job(a)
        await need_job(b)
        rows, every = compare_paired(await queries.case_outcomes(a), await queries.case_outcomes(b))
        return JSONResponse({"a": a, "b": b, "all": every.as_json(), "envs": [r.as_json() for r in rows]})

    async def report(request: Request) -> Response:
        job_id = request.path_params["job_id"]
        await need_job(job_id)
        return HTMLResponse(await build_report(queries, job_id, viewer_url="", inline_js=False))

    async def jobs_progress(request: Request) -> Response:
        return JSONResponse([{k: j[k] for k in ("job_id", "sessions", "finished", "running")}
                             for j in await queries.jobs()])

    async def job_progress(request: Request) -> Response:
        info = await need_job(request.path_params["job_id"])
        return JSONResponse({k: info[k] for k in ("sessions", "finished", "running", "errors", "scored")})

    async def session_progress(request: Request) -> Response:
        p = await queries.progress(request.path_params["session_id"])
        if p is None:
            raise HTTPException(404, "no such session")
        return JSONResponse(p)

    async def plotly(request: Request) -> Response:
        return Response(plotly_js(), media_type="application/javascript",
                        headers={"Cache-Control": "max-age=86400"})

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": exc.detail}, status_code=exc.status_code)
        return page("error.html", status=exc.status_code, code=exc.status_code, message=exc.detail)

    async def server_error(request: Request, exc: Exception) -> Response:
        log.exception("viewer: %s failed", request.url.path, exc_info=exc)
        return page("error.html", status=500, code=500,
                    message=f"the viewer could not show this page ({type(exc).__name__}); see the viewer's log")

    routes = [
        Route("/", jobs), Route("/gateway-sessions", jobless), Route("/jobs/{job_id}/sessions", sessions), Route("/jobs/{job_id}/report", report),
        Route("/jobs/{job_id}", job), Route("/sessions/{session_id}", session),
        Route("/sessions/{session_id}/steps/{seq}", step),
        Route("/sessions/{session_id}/workspace", workspace), Route("/sessions/{session_id}/workspace/raw", workspace_raw),
        Route("/search", find), Route("/jobs/{job_id}/groups", groups), Route("/compare/case", compare_case),
        Route("/groups/{group_id}", group), Route("/compare", compare),
        Route("/api/jobs", jobs_progress), Route("/api/compare", compare_json), Route("/api/jobs/{job_id}/progress", job_progress),
        Route("/api/sessions/{session_id}/progress", session_progress),
        Route("/static/plotly.min.js", plotly),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: server_error})
