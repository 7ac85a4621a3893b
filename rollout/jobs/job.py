"""One launcher job, end to end: load envs, plan (or resume) sessions, start or check the gateway
(and the managed model server), run the scheduler, rebuild the records, write the JSONL.

``launcher.py`` turns flags into ``JobOptions`` and calls ``run_job``; every problem that stops a
job before it runs is a ``SetupError`` whose message tells the user what to fix.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gateway.settings import GatewaySettings
from rollout.contract.harness import HarnessUnavailable
from rollout.core.envs import (
    HOST_TOOLCHAIN_ALONE,
    MAX_GROUP_SIZE,
    Case,
    EnvConfig,
    EnvConfigError,
    discover_envs,
    load_cases,
    scan_envs,
    task_folder_env,
)
from rollout.core.logs import notices
from rollout.core.outcomes import (
    DEFAULT_RETRY_ON,
    BreakerEvent,
    BreakerSettings,
    RetryPolicy,
    check_classes,
)
from rollout.core.plan import RowSource, plan_job, select_cases
from rollout.core.safactory import load_agent_configs
from rollout.core.setup import SetupError, init_store, load_gateway_settings, open_store
from rollout.core.trees import remove_tree
from rollout.grading.evaluator_loader import EVALUATOR_FILE_NAME, env_evaluator
from rollout.grading.grader import GraderSetupError, grader_mode
from rollout.jobs.lease import JobLease, JobLockError
from rollout.jobs.ray_backend import RayBackend, RayBackendError
from rollout.jobs.ray_backend import connect as ray_connect
from rollout.jobs.scheduler import JobStopped, RunSettings, Scheduler
from rollout.jobs.services import (
    ChildProcess,
    ServiceError,
    check_gateway,
    gateway_api_key,
    gateway_root,
    start_gateway,
    start_llama_server,
)
from rollout.results.records import iter_job_records
from rollout.results.report import JsonlWriter, ReportTotals, SessionRecord, read_jsonl
from rollout.sandbox.bwrap import SandboxUnavailable
from rollout.sandbox.harness_cache import (
    InstalledHarness,
    LoadedHarness,
    cache_dir,
    is_installed,
    load_harness,
)
from rollout.sandbox.harness_cache import install as install_harness
from rollout.sandbox.runner import effective_mode, sandbox_support
from store import JOB_ID_PATTERN, MAX_INT, Store

log = logging.getLogger(__name__)


class JobOptions(BaseModel):
    """Everything a job needs (the launcher's flags, validated). Seconds for timeouts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    agent_root: Path = Path("env")
    agent_configs: list[Path] = Field(default_factory=list)
    agent_start_config: Path | None = None  # a Safactory start YAML: how its task YAML's envs start
    env_names: list[str] = Field(default_factory=list)
    case_ids: list[str] = Field(default_factory=list)  # only these case ids (of any env); empty: all
    tasks: list[Path] = Field(default_factory=list)  # folders of task folders, each run as one env
    host_toolchain: bool = False  # the tasks folders' Harbor tasks run on the host's tools
    timeout: float | None = Field(default=None, gt=0, allow_inf_nan=False)  # per session; None: the env's
    gateway_base_url: str | None = None
    gateway_config: Path
    llm_model: list[str] = Field(default_factory=list)
    harness: list[str] = Field(default_factory=list)
    llm_temperature: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    enable_evaluation: bool = False
    eval_timeout: float = Field(default=60.0, gt=0, allow_inf_nan=False)
    db_path: str = "sqlite://env_trajs.db"
    pool_size: int = Field(default=4, ge=1)
    rl_group_size: int | None = Field(default=None, ge=1, le=MAX_GROUP_SIZE)  # None: each env's group_size
    max_steps: int | None = Field(default=None, ge=-1, le=MAX_INT)
    limit: int | None = Field(default=None, ge=1)
    job_id: str | None = Field(default=None, pattern=JOB_ID_PATTERN)  # it names folders and files
    resume: bool = False
    rerun_launcher_errors: bool = False
    mode: Literal["local", "ray"] = "local"
    ray_address: str | None = None
    gateway_advertise_url: str | None = None
    sandbox: Literal["bwrap", "none"] = "bwrap"
    grader_isolation: Literal["bwrap", "none"] | None = None  # None: as ``sandbox``
    out: Path | None = None
    keep_workspaces: bool = False
    max_retries: int = Field(default=2, ge=0)
    retry_backoff_s: float = Field(default=1.0, ge=0, allow_inf_nan=False)
    retry_on: list[str] = Field(default_factory=lambda: sorted(DEFAULT_RETRY_ON))
    no_retry_on: list[str] = Field(default_factory=list)
    breaker: BreakerSettings = Field(default_factory=BreakerSettings)
    max_broken_graders: int = Field(default=1, ge=0)  # stop at this many broken-grader findings; 0: never
    image: list[str] = Field(default_factory=list)  # the image map: REF=LOCAL (docs/images.md)

    @field_validator("image")
    @classmethod
    def _image_map(cls, v: list[str]) -> list[str]:
        for item in v:
            ref, sep, local = item.partition("=")
            if not sep or not ref.strip() or not local.strip():
                raise ValueError(f"--image {item!r}: expected REF=LOCAL (e.g. python:3=localhost/my/python:3)")
        return v

    def image_map(self) -> tuple[tuple[str, str], ...]:
        """``--image`` as (reference, local reference) pairs."""
        return tuple((r.strip(), loc.strip()) for r, _, loc in (i.partition("=") for i in self.image))

    @field_validator("llm_model", "harness", mode="before")
    @classmethod
    def _listed(cls, v: object) -> object:
        """One route (or harness) as a list of one: a start config may say ``llm_model: qwen``."""
        return [] if v is None else [v] if isinstance(v, str) else v

    @field_validator("retry_on", "no_retry_on")
    @classmethod
    def _classes(cls, v: list[str]) -> list[str]:
        check_classes(v, "failure classes")
        return v

    @model_validator(mode="after")
    def _ray_flags(self) -> JobOptions:
        if self.rerun_launcher_errors and not self.resume:
            raise ValueError("--rerun-launcher-errors is only used with --resume")
        if self.mode != "ray" and self.ray_address is not None:
            raise ValueError("--ray-address is only used with --mode ray")
        if self.gateway_advertise_url is not None and not self.gateway_advertise_url.startswith(("http://", "https://")):
            raise ValueError("--gateway-advertise-url must be an http(s)://HOST:PORT/v1/sessions URL")
        return self

    def retry_policy(self) -> RetryPolicy:
        """The retry policy these options describe."""
        return RetryPolicy(max_retries=self.max_retries, backoff_s=self.retry_backoff_s,
                           retry_on=frozenset(self.retry_on), no_retry_on=frozenset(self.no_retry_on))


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


TASK_FORMATS = ("task_dirs", "harbor")
"""Dataset formats whose cases a harness can run (an instruction per case)."""


def load_envs(opts: JobOptions) -> list[tuple[EnvConfig, list[Case]]]:
    """The env configs (``agent_configs`` and the ``tasks`` folders, else every env of the agent
    root) and their cases, filtered by ``env_names``, ``limit`` and ``case_ids`` (an
    env left without a case is left out). Raises SetupError
    for bad configs, unknown env names or case ids, two envs with the same name and a runtime command naming
    a file of the env folder that does not exist. With ``env_names``, an env folder of the agent
    root that does not load is skipped with a warning when the envs asked for are all found."""
    if opts.host_toolchain and not opts.tasks:
        raise SetupError(HOST_TOOLCHAIN_ALONE)
    try:
        if opts.agent_configs or opts.agent_start_config is not None or opts.tasks:
            configs = [*load_agent_configs(opts.agent_configs, opts.agent_start_config),
                       *(task_folder_env(p, opts.host_toolchain) for p in opts.tasks)]
        elif opts.env_names:
            configs, broken = scan_envs(opts.agent_root)
            if broken and set(opts.env_names) - {c.name for c in configs}:
                raise broken[0]  # perhaps the env asked for
            for e in broken:
                notices.warning(f"warning: skipped an env that does not load (not asked for by --env): {e}")
        else:
            configs = discover_envs(opts.agent_root)
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
        envs = [(c, load_cases(c, opts.limit)) for c in configs]
        return select_cases(envs, opts.case_ids)
    except EnvConfigError as e:
        raise SetupError(str(e)) from e


def check_evaluators(agent_root: Path, configs: list[EnvConfig]) -> None:
    """With ``--enable-evaluation``, before any session: SetupError naming each env that would not
    be graded (no evaluator found, not a Harbor env graded by its tests) and the file expected;
    an env that says ``evaluation: none`` is run ungraded."""
    missing = [cfg for cfg in configs if cfg.evaluation != "none" and cfg.dataset.format != "harbor"
               and env_evaluator(agent_root, cfg) is None]
    if missing:
        where = "; ".join(f"env {cfg.name!r} needs {agent_root / cfg.name / EVALUATOR_FILE_NAME}"
                          + (f" (or {cfg.env_dir.parent / cfg.name / EVALUATOR_FILE_NAME})"
                             if cfg.env_dir.parent.resolve() != Path(agent_root).resolve() else "")
                          for cfg in missing)
        raise SetupError(f"--enable-evaluation: no evaluator: {where}; or set `evaluation: none` in its "
                         "env.yaml to run it ungraded")


def harness_envs(envs: list[tuple[EnvConfig, list[Case]]]) -> list[tuple[EnvConfig, list[Case]]]:
    """The envs a harness can run: task-directory envs (``dataset.format: task_dirs`` or
    ``harbor``). The others are left out with a warning line; SetupError when none is left."""
    kept = [(cfg, cases) for cfg, cases in envs if cfg.dataset.format in TASK_FORMATS]
    skipped = sorted(cfg.name for cfg, _ in envs if cfg.dataset.format not in TASK_FORMATS)
    if skipped:
        notices.warning(f"warning: --harness runs task-directory envs only (dataset.format: task_dirs); skipping "
              f"{', '.join(skipped)}")
    if not kept:
        raise SetupError("--harness: none of the selected envs is a task-directory env (dataset.format: "
                         f"task_dirs); skipped {', '.join(skipped)}")
    return kept


def load_harnesses(specs: list[str]) -> dict[str, LoadedHarness]:
    """The harnesses named (or given by folder) by ``--harness``, by name; SetupError for one that
    cannot be found or loaded, or two with the same name."""
    found: dict[str, LoadedHarness] = {}
    for spec in specs:
        try:
            h = load_harness(spec)
        except HarnessUnavailable as e:
            raise SetupError(str(e)) from e
        if h.name in found and found[h.name].folder != h.folder:
            raise SetupError(f"--harness: two harnesses are named {h.name!r}: {found[h.name].folder} and {h.folder}")
        found[h.name] = h
    return found


async def install_harnesses(loaded: dict[str, LoadedHarness]) -> dict[str, InstalledHarness]:
    """Install each harness once per machine (``rollout.sandbox.harness_cache.ensure_installed``, in a thread);
    SetupError when one cannot be installed here."""
    ready: dict[str, InstalledHarness] = {}
    for name, h in loaded.items():
        if not is_installed(h.harness):
            notices.info(f"harness {name}: installing {h.harness.version} into {cache_dir(h.harness)} "
                         "(once per machine)")
        try:
            ready[name] = await asyncio.to_thread(install_harness, h)
        except HarnessUnavailable as e:
            raise SetupError(f"harness {name} cannot be used here: {e}") from e
    return ready


def check_sandbox(opts: JobOptions, envs: list[EnvConfig], probe: bool = True) -> None:
    """Before anything runs: when an env runs sandboxed, check that bubblewrap works here (else
    SetupError saying how to install it or opt out) and print how each limit is enforced; warn
    about envs that run without a sandbox. ``probe`` False: the warning only (on Ray each node
    checks its own sandbox)."""
    bare = sorted(cfg.name for cfg in envs if effective_mode(cfg, opts.sandbox) == "none")
    if bare:
        notices.warning(f"warning: no sandbox for env(s) {', '.join(bare)}: their runtimes see the host's files, "
              "environment and network")
    trusted = sorted(cfg.name for cfg in envs
                     if grader_mode(cfg, opts.grader_isolation or opts.sandbox) == "none") if opts.enable_evaluation else []
    if trusted:
        notices.warning(f"warning: evaluators of env(s) {', '.join(trusted)} run in the launcher (grader isolation none): "
              "trust them, and what they run of the agent's answer, with this machine")
    graded_in_sandbox = opts.enable_evaluation and len(trusted) < len(envs)
    if (len(bare) == len(envs) and not graded_in_sandbox) or not probe:
        return
    try:
        support = sandbox_support()
    except SandboxUnavailable as e:
        raise SetupError(str(e)) from e
    how = "; ".join(f"{k}: {v}" for k, v in support.mechanisms().items())
    notices.info(f"sandbox: bubblewrap ({support.bwrap}); limits enforced by {how}")
    if support.pids is None:
        notices.warning("warning: the per-session process limit is not enforced on this machine (no usable cgroup "
              "pids controller)")


async def connect_ray(opts: JobOptions, envs: list[EnvConfig], session_url: str) -> RayBackend:
    """Connect to the Ray cluster of ``--ray-address`` (else ``$RAY_ADDRESS``) and check, from a
    task on every node, that ``session_url``'s gateway answers there and the sandbox runs there,
    and that some node can hold each env's ``runtime.resources``. SetupError otherwise."""
    address = opts.ray_address or os.environ.get("RAY_ADDRESS")
    if not address:
        raise SetupError("--mode ray needs --ray-address HOST:PORT (the Ray head; or auto, or $RAY_ADDRESS)")
    try:
        backend = ray_connect(address)
    except RayBackendError as e:
        raise SetupError(str(e)) from e
    try:
        backend.check_resources(envs)
        await backend.check_nodes(gateway_root(session_url), envs, opts.sandbox)
    except RayBackendError as e:
        backend.close()
        raise SetupError(str(e)) from e
    notices.info(f"ray: {len(backend.alive_nodes())} node(s) at {address}; runtimes reach the gateway at "
                 f"{session_url}")
    return backend


async def start_services(gw: GatewaySettings, models: list[str], store: Store, log_dir: Path,
                          children: list[ChildProcess], listen: str | None = None) -> str:
    """Start the model server of each managed route among ``models`` (once each), then the
    gateway (listening for ``listen``, the advertised URL, when set); returns its session URL."""
    check_routes(gw, models)
    routes = dict(gw.llm_routes)
    try:
        for model in dict.fromkeys(models):
            route = gw.llm_routes[model]
            if route.managed is not None:
                llama = await start_llama_server(route.managed, log_dir)
                children.append(llama)
                routes[model] = route.model_copy(update={"base_url": llama.url})
        settings = gw.model_copy(update={
            "llm_routes": routes, "storage_type": store.kind,
            "storage_config": gw.storage_config.model_copy(update={"db_url": store.peer_url()}),
        })
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


def check_routes(gw: GatewaySettings, models: list[str]) -> None:
    """SetupError naming each of ``models`` that is not a route of the gateway config."""
    unknown = [m for m in models if m not in gw.llm_routes]
    if unknown:
        raise SetupError(f"--llm-model {', '.join(map(repr, unknown))}: not a route of the gateway config "
                         f"({', '.join(sorted(gw.llm_routes))})")


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


async def run_job(opts: JobOptions, on_start: Callable[[str, int], None] | None = None,
                  on_done: Callable[[SessionRecord], None] | None = None,
                  on_breaker: Callable[[BreakerEvent], None] | None = None,
                  on_plan: Callable[[dict[str, int]], None] | None = None) -> JobResult:
    """Run a job. ``on_start(job_id, n_sessions)`` is called once sessions are planned and the
    gateway is up, just after ``on_plan(sessions_per_env)``; ``on_done(record)`` after each session; ``on_breaker(event)`` at each change
    of the circuit breaker. Cancellation (Ctrl-C) stops the sessions in flight cleanly (see
    ``rollout.jobs.scheduler``) and every started process. When the breaker gives up, the finished
    sessions are still reported and ``JobResult.stopped`` says why. The job is held in the store
    while it runs (:func:`hold_job`): a second launcher on it, ``--resume`` included, is a
    SetupError naming the one running it."""
    envs = load_envs(opts)
    loaded = load_harnesses(opts.harness)
    if any(h.harness.runtime is None for h in loaded.values()) and not opts.resume:
        envs = harness_envs(envs)  # the wrapper needs an instruction; a harness's own runtime runs any env
    if opts.enable_evaluation:
        check_evaluators(opts.agent_root, [cfg for cfg, _ in envs])
    check_sandbox(opts, [cfg for cfg, _ in envs], probe=opts.mode == "local")
    gw_settings = load_gateway_settings(opts.gateway_config)
    default = gw_settings.route_for_default()
    models = list(dict.fromkeys(opts.llm_model)) or ([default] if default else [])
    if not models:
        raise SetupError("no --llm-model and no route in the gateway config")
    if not opts.gateway_base_url and not opts.resume:
        check_routes(gw_settings, models)
    store = open_store(opts.db_path)
    children: list[ChildProcess] = []
    ray_backend: RayBackend | None = None
    lease: JobLease | None = None
    try:
        await init_store(store)
        job_id = opts.job_id or f"job-{datetime.now(UTC):%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"
        lease = await hold_job(store, job_id)  # one launcher per job: refused while another runs it
        installed = {} if opts.resume else await install_harnesses(loaded)  # before any row is written
        if opts.gateway_base_url and not opts.resume:  # a gateway that cannot serve the job: no row written
            await _check_running_gateway(opts.gateway_base_url, store, models, gateway_api_key(None))
        plan = await plan_job(store, job_id, models, envs, [*loaded] or [None], resume=opts.resume,
                              group_size=opts.rl_group_size, max_steps=opts.max_steps,
                              rerun_launcher_errors=opts.rerun_launcher_errors)
        configs = [cfg for cfg, _ in envs]
        del envs  # the cases: each session's row keeps its own, the dataset is not held while the job runs
        if opts.resume and plan.ids:
            models = plan.models
            for name in sorted(set(plan.harnesses) - set(loaded)):
                try:
                    loaded[name] = load_harness(name)  # a bundled one, by name
                except HarnessUnavailable as e:
                    raise SetupError(f"--resume: sessions of {job_id} ran the harness {name!r}, which cannot be "
                                     f"loaded by name ({e}); give its folder again with --harness PATH") from e
        if opts.resume:
            installed = await install_harnesses({n: h for n, h in loaded.items() if n in plan.harnesses})
        log_dir = Path("runs") / "logs" / job_id
        if opts.gateway_base_url:
            api_key = gateway_api_key(None)  # $GATEWAY_API_KEY, for a gateway with auth on
            if opts.resume:  # the routes the job's sessions ran on, known from its rows
                await _check_running_gateway(opts.gateway_base_url, store, models, api_key)
            gateway_url = opts.gateway_base_url.rstrip("/")
        else:
            api_key = gateway_api_key(gw_settings)  # the started gateway's own first key, if any
            gateway_url = await start_services(gw_settings, models, store, log_dir, children,
                                                listen=opts.gateway_advertise_url)
        advertise_url = opts.gateway_advertise_url.rstrip("/") if opts.gateway_advertise_url else None
        if opts.mode == "ray":
            ray_backend = await connect_ray(opts, configs, advertise_url or gateway_url)
        if on_plan:
            on_plan(dict(plan.per_env))
        on = f"route {models[0]!r}" if len(models) == 1 else f"routes {', '.join(map(repr, models))}"
        if installed:
            on += f" with harness {', '.join(installed)}"
        notices.info(f"job {job_id}: {len(plan.ids)} sessions on {on} via {gateway_url} "
                     f"(pool {opts.pool_size}, db {store.identity()})")
        if on_start:  # after the job's line: a progress display starts below it
            on_start(job_id, len(plan.ids))
        workspaces = Path(tempfile.mkdtemp(prefix=f"rollout-{job_id}-"))
        settings = RunSettings(job_id=job_id, model=models[0], models=tuple(models), harnesses=installed,
                               log_dir=log_dir, gateway_url=gateway_url, agent_root=opts.agent_root,
                               pool_size=opts.pool_size, temperature=opts.llm_temperature,
                               max_steps=opts.max_steps, enable_evaluation=opts.enable_evaluation,
                               eval_timeout_s=opts.eval_timeout, keep_workspaces=opts.keep_workspaces,
                               workspace_root=workspaces, gateway_api_key=api_key, sandbox=opts.sandbox,
                               grader_isolation=opts.grader_isolation or opts.sandbox,
                               retry=opts.retry_policy(), breaker=opts.breaker, advertise_url=advertise_url,
                               session_timeout_s=opts.timeout, max_broken_graders=opts.max_broken_graders,
                               image_map=opts.image_map())
        scheduler = Scheduler(store, settings, {cfg.name: cfg for cfg in configs}, on_done=on_done, on_breaker=on_breaker,
                              executor=ray_backend.executor() if ray_backend else None, keep_records=False)
        stopped: str | None = None
        stop_kind: Literal["breaker", "broken_graders"] | None = None
        try:
            await scheduler.run(RowSource.from_store(store, plan.ids))
        except GraderSetupError as e:
            raise SetupError(str(e)) from e
        except JobStopped as e:
            stopped, stop_kind = str(e), e.kind
        finally:
            if not opts.keep_workspaces:  # however deep what an agent left there
                left = remove_tree(workspaces)
                if left is not None:
                    log.warning("the job's workspaces were not all removed: %s", left)
        out = opts.out or Path("runs") / f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{job_id}.jsonl"
        totals = await write_records(store, job_id, out)
        await store.checkpoint()
        return JobResult(job_id=job_id, totals=totals, out=out, store=store.identity(),
                         workspaces=workspaces if opts.keep_workspaces else None,
                         breaker_events=scheduler.breaker_events, stopped=stopped, stop_kind=stop_kind)
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
