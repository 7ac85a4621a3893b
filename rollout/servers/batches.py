"""``python launcher.py serve``: a long-running launcher. The gateway (and the managed model
server) start once; a trainer submits batches over HTTP and reads their groups back from the
feed routes of the same process, without restarting anything between batches (docs/feed.md).

``POST /v1/batches`` (a :class:`BatchRequest`) plans the batch as a new job at once (bad envs or
cases are a 400) and queues it; batches run one after another, each with ``pool_size`` sessions
at once, through the same path as a launcher job (``rollout.jobs.prepare.select_envs`` to accept
it, ``rollout.jobs.run.run_sessions`` to run it). ``GET /v1/batches[/{job_id}]`` says where
they are; ``GET /v1/jobs/{job_id}/groups`` is the feed. A web page's request (``Origin``,
``Sec-Fetch-Site``) to change anything is a 403, a body that is not JSON a 415 (``gateway.csrf``).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.csrf import JsonOnlyGuard
from gateway.settings import GatewaySettings
from rollout.core.envs import MAX_GROUP_SIZE, Case, EnvConfig
from rollout.core.plan import plan_sessions
from rollout.core.setup import SetupError, init_store, load_gateway_settings, open_store
from rollout.errors import RolloutError
from rollout.jobs.lease import JobLease, JobLockError
from rollout.jobs.options import JobContext, JobOptions
from rollout.jobs.prepare import check_sandbox, job_models, load_envs, select_envs
from rollout.jobs.processes import (
    GATEWAY_ADMIN_KEY_ENV,
    ChildProcess,
    ServiceError,
    auth_headers,
    check_gateway,
    gateway_admin_key,
    gateway_api_key,
    gateway_root,
)
from rollout.jobs.run import run_sessions, start_services
from rollout.servers.feed.app import FeedSettings, create_feed_app
from rollout.servers.listener import DEFAULT_EDGE, HttpEdge, listen, run_server, url_of
from store import JOB_ID_PATTERN, MAX_INT, JobEnvironment, Store
from store.feed import FeedQueries
from wire.errors import error_body, validation_message

log = logging.getLogger(__name__)

BatchState = Literal["queued", "running", "done", "failed", "stopped"]


MAX_BATCH_SESSIONS = 100_000
"""Sessions one batch may plan (its rows are held in memory while it runs); a larger one is a 400."""


class BatchRequest(BaseModel):
    """A batch to run: ``envs`` (names under the service's agent root), optionally ``cases`` (env
    name -> case ids; default every case, or the first ``limit``), ``samples`` per case (the
    group size), the route ``model`` (default: the service's), the ``policy_version`` to set on
    the gateway before the batch starts (None: leave it), ``temperature``, ``max_steps`` and a
    ``job_id`` (default: generated)."""

    model_config = ConfigDict(extra="forbid")

    envs: list[str] = Field(min_length=1)
    cases: dict[str, list[str]] | None = None
    limit: int | None = Field(default=None, ge=1)
    samples: int = Field(default=1, ge=1, le=MAX_GROUP_SIZE)
    model: str | None = None
    policy_version: int | None = Field(default=None, ge=0, le=MAX_INT)
    temperature: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    max_steps: int | None = Field(default=None, ge=-1, le=MAX_INT)
    job_id: str | None = Field(default=None, pattern=JOB_ID_PATTERN)


class BatchInfo(BaseModel):
    """Where a batch is: ``state`` (queued | running | done | failed | stopped: the circuit
    breaker gave up, finish it with ``launcher.py --resume``), its sessions and groups, and
    ``error`` when it failed or stopped. ``feed``: the path of its groups. ``policy_version``: the
    one asked for; without one, once the batch runs, the gateway's version it was left at (None:
    none set, or a gateway without versions)."""

    job_id: str
    state: BatchState
    model: str
    policy_version: int | None
    sessions: int
    groups: int
    error: str | None = None
    submitted_at: str
    started_at: str | None = None
    finished_at: str | None = None
    feed: str


class BatchError(RolloutError, ValueError):
    """The batch cannot be accepted; ``status`` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class _Batch:
    info: BatchInfo
    request: BatchRequest
    opts: JobOptions
    rows: list[JobEnvironment]
    envs: list[tuple[EnvConfig, list[Case]]]
    done: asyncio.Event = field(default_factory=asyncio.Event)


def _now() -> str:
    return datetime.now(UTC).isoformat()


class BatchService:
    """Plans, queues and runs batches on one store and one gateway (``gateway_url``: its session
    base URL; ``api_key``: the key the launcher's calls and runtimes send, None with auth off;
    ``admin_key``: the key of the gateway's admin endpoints, sent by this service only).
    ``base`` holds the job-wide options (agent root, pool size, evaluation, sandbox, retries);
    ``model`` the default route; ``managed``: the route whose model server this service started
    (other managed routes have none running)."""

    def __init__(
        self,
        store: Store,
        base: JobOptions,
        gateway_url: str,
        api_key: str | None,
        model: str,
        gw: GatewaySettings | None = None,
        admin_key: str | None = None,
    ) -> None:
        self.store = store
        self.base = base
        self.gateway_url = gateway_url
        self.api_key = api_key
        self.admin_key = admin_key
        self.model = model
        self.gw = gw
        self.batches: dict[str, _Batch] = {}
        self._queue: asyncio.Queue[_Batch] = asyncio.Queue()
        self._plan_lock = asyncio.Lock()

    async def submit(self, req: BatchRequest) -> BatchInfo:
        """Plan ``req`` as a new job (its rows inserted) and queue it. Raises BatchError for unknown
        envs, cases or routes, a job id in use, a gateway that is not ready or has no policy
        versions when one is asked for."""
        model = req.model or self.model
        if self.gw is not None and model != self.model:
            route = self.gw.llm_routes.get(model)
            if route is not None and route.managed is not None:
                raise BatchError(
                    f"route {model!r} is a managed model server that this service did not start "
                    f"(it started {self.model!r})"
                )
        try:
            await check_gateway(self.gateway_url, self.store.identity(), model, self.api_key)
        except ServiceError as e:
            raise BatchError(str(e), 400 if "no route" in str(e) else 503) from e
        if req.policy_version is not None:
            await self._policy_version("GET")
        job_id = req.job_id or f"batch-{datetime.now(UTC):%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"
        try:
            opts = JobOptions.model_validate(
                {
                    **self.base.model_dump(),
                    "env_names": req.envs,
                    "limit": req.limit,
                    "rl_group_size": req.samples,
                    "llm_model": [model],
                    "llm_temperature": req.temperature,
                    "max_steps": req.max_steps,
                    "job_id": job_id,
                    "resume": False,
                }
            )
        except ValidationError as e:
            raise BatchError(str(e)) from e
        async with self._plan_lock:
            if job_id in self.batches:
                raise BatchError(f"job {job_id!r} already exists: choose another job_id", 409)
            try:
                envs = _select_cases(select_envs(opts)[0], req.cases)
                planned = sum(len(cases) * req.samples for _, cases in envs)
                if planned > MAX_BATCH_SESSIONS:
                    raise BatchError(
                        f"the batch would plan {planned} sessions; at most {MAX_BATCH_SESSIONS} per "
                        "batch (submit several batches)"
                    )
                rows = await plan_sessions(
                    self.store,
                    job_id,
                    [model],
                    envs,
                    resume=opts.resume,
                    group_size=opts.rl_group_size,
                    max_steps=opts.max_steps,
                )
            except SetupError as e:
                raise BatchError(str(e), 409 if "already exists" in str(e) else 400) from e
            info = BatchInfo(
                job_id=job_id,
                state="queued",
                model=model,
                policy_version=req.policy_version,
                sessions=len(rows),
                groups=len({r.group_id for r in rows}),
                submitted_at=_now(),
                feed=f"/v1/jobs/{job_id}/groups",
            )
            batch = _Batch(info, req, opts, rows, envs)
            self.batches[job_id] = batch
        self._queue.put_nowait(batch)
        return info

    async def run_forever(self) -> None:
        """Run queued batches one after another until cancelled (a batch in flight is then
        cancelled as a launcher job on Ctrl-C is: its unfinished sessions left for ``--resume``)."""
        while True:
            batch = await self._queue.get()
            try:
                await self._run(batch)
            finally:
                batch.info.finished_at = _now()
                batch.done.set()

    async def _policy_version(self, method: str, version: int | None = None) -> int | None:
        """GET (or POST ``version``) the gateway's policy version; returns the version it answers."""
        url = gateway_root(self.gateway_url) + "/admin/policy_version"
        try:
            async with httpx.AsyncClient(timeout=30, headers=auth_headers(self.admin_key)) as http:
                r = await (http.get(url) if method == "GET" else http.post(url, json={"version": version}))
        except httpx.TransportError as e:
            raise BatchError(f"the gateway at {url} does not answer: {type(e).__name__}: {e}", 503) from e
        if r.status_code == 404:
            raise BatchError(
                f"the gateway at {gateway_root(self.gateway_url)} has no policy versions "
                "(no /admin/policy_version): submit the batch without policy_version"
            )
        if r.status_code in (401, 403):
            raise BatchError(
                f"the gateway at {gateway_root(self.gateway_url)} refused this service's admin key "
                f"(HTTP {r.status_code}): its /admin endpoints take an admin key (auth.admin_api_keys "
                f"of a gateway serve starts, else ${GATEWAY_ADMIN_KEY_ENV}): {r.text[:300]}",
                502,
            )
        if r.status_code != 200:
            raise BatchError(f"{method} {url}: HTTP {r.status_code}: {r.text[:300]}", 502)
        answered = r.json().get("policy_version")
        return answered if isinstance(answered, int) else None

    async def _run(self, batch: _Batch) -> None:
        info, req = batch.info, batch.request
        info.state, info.started_at = "running", _now()
        if req.policy_version is not None:
            try:
                await self._policy_version("POST", req.policy_version)
            except BatchError as e:
                info.state, info.error = "failed", f"the policy version could not be set: {e}"
                return
        else:  # left as it is: say which version that is (the one its steps are stamped with)
            try:
                info.policy_version = await self._policy_version("GET")
            except BatchError as e:
                log.info("batch %s: the gateway's policy version is unknown: %s", info.job_id, e)
        ctx = JobContext(
            job_id=info.job_id,
            gateway_url=self.gateway_url,
            models=(info.model,),
            gateway_api_key=self.api_key,
        )
        try:
            async with JobLease(self.store, info.job_id):  # a launcher's --resume of it is refused meanwhile
                ran = await run_sessions(
                    self.store, batch.opts, ctx, {cfg.name: cfg for cfg, _ in batch.envs}, batch.rows
                )
            info.state, info.error = ("stopped", ran.stopped) if ran.stopped else ("done", None)
        except (JobLockError, SetupError) as e:
            info.state, info.error = "failed", str(e)
        except Exception as e:  # a launcher bug fails this batch, never the service
            log.exception("batch %s failed", info.job_id)
            info.state, info.error = "failed", f"{type(e).__name__}: {e}"


def _select_cases(
    envs: list[tuple[EnvConfig, list[Case]]], cases: dict[str, list[str]] | None
) -> list[tuple[EnvConfig, list[Case]]]:
    """Keep only the named cases of each env named in ``cases`` (others keep all theirs). Raises
    SetupError for an env not in the batch or an unknown case id."""
    if not cases:
        return envs
    names = {cfg.name for cfg, _ in envs}
    if unknown := sorted(set(cases) - names):
        raise SetupError(f"cases: env(s) {unknown} are not in the batch's envs {sorted(names)}")
    out = []
    for cfg, cs in envs:
        wanted = cases.get(cfg.name)
        if wanted is None:
            out.append((cfg, cs))
            continue
        by_id = {c.case_id: c for c in cs}
        if missing := [w for w in wanted if w not in by_id]:
            raise SetupError(f"cases: env {cfg.name} has no case {missing[:5]}")
        out.append((cfg, [by_id[w] for w in dict.fromkeys(wanted)]))
    return out


def create_serve_app(service: BatchService, feed: FeedSettings) -> FastAPI:
    """The feed's app plus the batch routes; state-changing requests take JSON bodies and no
    browser's request (``gateway.csrf.JsonOnlyGuard``)."""
    app = create_feed_app(FeedQueries(service.store.reader), feed, backfill=service.store.backfill_feed)
    app.add_middleware(JsonOnlyGuard)

    @app.post("/v1/batches", status_code=202)
    async def submit(request: Request) -> JSONResponse:
        try:
            req = BatchRequest.model_validate_json(await request.body())
        except ValidationError as e:
            message, param = validation_message(
                e.errors(include_url=False), "invalid /v1/batches body", BatchRequest
            )
            return _err(400, "invalid_batch", message, param)
        try:
            info = await service.submit(req)
        except BatchError as e:
            return _err(e.status, "batch_refused", str(e))
        return JSONResponse(info.model_dump(), status_code=202)

    @app.get("/v1/batches")
    async def batches() -> dict[str, list[dict[str, object]]]:
        return {"batches": [b.info.model_dump() for b in service.batches.values()]}

    @app.get("/v1/batches/{job_id}")
    async def batch(job_id: str) -> JSONResponse:
        b = service.batches.get(job_id)
        if b is None:
            return _err(404, "unknown_batch", f"no batch {job_id!r} was submitted to this service")
        return JSONResponse(b.info.model_dump())

    @app.get("/v1/serve")
    async def about() -> dict[str, object]:
        return {
            "gateway_url": service.gateway_url,
            "model": service.model,
            "pool_size": service.base.pool_size,
            "batches": len(service.batches),
        }

    return app


def _err(status: int, code: str, message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, code=code, param=param), status_code=status)


async def _gateway(
    opts: JobOptions, store: Store, log_dir: Path, children: list[ChildProcess]
) -> tuple[str, str | None, str, GatewaySettings | None]:
    """The gateway the service uses: ``--gateway-base-url`` checked, or one started (with the
    managed model server of the default route). Returns (session base URL, API key, default
    route, the started gateway's settings or None). Raises SetupError."""
    gw = load_gateway_settings(opts.gateway_config)
    models = job_models(opts, gw)
    if len(models) > 1:
        raise SetupError("serve takes one --llm-model (the batches' default route; a batch may name its own)")
    model = models[0]
    if opts.gateway_base_url:
        key = gateway_api_key(None)
        try:
            await check_gateway(opts.gateway_base_url, store.identity(), model, key)
        except ServiceError as e:
            raise SetupError(str(e)) from e
        return opts.gateway_base_url.rstrip("/"), key, model, None
    return await start_services(gw, models, store, log_dir, children), gateway_api_key(gw), model, gw


async def serve(
    opts: JobOptions,
    host: str,
    port: int,
    feed: FeedSettings,
    edge: HttpEdge = DEFAULT_EDGE,
    on_listening: Callable[[str], None] | None = None,
) -> None:
    """Start the gateway (unless ``opts.gateway_base_url``), serve batches and the feed on
    ``host:port`` until SIGINT/SIGTERM, then cancel the batch in flight and stop the children.
    ``on_listening`` gets one line saying where it serves, once it listens. Raises SetupError
    before serving when something cannot start."""
    check_sandbox(opts, [cfg for cfg, _ in load_envs(opts)])
    store = open_store(opts.db_path)
    children: list[ChildProcess] = []
    runner: asyncio.Task[None] | None = None
    try:
        await init_store(store)
        log_dir = Path("runs") / "logs" / f"serve-{datetime.now(UTC):%Y%m%dT%H%M%SZ}"
        url, key, model, gw = await _gateway(opts, store, log_dir, children)
        service = BatchService(store, opts, url, key, model, gw, admin_key=gateway_admin_key(gw))
        sock = listen(host, port, exposes="every trajectory and can start batches")
        if on_listening is not None:
            on_listening(
                f"serve on {url_of(sock)} (gateway {url}, route {model!r}, "
                f"store {store.identity()}); Ctrl-C stops it"
            )
        runner = asyncio.create_task(service.run_forever(), name="batches")
        await run_server(create_serve_app(service, feed), sock, host, edge)
    finally:
        if runner is not None:
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)
        for child in reversed(children):
            child.stop()
        await store.close()
