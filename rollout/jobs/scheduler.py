"""The scheduler: runs the planned sessions (``rollout.core.plan``), exactly ``pool_size``
attempts at once.

Per attempt: a runtime in a fresh temporary workspace (``files/`` of a task copied in), the gateway
session closed, the end classified (``rollout.core.outcomes``: from the launcher's and the gateway's
records, never from what the runtime reports). An infrastructure failure is kept as an
attempt row and retried after a backoff (its steps archived first); any other end is final:
evaluation (optional), then the row finished with the score written back as the reward of the last
step. A circuit breaker holds new attempts while the gateway is down. Ctrl-C cancels the attempts
in flight: each runtime's process group is killed, its gateway session closed, its row marked
``cancelled`` and left unfinished (so ``--resume`` runs it again); nothing is half-written.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import re
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, cast

import aiohttp

from rollout.contract.harness import SOLUTION_ENV
from rollout.contract.protocol import EvalRequest, EvalSpec, SimulationStartRequest, SimulationStartResult
from rollout.core.envs import Case, EnvConfig, session_config
from rollout.core.outcomes import (
    GATEWAY_CLASSES,
    INFRA_EVAL_STATUS,
    AttemptEnd,
    BreakerEvent,
    BreakerSettings,
    CircuitBreaker,
    RetryPolicy,
    classify,
    status_after_close,
    verifier_setup_failed,
)
from rollout.core.plan import RowSource, session_case
from rollout.core.trees import remove_tree
from rollout.grading.attribution import Controls
from rollout.grading.evaluation import Evaluation, build_eval_spec
from rollout.grading.evaluator_loader import env_evaluator
from rollout.grading.grader import Grader, grader_mode
from rollout.grading.sandbox import GraderLimits
from rollout.grading.trajectory import to_trajectory
from rollout.grading.verifier import VerifierResult, verifier_outcome, verify_session
from rollout.jobs.services import auth_headers, gateway_root
from rollout.jobs.workspace_archive import keep_workspace
from rollout.results.records import record_of
from rollout.results.report import SessionRecord
from rollout.sandbox.harness_cache import InstalledHarness
from rollout.sandbox.images import (
    ImageError,
    ImageRoot,
    at_workdir,
    own_files,
    resolve,
    seed_workspace,
    source_for,
)
from rollout.sandbox.runner import CODE_ROOT, RuntimeCommand, run_runtime
from rollout.sandbox.runtime_local import RuntimeRun, pidfd_child_watcher
from store import (
    GRADER_BROKEN,
    FinalStatus,
    JobEnvironment,
    SessionAttempt,
    SessionResult,
    SessionStep,
    Store,
    utcnow,
)

log = logging.getLogger(__name__)


class Executor(Protocol):
    """Runs one attempt's runtime: ``(cfg, request, workspace, extra_env, job_mode, command=,
    stderr_log=, image=) -> RuntimeRun``, the arguments and contract of ``rollout.sandbox.runner.run_runtime``
    (the local executor); the workspace holds the final workspace when it returns.
    ``rollout.jobs.ray_backend.RayExecutor`` runs it on a Ray node instead."""

    def __call__(self, cfg: EnvConfig, request: SimulationStartRequest, workspace: Path, extra_env: dict[str, str],
                 job_mode: str = "bwrap", *, command: RuntimeCommand | None = None,
                 stderr_log: Path | None = None, image: ImageRoot | None = None) -> Awaitable[RuntimeRun]: ...


# job_environments.status values that mean the launcher failed to run the session (not the agent): exit code 2
HARNESS_FAILURES = frozenset({"error", "timeout"})
_MAX_CLOSE_FAILURES = 5  # a retry whose gateway session cannot be closed this often is given up


class JobStopped(RuntimeError):
    """The job stopped early: the circuit breaker gave up (the gateway or its upstream stayed
    unavailable; ``kind`` ``breaker``) or ``max_broken_graders`` broken-grader findings were made
    (``broken_graders``). Sessions not finished are left for ``--resume``; the message says why."""

    def __init__(self, reason: str, kind: Literal["breaker", "broken_graders"] = "breaker") -> None:
        super().__init__(reason)
        self.kind = kind


def rejected_summary(close_info: dict[str, Any]) -> str | None:
    """What the gateway's close answer says it refused of the session's calls (its
    ``rejected_calls`` by reason; synthetic stops at ``max_steps`` left out, the session's
    ``truncated`` says those), e.g. ``"the gateway refused 12 call(s) of the session itself:
    invalid_api_key 12"``; None when it refused none."""
    counts = {k: v for k, v in (close_info.get("rejected_calls") or {}).items() if k != "max_steps" and v}
    if not counts:
        return None
    detail = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    return f"the gateway refused {sum(counts.values())} call(s) of the session itself: {detail}"


def unrecorded_calls(close_info: dict[str, Any]) -> int:
    """The close answer's ``unrecorded_calls``: calls of the session the gateway could not record
    (0 when absent: an older gateway)."""
    n = close_info.get("unrecorded_calls")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 0


def remove_workspace(folder: Path) -> None:
    """Delete a session's workspace: one ``rmdir`` when it is empty (no tree walk), else the
    whole tree, however deep and whatever its modes (``remove_tree``); a folder already gone is
    fine. What cannot be removed is logged."""
    try:
        os.rmdir(folder)
    except FileNotFoundError:
        return
    except OSError:
        left = remove_tree(folder)
        if left is not None:
            log.warning("workspace %s was not removed: %s", folder, left)


@dataclass
class _Work:
    """A session to run: its row, the number of the attempt to run next, the first attempt
    number of this launcher run (retries are counted from it), its attempts so far, and how
    often closing it before a retry failed."""

    row: JobEnvironment
    attempt: int
    first: int
    attempts: list[SessionAttempt]
    close_failures: int = 0


def _image_start(image: ImageRoot, start: Path, keep: bool) -> None:
    """``start`` (a control's starting workspace, the case's files) as a session in ``image``
    starts: the image's WORKDIR, then the case's files only when ``keep``."""
    files = start.parent / f"{start.name}.files"
    start.rename(files)
    start.mkdir()
    seed_workspace(image, start)
    if keep:
        shutil.copytree(files, start, symlinks=True, dirs_exist_ok=True)
    shutil.rmtree(files, ignore_errors=True)


@dataclass
class _Run:
    """What one attempt's runtime left: its status (after the gateway's truncation), the runtime's run,
    the close answer, recorded steps and how it ended, what the task's tests said (None: none ran)
    and the image it ran in (None: none)."""

    status: str
    runtime: RuntimeRun | None
    close_info: dict[str, Any]
    steps: list[SessionStep]
    end: AttemptEnd
    errors: list[str]
    verdict: VerifierResult | None = None
    image: ImageRoot | None = None


@dataclass(frozen=True)
class RunSettings:
    """Job-wide settings: the route key, temperature (None = route default), step budget override
    (None = the env's ``max_steps``), concurrency, evaluation switch and timeout (seconds), and
    the folder that holds the sessions' workspaces (None: the system temp folder), the session base
    URL given to runtimes when it is not ``gateway_url`` (``advertise_url``: e.g. the gateway's
    address as Ray nodes reach it), the
    gateway's API key (None: its auth is off): sent on the launcher's own calls (session close)
    and given to each runtime as ``OPENAI_API_KEY`` (what the openai SDK reads; also as
    ``ANTHROPIC_API_KEY`` and ``GATEWAY_API_KEY``, see ``rollout.sandbox.runner.session_env``), the retry
    policy, the circuit breaker's settings and ``sandbox``: ``bwrap`` (each runtime in a bubblewrap
    sandbox) or ``none`` (see ``rollout.sandbox.runner``); ``grader_isolation``: where evaluators run (``bwrap``:
    the grader sandbox, ``none``: in the launcher; None: as ``sandbox``; see ``rollout.grading``). ``models``: every route of the job (``model``
    alone when empty), probed by the breaker; ``harnesses``: name -> installed harness, for rows
    whose ``harness`` is set; ``log_dir``: where harness logs go
    (``<log_dir>/harness/<session id>-a<attempt>.log``; None: not kept)."""

    job_id: str
    model: str
    gateway_url: str
    agent_root: Path
    pool_size: int
    temperature: float | None = None
    max_steps: int | None = None
    enable_evaluation: bool = False
    eval_timeout_s: float = 60.0
    keep_workspaces: bool = False
    workspace_root: Path | None = None
    gateway_api_key: str | None = None
    sandbox: str = "bwrap"
    grader_isolation: Literal["bwrap", "none"] | None = None  # None: as ``sandbox``
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    breaker: BreakerSettings = field(default_factory=BreakerSettings)
    models: tuple[str, ...] = ()
    harnesses: Mapping[str, InstalledHarness] = field(default_factory=dict)
    log_dir: Path | None = None
    advertise_url: str | None = None
    session_timeout_s: float | None = None  # ``--timeout``: every session's, over the env's and the task's
    max_broken_graders: int = 1  # the job stops at this many broken-grader findings (0: never)
    image_map: tuple[tuple[str, str], ...] = ()  # ``--image REF=LOCAL``: over each env's ``images``


FAILURES_TOLD = 3
"""Infrastructure failures of each class logged as warnings (later ones at INFO)."""


def workspace_prefix(env: str, case_id: str, sample_index: int) -> str:
    """The name prefix of a session's workspace folder: env, case and sample, with every character
    but letters, digits, ``.``, ``_`` and ``-`` as ``_`` (a case id such as ``django/django-11099``
    is not a path), at most 60 characters."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", f"{env}-{case_id}-{sample_index}-")[:60]


def readyz_error(body: str) -> str:
    """The ``error`` of a gateway's ``/readyz`` answer (why it is not ready), else the body's
    first 200 characters."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        error = None
    return error if isinstance(error, str) and error else body[:200]


class Scheduler:
    """Runs a job's session rows with ``pool_size`` workers. ``envs`` maps env name to config; each
    session's case is its row's ``env_params["dataset"]`` (the dataset row it was planned with:
    the dataset is not held while the job runs). ``on_done`` is called with each record,
    ``on_breaker`` with each change of the circuit breaker (also kept in ``breaker_events``).
    ``rng`` draws the backoff jitter; ``executor`` runs each attempt's runtime (default:
    ``run_runtime``, on this machine); ``keep_records`` False: finished records are passed to
    ``on_done`` only, not kept (a job of any size in flat memory)."""

    def __init__(self, store: Store, settings: RunSettings, envs: dict[str, EnvConfig],
                 on_done: Callable[[SessionRecord], None] | None = None,
                 on_breaker: Callable[[BreakerEvent], None] | None = None, rng: random.Random | None = None,
                 executor: Executor | None = None, keep_records: bool = True) -> None:
        self.store = store
        self.keep_records = keep_records
        self._execute: Executor = executor or run_runtime
        self.s = settings
        self.envs = envs
        self.on_done = on_done
        self.on_breaker = on_breaker
        self.records: list[SessionRecord] = []
        self.breaker_events: list[BreakerEvent] = []
        self._failures_told: Counter[str] = Counter()
        self._rng = rng or random.Random()
        self._http: aiohttp.ClientSession | None = None
        self._queue: asyncio.PriorityQueue[tuple[int, int, _Work | None]] = asyncio.PriorityQueue()
        self._seq = 0
        self._left = 0
        self._room = asyncio.Semaphore(1)
        self._feeder: asyncio.Task[None] | None = None
        self._files: ThreadPoolExecutor | None = None
        self._removals: set[asyncio.Future[None]] = set()
        self._timers: set[asyncio.Task[None]] = set()
        self._workers: list[asyncio.Task[None]] = []
        self._stop_reason: str | None = None
        self._specs: dict[tuple[str, Path], EvalSpec] = {}
        self._evaluators: dict[str, Path | None] = {}
        self._grader: Grader | None = None
        self._controls = Controls(settings.workspace_root)
        self._broken: Counter[str] = Counter()
        self._stop_when_told: str | None = None
        self.breaker = CircuitBreaker(settings.breaker, self._probe, self._breaker_event)

    async def run(self, rows: Sequence[JobEnvironment] | RowSource) -> list[SessionRecord]:
        """Run every row (a list, or a ``RowSource`` read page by page: at most about two pools'
        worth of rows wait in memory); returns one record per finished session (cancelled ones
        are absent; empty unless ``keep_records``). Cancelling this coroutine cancels the attempts
        in flight cleanly. Raises JobStopped when the circuit breaker gives up (records so far
        are in ``records``)."""
        if not isinstance(rows, RowSource):
            rows = list(rows)
            prior = await self.store.job_attempts(rows[0].job_id) if rows else {}
            source = RowSource.of(rows, prior)
        else:
            source = rows
        with pidfd_child_watcher():
            if not self.s.enable_evaluation:
                return await self._run(source)
            async with Grader(grader_mode(None, self._grader_job_mode()), work_dir=self.s.workspace_root) as grader:
                await grader.start(p.parent.parent for p in map(self._evaluator, self.envs.values()) if p)
                self._grader = grader
                try:
                    return await self._run(source)
                finally:
                    self._grader = None

    def _grader_job_mode(self) -> str:
        return self.s.grader_isolation or self.s.sandbox

    def _evaluator(self, cfg: EnvConfig) -> Path | None:
        """The env's ``rule_evaluator.py`` (under the agent root, else beside the env's folder),
        looked up once per job."""
        if cfg.name not in self._evaluators:
            self._evaluators[cfg.name] = env_evaluator(self.s.agent_root, cfg)
        return self._evaluators[cfg.name]

    async def _run(self, source: RowSource) -> list[SessionRecord]:
        self._left = source.total
        self._room = asyncio.Semaphore(2 * max(1, self.s.pool_size))
        # aiohttp, not httpx: a session close per session, and httpx cost 3x more launcher CPU per close
        timeout = aiohttp.ClientTimeout(total=None, connect=30, sock_connect=30, sock_read=120)  # close may wait
        async with aiohttp.ClientSession(timeout=timeout, headers=auth_headers(self.s.gateway_api_key),
                                         connector=aiohttp.TCPConnector(limit=0)) as http:
            self._http = http
            n = min(self.s.pool_size, max(1, source.total))
            if not source.total:
                self._put(9, None)
            feeder = self._feeder = asyncio.create_task(self._feed(source), name="scheduler-feed")
            self._workers = [asyncio.create_task(self._worker(), name=f"worker-{i}") for i in range(n)]
            try:
                await asyncio.wait([*self._workers, feeder], return_when=asyncio.FIRST_EXCEPTION)
                if feeder.done() and not feeder.cancelled() and feeder.exception() is not None:
                    raise feeder.exception()  # type: ignore[misc]  # the rows could not be read
                while pending := [t for t in self._workers if not t.done()]:
                    self._raise_if_a_worker_died()  # at once: the others would wait for its session forever
                    await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
                self._raise_if_a_worker_died()
            finally:
                for t in [feeder, *self._workers, *self._timers]:
                    t.cancel()
                await asyncio.gather(feeder, *self._workers, *self._timers, return_exceptions=True)
                await self.breaker.aclose()
                await self._controls.aclose()
                await asyncio.shield(asyncio.gather(*self._removals, return_exceptions=True))
                if self._files is not None:
                    self._files.shutdown(wait=True)
                    self._files = None
        if self._stop_reason is not None:
            raise JobStopped(self._stop_reason, "broken_graders" if self._stop_when_told else "breaker")
        return self.records

    async def _feed(self, source: RowSource) -> None:
        """Queue the rows of ``source`` in order, a page at a time, keeping at most two pools of
        them queued (a worker taking one makes room)."""
        queued = 0
        async for rows, prior in source.pages():
            for r in rows:
                await self._room.acquire()
                self._put(1, _Work(r, r.attempts + 1, r.attempts + 1, list(prior.get(r.session_id, []))))
                queued += 1
        if queued < source.total:  # rows gone from the store meanwhile: the job must still end
            log.error("%d planned session(s) were not found in the store and did not run", source.total - queued)
            for _ in range(source.total - queued):
                self._finished_one()

    def _remove_later(self, workspace: Path) -> None:
        """Delete a finished session's workspace in the scheduler's file thread: an ``rmdir`` can
        stall for milliseconds on a busy disk, which must hold up neither the event loop nor
        the worker (``run`` waits for every removal before it returns)."""
        if self._files is None:
            self._files = ThreadPoolExecutor(1, thread_name_prefix="scheduler-files")
        fut = asyncio.get_running_loop().run_in_executor(self._files, remove_workspace, workspace)
        self._removals.add(fut)
        fut.add_done_callback(self._removals.discard)

    def _put(self, priority: int, work: _Work | None) -> None:
        self._seq += 1
        self._queue.put_nowait((priority, self._seq, work))

    def _schedule(self, work: _Work, delay_s: float) -> None:
        """Queue ``work`` again after ``delay_s`` seconds, ahead of sessions not started yet."""
        async def later() -> None:
            await asyncio.sleep(delay_s)
            self._put(0, work)

        task = asyncio.create_task(later(), name=f"retry-{work.row.session_id}")
        self._timers.add(task)
        task.add_done_callback(self._timers.discard)

    def _finished_one(self) -> None:
        self._left -= 1
        if self._left == 0:
            for _ in self._workers:
                self._put(9, None)

    def _breaker_event(self, ev: BreakerEvent) -> None:
        self.breaker_events.append(ev)
        if self.on_breaker:
            self.on_breaker(ev)
        if ev.state == "stopped":
            self._stop(ev.reason)

    def _stop(self, reason: str) -> None:
        """Stop the job: the attempts in flight are cancelled (resumable); ``run`` raises JobStopped."""
        self._stop_reason = reason
        for t in [*self._workers, *self._timers, *([self._feeder] if self._feeder else [])]:
            t.cancel()

    async def _probe(self) -> str | None:
        """GET the gateway's ``/readyz`` (asking it to check the route's upstream too); None when
        it answers ready, else why not."""
        assert self._http is not None
        url = gateway_root(self.s.gateway_url) + "/readyz"
        for model in self.s.models or (self.s.model,):
            try:
                async with self._http.get(url, params={"route": model},
                                          timeout=aiohttp.ClientTimeout(total=10)) as r:
                    if r.status != 200:
                        return f"{url}?route={model}: HTTP {r.status}: {readyz_error(await r.text())}"
            except (aiohttp.ClientError, TimeoutError) as e:
                return f"{url}: {type(e).__name__}: {e}"
        return None

    def _raise_if_a_worker_died(self) -> None:
        """A worker that died of a bug fails the job loudly."""
        for t in self._workers:
            if t.done() and not t.cancelled() and t.exception() is not None:
                raise t.exception()  # type: ignore[misc]

    async def _worker(self) -> None:
        while True:
            priority, _, work = await self._queue.get()
            if work is None:
                return
            if priority == 1:
                self._room.release()
            if not await self.breaker.wait_ready():
                return
            record = await self.run_session(work)
            if record is not None:
                if self.keep_records:
                    self.records.append(record)
                self._finished_one()
                if self.on_done:
                    self.on_done(record)
                if self._stop_when_told is not None and self._stop_reason is None:
                    self._stop(self._stop_when_told)

    async def run_session(self, work: _Work) -> SessionRecord | None:
        """Run the next attempt of a session (see the module docstring). Returns its record when
        the session is finished, None when a retry was scheduled."""
        row, n, sid = work.row, work.attempt, work.row.session_id
        cfg = self.envs[row.env_name]
        case = session_case(cfg, row)
        if n > 1:
            why = await self._prepare_retry(work)
            if why is not None:
                work.close_failures += 1
                if work.close_failures > _MAX_CLOSE_FAILURES:
                    return await self._give_up(work, why)
                self.breaker.suspect()
                self._schedule(work, self.s.retry.delay_s(work.close_failures, self._rng))
                return None
        t0 = time.monotonic()
        started = utcnow()
        await self.store.update_job_session(sid, status="running", attempts=n, started_at=started, finished=False)
        workspace = Path(tempfile.mkdtemp(prefix=workspace_prefix(cfg.name, row.case_id, row.sample_index),
                                          dir=self.s.workspace_root))
        try:
            try:
                run = await self._run_attempt(work, cfg, case, workspace)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a launcher bug must fail this attempt only, with its reason recorded
                log.exception("session %s failed in the launcher", sid)
                why = f"launcher error: {type(e).__name__}: {e}"
                run = _Run("error", None, {}, await self.store.trajectory(sid),
                           AttemptEnd("launcher_error", True, why), [why])
            return await self._conclude(work, run, cfg, case, workspace, t0, started)
        except asyncio.CancelledError:
            # finish the bookkeeping even if cancelled again meanwhile: nothing half-written
            cleanup = asyncio.ensure_future(self._cancelled(work, t0, started))
            while not cleanup.done():
                try:
                    await asyncio.shield(cleanup)
                except asyncio.CancelledError:
                    continue
            raise
        except Exception as e:  # a launcher bug while concluding: this session only, reason recorded
            log.exception("session %s failed in the launcher", sid)
            why, duration = f"launcher error: {type(e).__name__}: {e}", time.monotonic() - t0
            result = SessionResult(status="error", outcome="launcher_error", attempts=n, error=why,
                                   duration_s=duration)
            await self.store.record_attempt(SessionAttempt(
                session_id=sid, attempt=n, job_id=row.job_id, status="error", outcome="launcher_error", infra=True,
                reason=why, started_at=started, finished_at=utcnow(), duration_s=duration))
            await self.store.finish_job_session(sid, result)
            steps = await self.store.trajectory(sid)
            attempts = (await self.store.job_attempts(row.job_id)).get(sid, [])
            return record_of(row, result, to_trajectory(sid, steps), attempts, steps)
        finally:
            if not self.s.keep_workspaces:
                self._remove_later(workspace)

    def _tell_failure(self, sid: str, n: int, end: AttemptEnd, then: str) -> None:
        """Log an attempt's infrastructure failure: the first ``FAILURES_TOLD`` of each class as a
        warning (the reason's last line), later ones at INFO (every reason is in the store)."""
        self._failures_told[end.outcome] += 1
        told = self._failures_told[end.outcome]
        reason = (end.reason or "").strip().splitlines()[-1:] or ["no reason given"]
        if told > FAILURES_TOLD:
            log.info("session %s attempt %d: %s: %s; %s", sid, n, end.outcome, reason[0][:300], then)
            return
        more = f" (further {end.outcome} failures are logged at INFO)" if told == FAILURES_TOLD else ""
        log.warning("session %s attempt %d: %s: %s; %s%s", sid, n, end.outcome, reason[0][:300], then, more)

    async def _prepare_retry(self, work: _Work) -> str | None:
        """Before attempt ``n`` > 1: close the gateway session (again: idempotent, and the close
        of a failed attempt may not have reached the gateway), then archive the previous attempt's
        steps under ``<sid>~a<n-1>`` and drop the gateway's state so the budget starts afresh.
        Returns None when the attempt may start, else why not (the close failed: the caller
        queues the work again after a backoff, using no attempt)."""
        sid, prev = work.row.session_id, work.attempt - 1
        close = await self._close(sid, "retry")
        if close.get("error"):
            return str(close["error"])
        moved = await self.store.reset_for_retry(sid, prev)
        if not any(a.attempt == prev for a in work.attempts):  # the launcher was stopped during it
            att = SessionAttempt(session_id=sid, attempt=prev, job_id=work.row.job_id, status=work.row.status,
                                 outcome="interrupted", reason="the launcher stopped during this attempt",
                                 step_count=moved)
            if await self.store.record_attempt(att, if_missing=True):
                work.attempts.append(att)
        return None

    async def _give_up(self, work: _Work, why: str) -> SessionRecord:
        """Finish a session whose retry could not be prepared (its gateway session cannot be
        closed): an infrastructure failure, never graded."""
        row, sid = work.row, work.row.session_id
        result = SessionResult(
            status="error", outcome="gateway_unreachable", attempts=work.attempt - 1,
            error=f"the retry could not start ({_MAX_CLOSE_FAILURES + 1} tries): {why}",
            eval_status=INFRA_EVAL_STATUS if self.s.enable_evaluation else None,
            eval_reason=(f"not graded: infrastructure failure (gateway_unreachable) in attempt {work.attempt - 1}"
                         if self.s.enable_evaluation else None))
        await self.store.finish_job_session(sid, result)
        steps = await self.store.trajectory(sid)
        return record_of(row, result, to_trajectory(sid, steps), work.attempts, steps)

    async def _run_attempt(self, work: _Work, cfg: EnvConfig, case: Case, workspace: Path) -> _Run:
        row, sid = work.row, work.row.session_id
        source = source_for(cfg, case, self.s.image_map)
        image: ImageRoot | ImageError | None = None
        if source is not None:  # the image's WORKDIR is the starting workspace (docs/images.md)
            try:
                image = at_workdir(await asyncio.to_thread(resolve, source), cfg)
                await asyncio.to_thread(seed_workspace, image, workspace)
            except (ImageError, OSError) as e:
                image = e if isinstance(e, ImageError) else ImageError(f"{type(e).__name__}: {e}")
        if case.files_dir and own_files(source, cfg):
            shutil.copytree(case.files_dir, workspace, symlinks=True, dirs_exist_ok=True)  # never followed
        request = SimulationStartRequest(
            job_id=row.job_id, session_id=sid, agent_name=cfg.name, agent_id=f"{cfg.name}-{row.sample_index}",
            group_id=row.group_id, gateway_base_url=f"{(self.s.advertise_url or self.s.gateway_url).rstrip('/')}/{sid}",
            model=row.llm_model, temperature=self.s.temperature,
            max_steps=row.max_steps if row.max_steps is not None else -1,
            env_params={**cfg.params, "dataset": case.public_row()},
            metadata={"case_id": case.case_id, "sample_index": row.sample_index, "env_dir": str(cfg.env_dir),
                      "attempt": work.attempt},
            case_id=case.case_id,
        )
        command, harness_log = self._harness_command(row, work.attempt, case)
        if isinstance(image, ImageError):  # the launcher's failure, before the agent ran: never the agent's 0
            ran = RuntimeRun(status="error", setup_failed=True, duration_s=0.0,
                             error_text=f"sandbox setup failed: image: {image}")
        else:
            more = {"image": image} if image is not None else {}
            ran = await self._execute(session_config(cfg, case, self.s.session_timeout_s), request, workspace,
                                      self._runtime_env(cfg, command is None), self.s.sandbox,
                                      command=command, stderr_log=harness_log, **more)
        close_info = await self._close(sid, ran.status)
        status = status_after_close(ran.status, close_info)
        rejected = rejected_summary(close_info)  # e.g. a CLI that retried 401s with a wrong key
        if rejected is not None:
            log.warning("session %s: %s", sid, rejected)
        # a close that answered 0 steps: the gateway reserved none for the session, so none is stored
        steps = [] if close_info.get("total_steps") == 0 else await self.store.trajectory(sid)
        end = classify(status, setup_failed=ran.setup_failed, node_lost=ran.node_lost,
                       limit_exceeded=ran.limit_exceeded, unreachable=ran.gateway_unreachable,
                       close_error=close_info.get("error"), steps=steps,
                       claimed=ran.result.error_class if ran.result else None, error_text=ran.error_text,
                       unrecorded=unrecorded_calls(close_info))
        # a task outcome's reason: the runtime's error text, and a claimed outage the records do not show
        said = ran.error_text if end.infra else end.reason
        errors = [e for e in (said, close_info.get("error"), rejected) if e]
        # the task's tests, on a copy of the final workspace, once the agent has ended (docs/verifiers.md)
        graded = self.s.enable_evaluation and cfg.evaluation != "none"
        in_image = image if isinstance(image, ImageRoot) else None
        verdict = await verify_session(cfg, case, workspace, sid, in_image) if graded and not end.infra else None
        if verdict is not None and verdict.status == "setup_failed":
            end = verifier_setup_failed(verdict.reason)
        return _Run(status, ran, close_info, steps, end, errors, verdict, in_image)

    async def _conclude(self, work: _Work, run: _Run, cfg: EnvConfig, case: Case, workspace: Path,
                        t0: float, started: Any) -> SessionRecord | None:
        """Record the attempt; retry it, or finish the session (evaluated unless the attempt was an
        infrastructure failure: then reward NULL and ``eval_status`` ``infra_error``)."""
        row, n, sid, end = work.row, work.attempt, work.row.session_id, run.end
        duration = time.monotonic() - t0
        self.breaker.record(end.infra)
        if end.outcome in GATEWAY_CLASSES or run.close_info.get("error"):  # even a success whose close failed
            self.breaker.suspect()
        att = SessionAttempt(session_id=sid, attempt=n, job_id=row.job_id, status=run.status, outcome=end.outcome,
                             infra=end.infra, reason=end.reason, step_count=len(run.steps), started_at=started,
                             finished_at=utcnow(), duration_s=duration)
        retries_used = n - work.first
        if end.infra and self.s.retry.retries(end.outcome) and retries_used < self.s.retry.max_retries:
            att.retry_in_s = self.s.retry.delay_s(retries_used + 1, self._rng)
            await self.store.record_attempt(att)
            await self.store.update_job_session(sid, status="retrying", outcome=end.outcome, error_text=end.reason,
                                                duration_s=duration)
            self._tell_failure(sid, n, end, f"retry in {att.retry_in_s:.1f} s")
            work.attempts.append(att)
            work.attempt = n + 1
            self._schedule(work, att.retry_in_s)
            return None
        await self.store.record_attempt(att)
        work.attempts.append(att)
        trajectory = to_trajectory(sid, run.steps)
        evaluation: Evaluation | None = None
        if end.infra:
            self._tell_failure(sid, n, end, "not retried: the session ends not graded")
            status, error_text = "error", end.reason
            eval_status = INFRA_EVAL_STATUS if self.s.enable_evaluation else None
            eval_reason = (f"not graded: infrastructure failure ({end.outcome}) in attempt {n}"
                           if self.s.enable_evaluation else None)
        else:
            status, error_text = run.status, "; ".join(run.errors) or None
            evaluation = await self._evaluate(cfg, case, row, run.runtime, trajectory, workspace, run.verdict,
                                              run.image)
            eval_status = evaluation.status if evaluation else None
            eval_reason = evaluation.reason if evaluation else None
        await keep_workspace(self.store, row, cfg.workspace_archive, workspace)  # what a regrade grades
        result = SessionResult(
            status=cast(FinalStatus, status), outcome=end.outcome, attempts=n, error=error_text,
            duration_s=time.monotonic() - t0,
            runtime_result=run.runtime.result.model_dump(mode="json") if run.runtime and run.runtime.result else None,
            sandbox=run.runtime.sandbox if run.runtime else None,
            reward=evaluation.score if evaluation else None, eval_status=eval_status, eval_reason=eval_reason,
            eval_detail=evaluation.detail() if evaluation else None,
            evaluation=evaluation.model_dump(mode="json") if evaluation else None)
        await self.store.finish_job_session(sid, result)
        return record_of(row, result, trajectory, work.attempts)

    def _harness_command(self, row: JobEnvironment, attempt: int,
                         case: Case) -> tuple[RuntimeCommand | None, Path | None]:
        """For a harness row: the wrapper's command, or the harness's own runtime (with the env's
        code, as the env's runtime sees it) (the harness and install folders bound
        read-only, and the task's solution folder for a harness that uses it: the oracle) and the
        host file that keeps its log; (None, None) for the env's own runtime."""
        if row.harness is None:
            return None, None
        h = self.s.harnesses[row.harness]
        solution = [Path(case.solution_dir)] if h.uses_solution and case.solution_dir else []
        command = RuntimeCommand(argv=h.argv(), folders=[h.folder, h.install_dir, *solution],
                                 env={"PYTHONPATH": str(CODE_ROOT),
                                      **({SOLUTION_ENV: str(solution[0])} if solution else {})},
                                 env_code=h.runtime is not None and not h.uses_solution)  # the solution: as the oracle sees it
        log = (self.s.log_dir.resolve() / "harness" / f"{row.session_id}-a{attempt}.log") if self.s.log_dir else None
        return command, log

    def _runtime_env(self, cfg: EnvConfig, own: bool = True) -> dict[str, str]:
        """The env's extra environment variables (unless ``own`` is false: a harness session),
        plus ``OPENAI_API_KEY`` = the gateway's key when its auth is on (it wins over the env's
        own: only that key opens the gateway)."""
        env = dict(cfg.runtime.env) if own else {}
        if self.s.gateway_api_key:
            env["OPENAI_API_KEY"] = self.s.gateway_api_key
        return env

    async def _cancelled(self, work: _Work, t0: float, started: Any) -> None:
        sid = work.row.session_id
        why = (f"stopped: {self._stop_reason}" if self._stop_reason is not None
               else "cancelled by the user (Ctrl-C)")
        await self._close(sid, "cancelled")
        await self.store.record_attempt(SessionAttempt(
            session_id=sid, attempt=work.attempt, job_id=work.row.job_id, status="cancelled", outcome="cancelled",
            reason=why, started_at=started, finished_at=utcnow(), duration_s=time.monotonic() - t0,
            step_count=len(await self.store.trajectory(sid))))
        await self.store.update_job_session(sid, status="cancelled", finished=False, error_text=why)

    async def _close(self, sid: str, status: str) -> dict[str, Any]:
        """Close the gateway session; returns the gateway's answer, or ``{"error": ...}`` when the
        gateway did not answer or answered with an error."""
        assert self._http is not None
        url = f"{self.s.gateway_url.rstrip('/')}/{sid}/close"
        try:
            async with self._http.post(url, json={"reason": status, "completion_mode": status}) as r:
                if r.status != 200:
                    return {"error": f"closing the gateway session failed: HTTP {r.status}: {(await r.text())[:200]}"}
                return dict(await r.json())
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            return {"error": f"closing the gateway session failed: {type(e).__name__}: {e}"}

    async def _evaluate(self, cfg: EnvConfig, case: Case, row: JobEnvironment, ran: RuntimeRun | None,
                        trajectory: Any, workspace: Path, verdict: VerifierResult | None = None,
                        image: ImageRoot | None = None) -> Evaluation | None:
        """The session's evaluation; a grading failure is attributed by the case's control
        (``rollout.grading.attribution``): the agent's 0, or ``grader_broken``; for a session in
        ``image``, the control starts from the image's WORKDIR and its tests run in the image."""
        if not self.s.enable_evaluation:
            return None
        done = await self._grade(cfg, case, row, ran.result if ran else None, trajectory, workspace, verdict)
        if done is None:
            return None

        async def grade_control(start: Path) -> Evaluation:
            if image is not None:
                await asyncio.to_thread(_image_start, image, start, own_files(source_for(cfg, case), cfg))
            control = await verify_session(cfg, case, start, f"{row.session_id}-control", image) \
                if case.tests_dir else None
            graded = await self._grade(cfg, case, row, None, to_trajectory(row.session_id, []), start, control)
            return graded or Evaluation(status="error", score=0.0, reason="the control was not graded")

        done = await self._controls.judge(done, case, grade_control)
        if done.status == GRADER_BROKEN:
            self._grader_broken(cfg.name, done.reason)
        return done

    def _grader_broken(self, env_name: str, reason: str | None) -> None:
        """Count a broken-grader finding; the job stops (resumable) once ``max_broken_graders``
        are found."""
        self._broken[env_name] += 1
        n = sum(self._broken.values())
        log.error("env %s: %s", env_name, reason)
        limit = self.s.max_broken_graders
        if limit and n >= limit and self._stop_when_told is None:
            why = (f"{n} broken-grader finding(s) ({', '.join(f'{e}: {k}' for e, k in sorted(self._broken.items()))}):"
                   f" the grader fails without the agent; fix it, then --regrade --job-id {self.s.job_id} (its sessions) and"
                   f" --resume --job-id {self.s.job_id} (the rest) (--max-broken-graders {limit})")
            self._stop_when_told = why  # once this session's record is out (``_worker``)

    async def _grade(self, cfg: EnvConfig, case: Case, row: JobEnvironment, start: SimulationStartResult | None,
                     trajectory: Any, workspace: Path, verdict: VerifierResult | None) -> Evaluation | None:
        path = self._evaluator(cfg)
        if verdict is not None and (path is None or verdict.status not in ("rewarded", "no_reward")):
            return verifier_outcome(verdict)  # the tests' reward is the score; a timeout a grading failure
        if self._grader is None or path is None:
            return None
        spec = self._specs.get((cfg.name, path))
        if spec is None:  # built once per env and evaluator file (it resolves the path)
            spec = self._specs[(cfg.name, path)] = build_eval_spec(cfg.name, path, self.s.eval_timeout_s)
        request = EvalRequest(
            job_id=row.job_id, session_id=row.session_id, env_name=cfg.name, case_id=case.case_id,
            group_id=row.group_id, sample_index=row.sample_index, model=row.llm_model,
            env_params={**cfg.params, "dataset": case.row}, start_result=start,
            verifier=verdict.for_evaluator() if verdict else None,
        )
        return await self._grader.evaluate(path, request, spec, trajectory, workspace,
                                           grader_mode(cfg, self._grader_job_mode()),
                                           GraderLimits(memory_mb=cfg.grader.memory_mb, processes=cfg.grader.processes))
