"""What every page of the viewer needs, kept on ``app.state.viewer``: the store's queries, the
hidden fields, the search index, the templates, and the job summaries computed so far."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse

from rollout.results.estimates import Spread
from rollout.results.report import SummaryRow
from rollout.servers.viewer.render import templates
from rollout.servers.viewer.stats import HiddenFields, records_of, row_key, spread_of, summary
from store.queries import Page, ViewerQueries
from store.search import StepSearch
from wire.text import display_text


class ViewerState:
    """The viewer's dependencies and its one cache (each job's summary, by its progress)."""

    def __init__(
        self,
        queries: ViewerQueries,
        hidden: HiddenFields,
        *,
        title: str,
        search: StepSearch | None,
        search_problem: str | None,
    ) -> None:
        self.queries = queries
        self.hidden = hidden
        self.title = title
        self.search = search
        self.search_problem = search_problem
        self.env = templates()
        self._summaries: dict[str, tuple[tuple[Any, ...], dict[tuple[str, str], SummaryRow]]] = {}

    def page(self, name: str, status: int = 200, **ctx: Any) -> HTMLResponse:
        """Template ``name`` rendered with ``ctx``."""
        html = self.env.get_template(name).render(title=self.title, **ctx)
        return HTMLResponse(display_text(html), status_code=status)

    async def need_job(self, job_id: str) -> dict[str, Any]:
        """The job's row, else 404."""
        job = await self.queries.job(job_id)
        if job is None:
            raise HTTPException(404, f"no job {job_id!r} in this store")
        return job

    async def job_summary(self, job_id: str, info: dict[str, Any]) -> dict[tuple[str, str], SummaryRow]:
        """The launcher's summary of a job, computed again only when a session finished since."""
        key = (info["sessions"], info["finished"], info["finished_at"])
        cached = self._summaries.get(job_id)
        if cached is None or cached[0] != key:
            rows = summary(records_of(await self.queries.summary_rows(job_id)))
            cached = self._summaries[job_id] = (key, {row_key(r): r for r in rows})
        return cached[1]

    async def group_spreads(self, job_id: str, groups: Page) -> dict[str, Spread]:
        """The spread of each listed group's counted scores (its mean's standard error)."""
        scores = await self.queries.group_scores(job_id, [g["group_id"] for g in groups.rows])
        return {gid: spread_of(v) for gid, v in scores.items()}


def state_of(request: Request) -> ViewerState:
    """The :class:`ViewerState` of the app serving ``request``."""
    state: ViewerState = request.app.state.viewer
    return state


def job_live(job: dict[str, Any]) -> str | None:
    """The progress URL a job's pages poll while the job has unfinished sessions."""
    return (
        None if job["finished"] >= job["sessions"] else f"/api/jobs/{quote(job['job_id'], safe='')}/progress"
    )


def live_every(job: dict[str, Any]) -> int:
    """Milliseconds between polls of a running job's pages: 2 s, 10 s from 5,000 sessions on
    (each reload of a big job's page costs the server more)."""
    return 2000 if job["sessions"] < 5000 else 10_000
