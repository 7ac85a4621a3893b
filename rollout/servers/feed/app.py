"""The feed service: ready groups of a job, in the order they became ready, by durable cursor.

``GET /v1/jobs/{job_id}/groups?after=N`` (long-poll with ``wait``) and
``GET /v1/jobs/{job_id}/groups/stream`` (SSE, resumed with ``Last-Event-ID``); ``GET
/v1/jobs/{job_id}`` (progress), ``GET /healthz``. Reads the store only: the launcher appends feed
entries as groups finish, this process polls for them (docs/feed.md).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Annotated

from fastapi import FastAPI, Header, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from rollout.contract.protocol import model_json
from rollout.errors import RolloutError
from rollout.results.feed_schema import FeedGroupOut, GroupPage, JobProgress, Normalize, View
from rollout.results.groups import GroupOptions, check_min_valid, load_groups
from rollout.servers.listener import bad_query_param
from store import MAX_INT
from store.feed import FeedQueries
from wire.errors import error_body, install_error_handlers

MAX_WAIT_S = 60.0
MAX_LIMIT = 500


@dataclass(frozen=True)
class FeedSettings:
    """The service's defaults: ``min_valid`` valid samples for a trainable group, how often the
    store is polled while a client waits (seconds), and the SSE keep-alive interval (seconds).
    ValueError for a ``min_valid`` below 1 or an interval that is not a finite number above 0."""

    min_valid: int = 2
    poll_interval_s: float = 0.2
    keepalive_s: float = 15.0

    def __post_init__(self) -> None:
        check_min_valid(self.min_valid)
        for name in ("poll_interval_s", "keepalive_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number of seconds above 0, not {value!r}")


class UnknownJob(RolloutError, LookupError):
    """The store has no session of this job."""


async def job_progress(queries: FeedQueries, job_id: str) -> JobProgress:
    """A job's progress; UnknownJob when it has no session."""
    p = await queries.progress(job_id)
    if p["sessions"] == 0:
        raise UnknownJob(job_id)
    return JobProgress(**p, done=p["finished"] == p["sessions"])


async def groups_after(
    queries: FeedQueries, job_id: str, after: int, limit: int, opts: GroupOptions
) -> tuple[list[FeedGroupOut], JobProgress]:
    """The ready groups after cursor ``after`` (at most ``limit``) and the job's progress, read
    BEFORE the groups: when it says ``done``, every group that will ever be ready is already in
    the feed, so an empty answer then means the end. With ``opts.max_policy_lag`` and no
    ``opts.policy_version``, the lag is measured from the newest version stamped in the job."""
    progress = await job_progress(queries, job_id)
    entries = await queries.ready_after(job_id, after, limit)
    if entries and opts.max_policy_lag is not None and opts.policy_version is None:
        opts = replace(opts, policy_version=await queries.latest_policy_version(job_id))
    built = await load_groups(queries, job_id, entries, [e["group_id"] for e in entries], opts)
    return [g for g, _ in built], progress


def _error(status: int, code: str, message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, code=code, param=param), status_code=status)


def _bad_params(request: Request, known: tuple[str, ...]) -> JSONResponse | None:
    """A 400 naming the first query parameter not in ``known`` (``unknown_parameter``: a typo would
    otherwise fall back to the default silently) or given more than once (``repeated_parameter``:
    which one counts would be a guess), or None."""
    bad = bad_query_param(request.query_params.multi_items(), known)
    if bad is None:
        return None
    kind, name = bad
    if kind == "unknown":
        return _error(
            400,
            "unknown_parameter",
            f"unknown query parameter {name!r} (known: {', '.join(known) or 'none'})",
            param=name,
        )
    return _error(
        400,
        "repeated_parameter",
        f"query parameter {name!r} is given more than once (give it once)",
        param=name,
    )


GROUPS_PARAMS = (
    "after",
    "limit",
    "wait",
    "min_valid",
    "normalize",
    "view",
    "max_policy_lag",
    "policy_version",
)
STREAM_PARAMS = ("after", "min_valid", "normalize", "view", "max_policy_lag", "policy_version")


def create_feed_app(
    queries: FeedQueries,
    settings: FeedSettings | None = None,
    backfill: Callable[[str], Awaitable[int]] | None = None,
) -> FastAPI:
    """The feed's FastAPI app on ``queries`` (a reader of the store). ``backfill(job_id)``
    (``Store.backfill_feed``) is called once per job the first time it is asked for while it has
    finished sessions but no feed entry: a job recorded before the feed existed."""
    cfg = settings or FeedSettings()
    app = FastAPI(title="rollout-factory feed", docs_url=None, redoc_url=None)
    install_error_handlers(app)  # every error in the gateway's shape: a bad parameter is a 400 naming it
    checked: set[str] = set()

    async def ensure(job_id: str) -> JobProgress:
        """The job's progress, after the one-time backfill of a job recorded before the feed."""
        progress = await job_progress(queries, job_id)
        if backfill is not None and job_id not in checked:
            checked.add(job_id)
            if progress.finished and not progress.groups_ready and await backfill(job_id):
                progress = await job_progress(queries, job_id)
        return progress

    def options(
        min_valid: int | None,
        normalize: Normalize,
        view: View,
        max_policy_lag: int | None,
        policy_version: int | None,
    ) -> GroupOptions:
        return GroupOptions(
            min_valid=cfg.min_valid if min_valid is None else min_valid,
            normalize=normalize,
            view=view,
            max_policy_lag=max_policy_lag,
            policy_version=policy_version,
        )

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/jobs/{job_id}")
    async def progress(request: Request, job_id: str) -> Response:
        if (bad := _bad_params(request, ())) is not None:
            return bad
        try:
            return Response(model_json(await ensure(job_id)), media_type="application/json")
        except UnknownJob:
            return _error(404, "unknown_job", f"no job {job_id!r} in this store")

    @app.get("/v1/jobs/{job_id}/groups")
    async def groups(
        request: Request,
        job_id: str,
        after: Annotated[int, Query(ge=0, le=MAX_INT)] = 0,
        limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 50,
        wait: Annotated[float, Query(ge=0, le=MAX_WAIT_S)] = 0.0,
        min_valid: Annotated[int | None, Query(ge=1, le=MAX_INT)] = None,
        normalize: Normalize = "std",
        view: View = "full",
        max_policy_lag: Annotated[int | None, Query(ge=0, le=MAX_INT)] = None,
        policy_version: Annotated[int | None, Query(ge=0, le=MAX_INT)] = None,
    ) -> Response:
        if (bad := _bad_params(request, GROUPS_PARAMS)) is not None:
            return bad
        opts = options(min_valid, normalize, view, max_policy_lag, policy_version)
        deadline = time.monotonic() + wait
        try:
            await ensure(job_id)
            while True:
                found, prog = await groups_after(queries, job_id, after, limit, opts)
                left = deadline - time.monotonic()
                if found or prog.done or left <= 0:
                    break
                await asyncio.sleep(min(cfg.poll_interval_s, left))
        except UnknownJob:
            return _error(404, "unknown_job", f"no job {job_id!r} in this store")
        page = GroupPage(
            job_id=job_id,
            after=after,
            next_cursor=(found[-1].cursor or after) if found else after,
            groups=found,
            progress=prog,
        )
        return Response(model_json(page), media_type="application/json")

    @app.get("/v1/jobs/{job_id}/groups/stream")
    async def stream(
        request: Request,
        job_id: str,
        after: Annotated[int, Query(ge=0, le=MAX_INT)] = 0,
        min_valid: Annotated[int | None, Query(ge=1, le=MAX_INT)] = None,
        normalize: Normalize = "std",
        view: View = "full",
        max_policy_lag: Annotated[int | None, Query(ge=0, le=MAX_INT)] = None,
        policy_version: Annotated[int | None, Query(ge=0, le=MAX_INT)] = None,
        last_event_id: Annotated[str | None, Header()] = None,
    ) -> Response:
        if (bad := _bad_params(request, STREAM_PARAMS)) is not None:
            return bad
        opts = options(min_valid, normalize, view, max_policy_lag, policy_version)
        cursor = after
        if last_event_id:
            if not last_event_id.strip().isdigit() or int(last_event_id) > MAX_INT:
                return _error(
                    400,
                    "bad_last_event_id",
                    f"Last-Event-ID must be a cursor (an integer), not {last_event_id!r}",
                    param="last-event-id",
                )
            cursor = int(last_event_id)
        try:
            await ensure(job_id)
        except UnknownJob:
            return _error(404, "unknown_job", f"no job {job_id!r} in this store")
        return StreamingResponse(
            _events(queries, job_id, cursor, opts, cfg),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    return app


async def _events(
    queries: FeedQueries, job_id: str, cursor: int, opts: GroupOptions, cfg: FeedSettings
) -> AsyncIterator[bytes]:
    """SSE events: ``group`` (``id`` = its cursor), comments as keep-alives while idle, and one
    ``done`` event with the progress once every session of the job is finished and sent."""
    idle_since = time.monotonic()
    while True:
        found, prog = await groups_after(queries, job_id, cursor, 20, opts)
        for g in found:
            yield f"id: {g.cursor}\nevent: group\ndata: {model_json(g)}\n\n".encode()
            cursor = g.cursor if g.cursor is not None else cursor
        if found:
            idle_since = time.monotonic()
            continue
        if prog.done:
            yield f"event: done\ndata: {model_json(prog)}\n\n".encode()
            return
        if time.monotonic() - idle_since >= cfg.keepalive_s:
            yield b": keep-alive\n\n"
            idle_since = time.monotonic()
        await asyncio.sleep(cfg.poll_interval_s)
