"""Two jobs compared: the comparison page (paired on the cases both scored, then per case) and
one case in both jobs side by side."""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rollout.servers.viewer.params import (
    CASE_PARAMS,
    COMPARE_PAGE,
    COMPARE_PARAMS,
    PAGE_SIZE,
    check_params,
    opt_str,
    page_count,
    page_number,
)
from rollout.servers.viewer.state import state_of
from rollout.servers.viewer.stats import compare_cases, compare_paired
from store.queries import SessionFilter


async def compare(request: Request) -> Response:
    """``/compare?a=JOB&b=JOB``: the paired comparison, each job's summary, the cases by change."""
    v = state_of(request)
    check_params(request, COMPARE_PARAMS)
    a, b = opt_str(request, "a"), opt_str(request, "b")
    ids = await v.queries.job_ids()
    if not a or not b:
        return v.page("compare.html", ids=ids, a=a, b=b, ready=False)
    job_a, job_b = await v.need_job(a), await v.need_job(b)
    cases_a, cases_b = await v.queries.case_outcomes(a), await v.queries.case_outcomes(b)
    paired_rows, paired_all = compare_paired(cases_a, cases_b)
    deltas = compare_cases(cases_a, cases_b)
    if request.query_params.get("changed"):
        deltas = [d for d in deltas if d.delta is None or abs(d.delta) > 1e-9]
    n = page_number(request)
    pages = page_count(len(deltas), n, COMPARE_PAGE)
    args = {k: val for k, val in request.query_params.items() if k != "page" and val}
    return v.page(
        "compare.html",
        ids=ids,
        a=a,
        b=b,
        ready=True,
        job_a=job_a,
        job_b=job_b,
        sum_a=await v.job_summary(a, job_a),
        sum_b=await v.job_summary(b, job_b),
        paired_rows=paired_rows,
        paired_all=paired_all,
        deltas=deltas[(n - 1) * COMPARE_PAGE : n * COMPARE_PAGE],
        n_cases=len(deltas),
        page_no=n,
        pages=pages,
        args=args,
    )


async def compare_case(request: Request) -> Response:
    """``/compare/case``: one case's sessions in both jobs."""
    v = state_of(request)
    check_params(request, CASE_PARAMS)
    a, b, env_name, case_id = (opt_str(request, k) for k in CASE_PARAMS)
    if not (a and b and env_name and case_id):
        raise HTTPException(400, "give a, b (two jobs), env and case")
    sides = []
    for job_id in (a, b):
        await v.need_job(job_id)
        result = await v.queries.session_page(
            job_id, SessionFilter(env_name=env_name, case_id=case_id), limit=PAGE_SIZE
        )
        sides.append((job_id, result))
    return v.page("compare_case.html", a=a, b=b, env_name=env_name, case_id=case_id, sides=sides)


routes = [Route("/compare/case", compare_case), Route("/compare", compare)]
