"""``/search``: the steps whose text holds every word of the query (``store.search``)."""

from __future__ import annotations

from typing import Any

from markupsafe import Markup, escape
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rollout.servers.viewer.params import SEARCH_PAGE, SEARCH_PARAMS, check_params, opt_str, page_number
from rollout.servers.viewer.state import state_of
from store.search import MARK_END, MARK_START

SEARCH_REFRESH = 200
"""Sessions a search indexes at most before it answers (the rest: at the next search)."""


def marked(snippet: str) -> Markup:
    """A search snippet as HTML: escaped, each matched word in ``<mark>``."""
    return Markup(str(escape(snippet)).replace(MARK_START, "<mark>").replace(MARK_END, "</mark>"))


async def find(request: Request) -> Response:
    """The search page: the hits of ``q`` (in ``job`` when given), best first, paged."""
    v = state_of(request)
    check_params(request, SEARCH_PARAMS)
    words = (opt_str(request, "q") or "")[:500]
    job_id = opt_str(request, "job")
    n = page_number(request)
    ids = await v.queries.job_ids()
    if job_id is not None and job_id not in ids:
        raise HTTPException(404, f"no job {job_id!r} in this store")
    problem = v.search_problem or (
        None if v.search is not None else "this viewer was started without a search index"
    )
    ctx: dict[str, Any] = {
        "q": words,
        "job": job_id,
        "ids": ids,
        "page_no": n,
        "problem": problem,
        "hits": [],
        "more": False,
        "pending": 0,
        "sessions": {},
    }
    if v.search is not None and words:
        await v.search.refresh(SEARCH_REFRESH, wait=False)  # not behind the start's full indexing
        result = await v.search.search(words, job_id=job_id, offset=(n - 1) * SEARCH_PAGE, limit=SEARCH_PAGE)
        owners = {h.session_id.split("~a", 1)[0] for h in result.hits}
        ctx.update(
            hits=[(h, marked(h.snippet)) for h in result.hits],
            more=result.more,
            pending=result.pending,
            sessions={sid: r for sid in owners if (r := await v.queries.session(sid)) is not None},
        )
    return v.page("search.html", **ctx)


routes = [Route("/search", find)]
