"""Running a job: ``run_job`` (a launcher job, end to end: prepare, plan or resume its sessions,
start or check the gateway and the managed model server, run the pool, write the JSONL) and
``run_sessions`` (planned rows through the pool with a running gateway: the path ``serve``'s
batches take too). ``launcher.py`` turns flags into ``JobOptions`` and calls ``run_job``."""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway.settings import GatewaySettings
from rollout.contract.harness import HarnessUnavailable
from rollout.core.envs import EnvConfig
from rollout.core.logs import notices, plural
from rollout.core.plan import RowSource, plan_job
from rollout.core.setup import SetupError, init_store, open_store
from rollout.core.trees import remove_tree
from rollout.grading.grader import GraderSetupError
from rollout.jobs.attempt import Executor
from rollout.jobs.breaker import BreakerEvent
from rollout.jobs.lease import JobLease, JobLockError
from rollout.jobs.options import JobContext, JobOptions
from rollout.jobs.pool import JobStopped, Pool
from rollout.jobs.prepare import check_routes, install_harnesses, prepare
from rollout.jobs.processes import (
    ChildProcess,
    ServiceError,
    check_gateway,
    gateway_api_key,
    gateway_root,
    start_gateway,
    start_llama_server,
)
from rollout.jobs.ray_backend import RayBackend, RayBackendError
from rollout.jobs.ray_backend import connect as ray_connect
from rollout.results.records import iter_job_records
from rollout.results.report import JsonlWriter, ReportTotals, SessionRecord, read_jsonl
from rollout.sandbox.harness_cache import LoadedHarness, load_harness
from store import JobEnvironment, Store

log = logging.getLogger(__name__)


class JobResult(BaseModel):
    """What a finished job produced: its id, the JSONL path (one record per finished session),
    the report's counts of those records (``totals``: the summary table, footer, infra counts),
    the store identity and where workspaces were kept (None unless ``keep_workspaces``), the
    circuit breaker's changes, and why the job stopped early (None when every session ran)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    job_id: str
    totals: ReportTotals
    out: Path
    store: str
    workspaces: Path | None = None
    breaker_events: list[BreakerEvent] = Field(default_factory=list)
    stopped: str | None = None
    stop_kind: Literal["breaker", "broken_graders"] | None = None  # why it stopped, when it did

    @property
    def records(self) -> list[SessionRecord]:
        """Every finished session's record, read back from the JSONL (the job keeps none in memory)."""
        return read_jsonl(self.out)


def connect_ray(opts: JobOptions, envs: list[EnvConfig]) -> RayBackend:
    """Connect to the Ray cluster of ``--ray-address`` (else ``$RAY_ADDRESS``) and check that some
    node can hold each env's ``runtime.resources``: before any row is written. SetupError otherwise."""
    address = opts.ray_address or os.environ.get("RAY_ADDRESS")
    if not address:
        raise SetupError("--mode ray needs --ray-address HOST:PORT (the Ray head; or auto, or $RAY_ADDRESS)")
    try:
        backend = ray_connect(address)
    except RayBackendError as e:
        raise SetupError(str(e)) from e
    try:
        backend.check_resources(envs)
    except RayBackendError as e:
        backend.close()
        raise SetupError(str(e)) from e
    return backend


async def check_ray_nodes(
    backend: RayBackend, opts: JobOptions, envs: list[EnvConfig], session_url: str
) -> None:
    """From a task on every node: ``session_url``'s gateway answers there and the sandbox runs
    there. SetupError otherwise."""
    try:
        await backend.check_nodes(gateway_root(session_url), envs, opts.sandbox)
    except RayBackendError as e:
        raise SetupError(str(e)) from e
    address = opts.ray_address or os.environ.get("RAY_ADDRESS")
    notices.info(
        f"ray: {len(backend.alive_nodes())} node(s) at {address}; runtimes reach the gateway at {session_url}"
    )


def model_free(loaded: dict[str, LoadedHarness]) -> str | None:
    """Why no session of a job running ``loaded`` (every session runs one of them) calls a model:
    each says it calls none (``Harness.calls_model``); None when one may (or none is given)."""
    if not loaded or any(h.harness.calls_model for h in loaded.values()):
        return None
    return f"harness {', '.join(sorted(loaded))} calls no model"


async def start_services(
    gw: GatewaySettings,
    models: list[str],
    store: Store,
    log_dir: Path,
    children: list[ChildProcess],
    listen: str | None = None,
    no_model: str | None = None,
) -> str:
    """Start the model server of each managed route among ``models`` (once each; none when
    ``no_model`` says why no session calls a model), then the gateway (listening for ``listen``,
    the advertised URL, when set); returns its session URL."""
    check_routes(gw, models)
    routes = dict(gw.llm_routes)
    try:
        for model in dict.fromkeys(models):
            route = gw.llm_routes[model]
            if route.managed is not None and no_model is not None:
                notices.info(f"route {model!r}: its model server is not started ({no_model})")
            elif route.managed is not None:
                llama = await start_llama_server(route.managed, log_dir)
                children.append(llama)
                routes[model] = route.model_copy(update={"base_url": llama.url})
        settings = gw.model_copy(
            update={
                "llm_routes": routes,
                "storage_type": store.kind,
                "storage_config": gw.storage_config.model_copy(update={"db_url": store.peer_url()}),
            }
        )
        children.append(await start_gateway(settings, log_dir, advertise_url=listen))
    except ServiceError as e:
        raise SetupError(str(e)) from e
    return children[-1].url


async def write_records(store: Store, job_id: str, out: Path) -> ReportTotals:
    """Write the JSONL of every finished session of the job (rebuilt from the store, so a resumed
    job reports all its sessions), streamed, and return the report's counts of those records."""
    totals = ReportTotals()
    case: tuple[str, str] | None = None
    with JsonlWriter(out) as jsonl:
        async for record in iter_job_records(store, job_id):
            if (record.env_name, record.case_id) != case:  # records come in env, case order
                totals.fold_cases()
                case = (record.env_name, record.case_id)
            jsonl.write(record)
            totals.add(record)
    return totals


async def hold_job(store: Store, job_id: str) -> JobLease:
    """The job's lease in the store, held (``rollout.jobs.lease``); SetupError naming the launcher
    that runs it when another one does."""
    lease = JobLease(store, job_id)
    try:
        await lease.take()
    except JobLockError as e:
        raise SetupError(str(e)) from None
    return lease


async def _check_running_gateway(url: str, store: Store, models: list[str], api_key: str | None) -> None:
    """``--gateway-base-url``: the gateway answers, writes to this store and serves each route;
    SetupError otherwise."""
    try:
        for model in models:
            await check_gateway(url, store.identity(), model, api_key)
    except ServiceError as e:
        raise SetupError(str(e)) from e


@dataclass
class SessionsRun:
    """What :func:`run_sessions` did: the breaker's changes, why the job stopped early (None when
    every session ran) and how, and where workspaces were kept (None unless ``keep_workspaces``)."""

    breaker_events: list[BreakerEvent] = field(default_factory=list)
    stopped: str | None = None
    stop_kind: Literal["breaker", "broken_graders"] | None = None
    workspaces: Path | None = None


async def run_sessions(
    store: Store,
    opts: JobOptions,
    ctx: JobContext,
    envs: Mapping[str, EnvConfig],
    rows: Sequence[JobEnvironment] | RowSource,
    *,
    on_done: Callable[[SessionRecord], None] | None = None,
    on_breaker: Callable[[BreakerEvent], None] | None = None,
    executor: Executor | None = None,
) -> SessionsRun:
    """Run planned ``rows`` through the pool with a running gateway (``ctx``), the sessions'
    workspaces in a fresh folder (removed after, however deep, unless ``keep_workspaces``). The
    pool stopping early is returned, not raised; a grader that cannot start is a SetupError."""
    workspaces = Path(tempfile.mkdtemp(prefix=f"rollout-{ctx.job_id}-"))
    pool = Pool(
        store,
        opts,
        replace(ctx, workspace_root=workspaces),
        envs,
        on_done=on_done,
        on_breaker=on_breaker,
        executor=executor,
        keep_records=False,
    )
    done = SessionsRun(
        breaker_events=pool.breaker_events, workspaces=workspaces if opts.keep_workspaces else None
    )
    try:
        await pool.run(rows)
    except GraderSetupError as e:
        raise SetupError(str(e)) from e
    except JobStopped as e:
        done.stopped, done.stop_kind = str(e), e.kind
    finally:
        if not opts.keep_workspaces:
            left = remove_tree(workspaces)
            if left is not None:
                log.warning("the workspaces of %s were not all removed: %s", ctx.job_id, left)
    return done


async def run_job(
    opts: JobOptions,
    on_start: Callable[[str, int], None] | None = None,
    on_done: Callable[[SessionRecord], None] | None = None,
    on_breaker: Callable[[BreakerEvent], None] | None = None,
    on_plan: Callable[[dict[str, int]], None] | None = None,
) -> JobResult:
    """Run a job. ``on_start(job_id, n_sessions)`` is called once sessions are planned and the
    gateway is up, just after ``on_plan(sessions_per_env)``; ``on_done(record)`` after each
    session; ``on_breaker(event)`` at each change of the circuit breaker. Cancellation (Ctrl-C)
    stops the sessions in flight cleanly and every started process. When the job stops early,
    the finished sessions are still reported and ``JobResult.stopped`` says why. The job is held
    in the store while it runs (:func:`hold_job`): a second launcher on it, ``--resume``
    included, is a SetupError naming the one running it."""
    prepared = prepare(opts)
    loaded, models = prepared.harnesses, prepared.models
    store = open_store(opts.db_path, existing=bool(opts.resume))
    children: list[ChildProcess] = []
    ray_backend: RayBackend | None = None
    lease: JobLease | None = None
    try:
        await init_store(store)
        job_id = opts.job_id or f"job-{datetime.now(UTC):%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"
        lease = await hold_job(store, job_id)  # one launcher per job: refused while another runs it
        if opts.mode == "ray":  # a cluster that cannot be reached: no row written
            ray_backend = connect_ray(opts, [cfg for cfg, _ in prepared.envs])
        installed = {} if opts.resume else await install_harnesses(loaded)  # before any row is written
        if opts.gateway_base_url and not opts.resume:  # a gateway that cannot serve the job: no row written
            await _check_running_gateway(opts.gateway_base_url, store, models, gateway_api_key(None))
        plan = await plan_job(
            store,
            job_id,
            models,
            prepared.envs,
            [*loaded] or [None],
            resume=opts.resume,
            group_size=opts.rl_group_size,
            max_steps=opts.max_steps,
            rerun_launcher_errors=opts.rerun_launcher_errors,
            graded=opts.enable_evaluation,
        )
        configs = {cfg.name: cfg for cfg, _ in prepared.envs}
        prepared.envs = []  # the cases: each session's row keeps its own, the dataset is not held while the job runs
        out = opts.out or Path("runs") / f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{job_id}.jsonl"
        if opts.resume and not plan.ids:  # a finished job: no gateway, no session, its records again
            notices.info(
                f"job {job_id}: every session is finished, nothing to run; its records again in {out}"
            )
            totals = await write_records(store, job_id, out)
            return JobResult(job_id=job_id, totals=totals, out=out, store=store.identity())
        if opts.resume and plan.ids:
            models = plan.models
            loaded = _resumed_harnesses(job_id, loaded, plan.harnesses)
            installed = await install_harnesses(loaded)
        log_dir = Path("runs") / "logs" / job_id
        no_model = model_free(loaded)
        gateway_url, api_key = await _gateway_for(
            opts, prepared.gateway, models, store, log_dir, children, no_model
        )
        advertise_url = opts.gateway_advertise_url.rstrip("/") if opts.gateway_advertise_url else None
        if ray_backend is not None:
            await check_ray_nodes(ray_backend, opts, list(configs.values()), advertise_url or gateway_url)
        if on_plan:
            on_plan(dict(plan.per_env))
        on = f"route {models[0]!r}" if len(models) == 1 else f"routes {', '.join(map(repr, models))}"
        if installed:
            on += f" with harness {', '.join(installed)}"
        notices.info(
            f"job {job_id}: {plural(len(plan.ids), 'session')} on {on} via {gateway_url} "
            f"(pool {opts.pool_size}, db {store.identity()})"
        )
        if on_start:  # after the job's line: a progress display starts below it
            on_start(job_id, len(plan.ids))
        ctx = JobContext(
            job_id=job_id,
            gateway_url=gateway_url,
            models=tuple(models),
            gateway_api_key=api_key,
            advertise_url=advertise_url,
            harnesses=installed,
            log_dir=log_dir,
        )
        ran = await run_sessions(
            store,
            opts,
            ctx,
            configs,
            RowSource.from_store(store, plan.ids),
            on_done=on_done,
            on_breaker=on_breaker,
            executor=ray_backend.executor() if ray_backend else None,
        )
        totals = await write_records(store, job_id, out)
        await store.checkpoint()
        return JobResult(
            job_id=job_id,
            totals=totals,
            out=out,
            store=store.identity(),
            workspaces=ran.workspaces,
            breaker_events=ran.breaker_events,
            stopped=ran.stopped,
            stop_kind=ran.stop_kind,
        )
    except asyncio.CancelledError as e:
        lost = lease.lost_error(e) if lease is not None else None
        if lost is not None:  # another launcher took the job over: this one stopped its sessions
            raise SetupError(str(lost)) from None
        raise
    finally:
        if ray_backend is not None:
            ray_backend.close()
        for child in reversed(children):
            child.stop()
        if lease is not None:
            await lease.release()
        await store.close()


def _resumed_harnesses(
    job_id: str, loaded: dict[str, LoadedHarness], ran: Sequence[str]
) -> dict[str, LoadedHarness]:
    """The harnesses a resumed job's sessions ran: those given again, the others loaded by name
    (bundled ones). SetupError for one that cannot be."""
    found = dict(loaded)
    for name in sorted(set(ran) - set(found)):
        try:
            found[name] = load_harness(name)
        except HarnessUnavailable as e:
            raise SetupError(
                f"--resume: sessions of {job_id} ran the harness {name!r}, which cannot be "
                f"loaded by name ({e}); give its folder again with --harness PATH"
            ) from e
    return {n: h for n, h in found.items() if n in ran}


async def _gateway_for(
    opts: JobOptions,
    gw: GatewaySettings,
    models: list[str],
    store: Store,
    log_dir: Path,
    children: list[ChildProcess],
    no_model: str | None = None,
) -> tuple[str, str | None]:
    """The job's gateway: ``--gateway-base-url`` (checked again on resume, for the routes the
    job's sessions ran on) or one started with its managed model servers. Returns its session
    base URL and the API key the launcher's calls and runtimes send (None: auth off)."""
    if opts.gateway_base_url:
        api_key = gateway_api_key(None)  # $GATEWAY_API_KEY, for a gateway with auth on
        if opts.resume:
            await _check_running_gateway(opts.gateway_base_url, store, models, api_key)
        return opts.gateway_base_url.rstrip("/"), api_key
    url = await start_services(
        gw, models, store, log_dir, children, listen=opts.gateway_advertise_url, no_model=no_model
    )
    return url, gateway_api_key(gw)  # the started gateway's own first key, if any
