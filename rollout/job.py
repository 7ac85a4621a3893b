"""One launcher job, end to end: load envs, plan (or resume) sessions, start or check the gateway
(and the managed model server), run the scheduler, rebuild the records, write the JSONL.

``launcher.py`` turns flags into ``JobOptions`` and calls ``run_job``; every problem that stops a
job before it runs is a ``SetupError`` whose message tells the user what to fix.
"""

from __future__ import annotations

import logging
import shutil
import sys
import tempfile
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gateway.settings import ConfigError, GatewaySettings, load_settings
from rollout.envs import Case, EnvConfig, EnvConfigError, discover_envs, load_cases, load_env_config
from rollout.evaluator_loader import discover_evaluator
from rollout.outcomes import (
    DEFAULT_RETRY_ON,
    INFRA_CLASSES,
    BreakerEvent,
    BreakerSettings,
    RetryPolicy,
    check_classes,
)
from rollout.records import job_records
from rollout.report import SessionRecord, write_jsonl
from rollout.runner import effective_mode, sandbox_support
from rollout.sandbox import SandboxUnavailable
from rollout.scheduler import JobStopped, RunSettings, Scheduler, session_rows
from rollout.services import (
    ChildProcess,
    ServiceError,
    check_gateway,
    gateway_api_key,
    start_gateway,
    start_llama_server,
)
from store import DbUrlError, JobEnvironment, Store

log = logging.getLogger(__name__)


class SetupError(RuntimeError):
    """The job cannot start; the message tells the user what to fix."""


class JobOptions(BaseModel):
    """Everything a job needs (the launcher's flags, validated). Seconds for timeouts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    agent_root: Path = Path("env")
    agent_configs: list[Path] = Field(default_factory=list)
    env_names: list[str] = Field(default_factory=list)
    gateway_base_url: str | None = None
    gateway_config: Path
    llm_model: str | None = None
    llm_temperature: float | None = Field(default=None, ge=0)
    enable_evaluation: bool = False
    eval_timeout: float = Field(default=60.0, gt=0)
    db_path: str = "sqlite://env_trajs.db"
    pool_size: int = Field(default=4, ge=1)
    rl_group_size: int | None = Field(default=None, ge=1)  # None: each env's group_size
    max_steps: int | None = Field(default=None, ge=-1)
    limit: int | None = Field(default=None, ge=1)
    job_id: str | None = None
    resume: bool = False
    mode: Literal["local"] = "local"
    sandbox: Literal["bwrap", "none"] = "bwrap"
    out: Path | None = None
    keep_workspaces: bool = False
    max_retries: int = Field(default=2, ge=0)
    retry_backoff_s: float = Field(default=1.0, ge=0)
    retry_on: list[str] = Field(default_factory=lambda: sorted(DEFAULT_RETRY_ON))
    no_retry_on: list[str] = Field(default_factory=list)
    breaker: BreakerSettings = Field(default_factory=BreakerSettings)

    @field_validator("retry_on", "no_retry_on")
    @classmethod
    def _classes(cls, v: list[str]) -> list[str]:
        check_classes(v, "failure classes")
        return v

    def retry_policy(self) -> RetryPolicy:
        """The retry policy these options describe."""
        return RetryPolicy(max_retries=self.max_retries, backoff_s=self.retry_backoff_s,
                           retry_on=frozenset(self.retry_on), no_retry_on=frozenset(self.no_retry_on))


class JobResult(BaseModel):
    """What a finished job produced: its id, every finished session's record, the JSONL path,
    the store identity and where workspaces were kept (None unless ``keep_workspaces``), the
    circuit breaker's changes, and why the job stopped early (None when every session ran)."""

    job_id: str
    records: list[SessionRecord]
    out: Path
    store: str
    workspaces: Path | None = None
    breaker_events: list[BreakerEvent] = Field(default_factory=list)
    stopped: str | None = None


def load_envs(opts: JobOptions) -> list[tuple[EnvConfig, list[Case]]]:
    """The env configs and their cases, filtered by ``env_names`` and ``limit``. Raises SetupError
    for bad configs, unknown env names, two envs with the same name and a runtime command naming
    a file of the env folder that does not exist."""
    try:
        configs = ([load_env_config(p) for p in opts.agent_configs] if opts.agent_configs
                   else discover_envs(opts.agent_root))
        seen: dict[str, Path] = {}
        for c in configs:
            if c.name in seen:
                raise SetupError(f"two envs are named {c.name!r}: {seen[c.name]} and {c.config_path}")
            seen[c.name] = c.config_path
        if opts.env_names:
            missing = set(opts.env_names) - set(seen)
            if missing:
                raise SetupError(f"--env: no such env {sorted(missing)} (have {sorted(seen)})")
            configs = [c for c in configs if c.name in opts.env_names]
        for c in configs:
            if absent := c.missing_runtime_files():
                raise SetupError(f"env {c.name} ({c.config_path}): runtime.command names {absent[0]}, "
                                 "which does not exist")
        return [(c, load_cases(c, opts.limit)) for c in configs]
    except EnvConfigError as e:
        raise SetupError(str(e)) from e


def check_sandbox(opts: JobOptions, envs: list[EnvConfig]) -> None:
    """Before anything runs: when an env runs sandboxed, check that bubblewrap works here (else
    SetupError saying how to install it or opt out) and print how each limit is enforced; warn
    about envs that run without a sandbox."""
    bare = sorted(cfg.name for cfg in envs if effective_mode(cfg, opts.sandbox) == "none")
    if bare:
        print(f"warning: no sandbox for env(s) {', '.join(bare)}: their runtimes see the host's files, "
              "environment and network", file=sys.stderr)
    if len(bare) == len(envs):
        return
    try:
        support = sandbox_support()
    except SandboxUnavailable as e:
        raise SetupError(str(e)) from e
    how = "; ".join(f"{k}: {v}" for k, v in support.mechanisms().items())
    print(f"sandbox: bubblewrap ({support.bwrap}); limits enforced by {how}", file=sys.stderr)
    if support.pids is None:
        print("warning: the per-session process limit is not enforced on this machine (no usable cgroup "
              "pids controller)", file=sys.stderr)


def load_gateway_settings(path: Path) -> GatewaySettings:
    """The gateway config file, as SetupError on problems."""
    try:
        return load_settings(path)
    except ConfigError as e:
        raise SetupError(str(e)) from e


def open_store(url: str) -> Store:
    """A Store for ``url``; SetupError for bad URLs or a missing database driver."""
    try:
        return Store(url)
    except DbUrlError as e:
        raise SetupError(str(e)) from e
    except ModuleNotFoundError as e:
        raise SetupError(f"--db-path {url}: the database driver is not installed ({e.name}); "
                         "pip install asyncpg for PostgreSQL") from e


async def plan_sessions(store: Store, opts: JobOptions, job_id: str, model: str,
                        envs: list[tuple[EnvConfig, list[Case]]]) -> list[JobEnvironment]:
    """The session rows to run: a new job's rows (inserted), or with ``resume`` the rows of an
    existing job that are unfinished or ended in an infrastructure failure (reopened; the
    scheduler archives their last attempt's steps before the next attempt, whose number goes on
    from the attempts already used). Raises SetupError for a resume of an unknown job, or a new
    job whose id is taken."""
    existing = await store.job_sessions(job_id)
    cases = {(c.env_name, c.case_id) for _, cs in envs for c in cs}
    if opts.resume:
        if not existing:
            raise SetupError(f"--resume: no job {job_id!r} in {store.identity()}")
        rows = [r for r in existing if not r.finished or r.outcome in INFRA_CLASSES]
        unknown = {(r.env_name, r.case_id) for r in rows} - cases
        if unknown:
            raise SetupError(f"--resume: sessions of {job_id} refer to envs/cases not loaded now: "
                             f"{sorted(unknown)[:5]}")
        for r in rows:
            if r.finished:  # an infrastructure failure: run it again, never graded
                await store.update_job_session(r.session_id, finished=False, finished_at=None, reward=None,
                                               eval_status=None, eval_reason=None, eval_detail=None)
                r.finished = False
        return rows
    if existing:
        raise SetupError(f"job {job_id!r} already exists in {store.identity()}: "
                         "add --resume to finish it, or choose another --job-id")
    rows = session_rows(job_id, model, envs, opts.rl_group_size, opts.max_steps)
    await store.add_job_sessions(rows)
    return rows


async def _start_services(gw: GatewaySettings, model: str, store: Store, log_dir: Path,
                          children: list[ChildProcess]) -> str:
    route = gw.llm_routes.get(model)
    if route is None:
        raise SetupError(f"--llm-model {model!r} is not a route of the gateway config ({sorted(gw.llm_routes)})")
    routes = dict(gw.llm_routes)
    try:
        if route.managed is not None:
            llama = await start_llama_server(route.managed, log_dir)
            children.append(llama)
            routes[model] = route.model_copy(update={"base_url": llama.url})
        settings = gw.model_copy(update={
            "llm_routes": routes, "storage_type": store.kind,
            "storage_config": gw.storage_config.model_copy(update={"db_url": store.identity()}),
        })
        children.append(await start_gateway(settings, log_dir))
    except ServiceError as e:
        raise SetupError(str(e)) from e
    return children[-1].url


async def run_job(opts: JobOptions, on_start: Callable[[str, int], None] | None = None,
                  on_done: Callable[[SessionRecord], None] | None = None,
                  on_breaker: Callable[[BreakerEvent], None] | None = None,
                  on_plan: Callable[[dict[str, int]], None] | None = None) -> JobResult:
    """Run a job. ``on_start(job_id, n_sessions)`` is called once sessions are planned and the
    gateway is up, just after ``on_plan(sessions_per_env)``; ``on_done(record)`` after each session; ``on_breaker(event)`` at each change
    of the circuit breaker. Cancellation (Ctrl-C) stops the sessions in flight cleanly (see
    ``rollout.scheduler``) and every started process. When the breaker gives up, the finished
    sessions are still reported and ``JobResult.stopped`` says why."""
    envs = load_envs(opts)
    check_sandbox(opts, [cfg for cfg, _ in envs])
    gw_settings = load_gateway_settings(opts.gateway_config)
    model = opts.llm_model or gw_settings.route_for_default()
    if not model:
        raise SetupError("no --llm-model and no route in the gateway config")
    store = open_store(opts.db_path)
    children: list[ChildProcess] = []
    try:
        await store.init()
        job_id = opts.job_id or f"job-{datetime.now(UTC):%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"
        rows = await plan_sessions(store, opts, job_id, model, envs)
        if opts.resume and rows:
            model = rows[0].llm_model
        if opts.enable_evaluation:
            for cfg, _ in envs:
                if discover_evaluator(opts.agent_root, cfg.name) is None and \
                        discover_evaluator(cfg.env_dir.parent, cfg.name) is None:
                    print(f"warning: env {cfg.name!r} has no rule_evaluator.py: its sessions are not graded",
                          file=sys.stderr)
        log_dir = Path("runs") / "logs" / job_id
        if opts.gateway_base_url:
            api_key = gateway_api_key(None)  # $GATEWAY_API_KEY, for a gateway with auth on
            try:
                await check_gateway(opts.gateway_base_url, store.identity(), model, api_key)
            except ServiceError as e:
                raise SetupError(str(e)) from e
            gateway_url = opts.gateway_base_url.rstrip("/")
        else:
            api_key = gateway_api_key(gw_settings)  # the started gateway's own first key, if any
            gateway_url = await _start_services(gw_settings, model, store, log_dir, children)
        if on_plan:
            on_plan(dict(Counter(r.env_name for r in rows)))
        if on_start:
            on_start(job_id, len(rows))
        print(f"job {job_id}: {len(rows)} sessions on route {model!r} via {gateway_url} "
              f"(pool {opts.pool_size}, db {store.identity()})", file=sys.stderr)
        workspaces = Path(tempfile.mkdtemp(prefix=f"rollout-{job_id}-"))
        settings = RunSettings(job_id=job_id, model=model, gateway_url=gateway_url, agent_root=opts.agent_root,
                               pool_size=opts.pool_size, temperature=opts.llm_temperature,
                               max_steps=opts.max_steps, enable_evaluation=opts.enable_evaluation,
                               eval_timeout_s=opts.eval_timeout, keep_workspaces=opts.keep_workspaces,
                               workspace_root=workspaces, gateway_api_key=api_key, sandbox=opts.sandbox,
                               retry=opts.retry_policy(), breaker=opts.breaker)
        by_name = {cfg.name: cfg for cfg, _ in envs}
        cases = {(c.env_name, c.case_id): c for _, cs in envs for c in cs}
        scheduler = Scheduler(store, settings, by_name, cases, on_done=on_done, on_breaker=on_breaker)
        stopped: str | None = None
        try:
            await scheduler.run(rows)
        except JobStopped as e:
            stopped = str(e)
        finally:
            if not opts.keep_workspaces:
                shutil.rmtree(workspaces, ignore_errors=True)
        records = await job_records(store, job_id)
        out = opts.out or Path("runs") / f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{job_id}.jsonl"
        write_jsonl(out, records)
        await store.checkpoint()
        return JobResult(job_id=job_id, records=records, out=out, store=store.identity(),
                         workspaces=workspaces if opts.keep_workspaces else None,
                         breaker_events=scheduler.breaker_events, stopped=stopped)
    finally:
        for child in reversed(children):
            child.stop()
        await store.close()
