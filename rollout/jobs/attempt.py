"""One attempt of a session, from a fresh workspace to its end: the runtime run (the task's files
copied in, in its image when it has one), the gateway session closed, the end classified
(``rollout.core.outcomes``: from the launcher's and the gateway's records, never from what the
runtime reports), then either a retry (an infrastructure failure, its steps archived first) or
the session finished: graded (optional; a grading failure attributed by the case's control), the
row finished with the score written back as the reward of the last step. A cancelled attempt's
runtime is killed, its gateway session closed, its row marked ``cancelled`` and left unfinished
(``--resume`` runs it again); nothing is half-written. ``rollout.jobs.pool`` runs attempts.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import re
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

from rollout.contract.protocol import EvalRequest, EvalSpec, SimulationStartRequest, SimulationStartResult
from rollout.core.envs import Case, EnvConfig, session_config
from rollout.core.outcomes import (
    GATEWAY_CLASSES,
    INFRA_EVAL_STATUS,
    AttemptEnd,
    classify,
    status_after_close,
    verifier_setup_failed,
)
from rollout.core.plan import session_case
from rollout.core.trees import remove_tree
from rollout.grading.attribution import Controls
from rollout.grading.evaluation import Evaluation, build_eval_spec
from rollout.grading.evaluator_loader import env_evaluator
from rollout.grading.grader import Grader, grader_mode
from rollout.grading.sandbox import GraderLimits
from rollout.grading.trajectory import to_trajectory
from rollout.grading.verifier import VerifierResult, verifier_outcome, verify_session
from rollout.jobs.options import JobContext, JobOptions
from rollout.jobs.workspace_archive import keep_workspace
from rollout.results.records import record_of
from rollout.results.report import SessionRecord
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
from rollout.sandbox.runtime_local import RuntimeRun
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
    stderr_log=, image=, changes=) -> RuntimeRun``, the arguments and contract of ``rollout.sandbox.runner.run_runtime``
    (the local executor); the workspace holds the final workspace when it returns.
    ``rollout.jobs.ray_backend.RayExecutor`` runs it on a Ray node instead."""

    def __call__(
        self,
        cfg: EnvConfig,
        request: SimulationStartRequest,
        workspace: Path,
        extra_env: dict[str, str],
        job_mode: str = "bwrap",
        *,
        command: RuntimeCommand | None = None,
        stderr_log: Path | None = None,
        image: ImageRoot | None = None,
        changes: Path | None = None,
    ) -> Awaitable[RuntimeRun]: ...


class SessionCloser(Protocol):
    """Closes a gateway session: the gateway's answer, or ``{"error": ...}``
    (``rollout.jobs.gateway_client.GatewayClient``)."""

    def close(self, sid: str, status: str) -> Awaitable[dict[str, Any]]: ...


class BreakerFeed(Protocol):
    """What an attempt tells the circuit breaker (``rollout.jobs.breaker.CircuitBreaker``)."""

    def record(self, infra: bool) -> None: ...

    def suspect(self) -> None: ...


class _NoBreaker:
    def record(self, infra: bool) -> None:
        return None

    def suspect(self) -> None:
        return None


_MAX_CLOSE_FAILURES = 5  # a retry whose gateway session cannot be closed this often is given up


@dataclass(frozen=True)
class Retry:
    """The attempt did not finish the session: run the next attempt after ``delay_s`` seconds."""

    delay_s: float


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
class Work:
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


def _detail(evaluation: Evaluation | None, verdict: VerifierResult | None) -> dict[str, Any] | None:
    """``eval_detail`` of a session: the evaluation's, and where its tests ran (``verifier_container``)."""
    if evaluation is None:
        return None
    detail = evaluation.detail()
    return {**detail, "verifier_container": verdict.container} if verdict is not None else detail


def _drop_layer(folder: Path) -> None:
    left = remove_tree(folder)
    if left is not None:
        log.warning("a session's kept copy-on-write layer %s was not removed: %s", folder, left)


@dataclass
class AttemptRun:
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
    image_failed: bool = False  # its image could not be had (built, pulled, unpacked): kept for the job


FAILURES_TOLD = 3
"""Infrastructure failures of each class logged as warnings (later ones at INFO)."""


def workspace_prefix(env: str, case_id: str, sample_index: int) -> str:
    """The name prefix of a session's workspace folder: env, case and sample, with every character
    but letters, digits, ``.``, ``_`` and ``-`` as ``_`` (a case id such as ``django/django-11099``
    is not a path), at most 60 characters."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", f"{env}-{case_id}-{sample_index}-")[:60]


class Attempts:
    """Runs attempts of a job's sessions (one :meth:`run` per attempt, any number at once).
    ``envs`` maps env name to config; each session's case is its row's dataset row. ``gateway``
    closes sessions, ``breaker`` is told each end, ``executor`` runs the runtime (default:
    ``run_runtime``, on this machine), ``grader`` grades (None: ungraded, or set later by the
    pool), ``on_grader_broken(env, reason)`` hears each broken-grader finding. ``stop_reason``
    (set by the pool) is what a cancelled attempt records as why."""

    def __init__(
        self,
        store: Store,
        opts: JobOptions,
        ctx: JobContext,
        envs: Mapping[str, EnvConfig],
        gateway: SessionCloser,
        *,
        breaker: BreakerFeed | None = None,
        executor: Executor | None = None,
        grader: Grader | None = None,
        rng: random.Random | None = None,
        on_grader_broken: Callable[[str, str | None], None] | None = None,
    ) -> None:
        self.store = store
        self.opts = opts
        self.ctx = ctx
        self.envs = envs
        self.gateway = gateway
        self.breaker: BreakerFeed = breaker or _NoBreaker()
        self.grader = grader
        self.retry = opts.retry_policy()
        self.stop_reason: str | None = None
        self._execute: Executor = executor or run_runtime
        self._rng = rng or random.Random()
        self._on_grader_broken = on_grader_broken
        self._failures_told: Counter[str] = Counter()
        self._specs: dict[tuple[str, Path], EvalSpec] = {}
        self._evaluators: dict[str, Path | None] = {}
        self._controls = Controls(ctx.workspace_root)
        self._files: ThreadPoolExecutor | None = None
        self._removals: set[asyncio.Future[None]] = set()

    def evaluator(self, cfg: EnvConfig) -> Path | None:
        """The env's ``rule_evaluator.py`` (under the agent root, else beside the env's folder),
        looked up once per job."""
        if cfg.name not in self._evaluators:
            self._evaluators[cfg.name] = env_evaluator(self.opts.agent_root, cfg)
        return self._evaluators[cfg.name]

    async def aclose(self) -> None:
        """Wait for the workspace removals and the controls' work still running."""
        await self._controls.aclose()
        await asyncio.shield(asyncio.gather(*self._removals, return_exceptions=True))
        if self._files is not None:
            self._files.shutdown(wait=True)
            self._files = None

    def _remove_later(self, workspace: Path) -> None:
        """Delete a finished session's workspace in a file thread: an ``rmdir`` can stall for
        milliseconds on a busy disk, which must hold up neither the event loop nor the caller
        (``aclose`` waits for every removal)."""
        if self._files is None:
            self._files = ThreadPoolExecutor(1, thread_name_prefix="attempt-files")
        fut = asyncio.get_running_loop().run_in_executor(self._files, remove_workspace, workspace)
        self._removals.add(fut)
        fut.add_done_callback(self._removals.discard)

    async def run(self, work: Work) -> SessionRecord | Retry:
        """Run the next attempt of ``work``'s session (see the module docstring): its record when
        the session is finished, else when to run the next attempt."""
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
                return Retry(self.retry.delay_s(work.close_failures, self._rng))
        t0 = time.monotonic()
        started = utcnow()
        workspace = Path(
            tempfile.mkdtemp(
                prefix=workspace_prefix(cfg.name, row.case_id, row.sample_index), dir=self.ctx.workspace_root
            )
        )
        concluded: list[SessionRecord] = []  # once the session's end is written: a stop no longer undoes it
        try:
            try:
                # under the cancellation's cleanup: a stop arriving during this write leaves the
                # session cancelled (resumable), never "running" with no attempt
                await self.store.update_job_session(
                    sid, status="running", attempts=n, started_at=started, finished=False
                )
                run = await self._run_attempt(work, cfg, case, workspace)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a launcher bug must fail this attempt only, with its reason recorded
                log.exception("session %s failed in the launcher", sid)
                why = f"launcher error: {type(e).__name__}: {e}"
                run = AttemptRun(
                    "error",
                    None,
                    {},
                    await self.store.trajectory(sid),
                    AttemptEnd("launcher_error", True, why),
                    [why],
                )
            return await self._conclude(work, run, cfg, case, workspace, t0, started, concluded)
        except asyncio.CancelledError:
            if concluded:  # graded and written before the stop reached it: it stays as it ended
                raise
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
            result = SessionResult(
                status="error", outcome="launcher_error", attempts=n, error=why, duration_s=duration
            )
            await self.store.record_attempt(
                SessionAttempt(
                    session_id=sid,
                    attempt=n,
                    job_id=row.job_id,
                    status="error",
                    outcome="launcher_error",
                    infra=True,
                    reason=why,
                    started_at=started,
                    finished_at=utcnow(),
                    duration_s=duration,
                )
            )
            await self.store.finish_job_session(sid, result)
            steps = await self.store.trajectory(sid)
            attempts = (await self.store.job_attempts(row.job_id)).get(sid, [])
            return record_of(row, result, to_trajectory(sid, steps), attempts, steps)
        finally:
            if not self.opts.keep_workspaces:
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

    async def _prepare_retry(self, work: Work) -> str | None:
        """Before attempt ``n`` > 1: close the gateway session (again: idempotent, and the close
        of a failed attempt may not have reached the gateway), then archive the previous attempt's
        steps under ``<sid>~a<n-1>`` and drop the gateway's state so the budget starts afresh.
        Returns None when the attempt may start, else why not (the close failed: the caller
        queues the work again after a backoff, using no attempt)."""
        sid, prev = work.row.session_id, work.attempt - 1
        close = await self.gateway.close(sid, "retry")
        if close.get("error"):
            return str(close["error"])
        moved = await self.store.reset_for_retry(sid, prev)
        if not any(a.attempt == prev for a in work.attempts):  # the launcher was stopped during it
            att = SessionAttempt(
                session_id=sid,
                attempt=prev,
                job_id=work.row.job_id,
                status="cancelled",  # its runtime's end is unknown: the session's "running" was stale
                outcome="interrupted",
                reason="the launcher stopped during this attempt",
                step_count=moved,
            )
            if await self.store.record_attempt(att, if_missing=True):
                work.attempts.append(att)
        return None

    async def _give_up(self, work: Work, why: str) -> SessionRecord:
        """Finish a session whose retry could not be prepared (its gateway session cannot be
        closed): an infrastructure failure, never graded."""
        row, sid = work.row, work.row.session_id
        result = SessionResult(
            status="error",
            outcome="gateway_unreachable",
            attempts=work.attempt - 1,
            error=f"the retry could not start ({_MAX_CLOSE_FAILURES + 1} tries): {why}",
            eval_status=INFRA_EVAL_STATUS if self.opts.enable_evaluation else None,
            eval_reason=(
                f"not graded: infrastructure failure (gateway_unreachable) in attempt {work.attempt - 1}"
                if self.opts.enable_evaluation
                else None
            ),
        )
        await self.store.finish_job_session(sid, result)
        steps = await self.store.trajectory(sid)
        return record_of(row, result, to_trajectory(sid, steps), work.attempts, steps)

    async def _run_attempt(self, work: Work, cfg: EnvConfig, case: Case, workspace: Path) -> AttemptRun:
        """One attempt's runtime and verifier; with ``dataset.same_container`` a session in an
        image keeps its copy-on-write layer in a scratch folder until its verifier has run."""
        if not cfg.dataset.same_container:
            return await self._attempt_in(work, cfg, case, workspace, None)
        changes = Path(tempfile.mkdtemp(prefix="rollout-layer-"))
        try:
            return await self._attempt_in(work, cfg, case, workspace, changes)
        finally:
            await asyncio.shield(asyncio.to_thread(_drop_layer, changes))

    async def _attempt_in(
        self, work: Work, cfg: EnvConfig, case: Case, workspace: Path, changes: Path | None
    ) -> AttemptRun:
        row, sid = work.row, work.row.session_id
        source = source_for(cfg, case, self.opts.image_map())
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
            job_id=row.job_id,
            session_id=sid,
            agent_name=cfg.name,
            agent_id=f"{cfg.name}-{row.sample_index}",
            group_id=row.group_id,
            gateway_base_url=f"{self.ctx.session_base_url}/{sid}",
            model=row.llm_model,
            temperature=self.opts.llm_temperature,
            max_steps=row.max_steps if row.max_steps is not None else -1,
            env_params={**cfg.params, "dataset": case.public_row()},
            metadata={
                "case_id": case.case_id,
                "sample_index": row.sample_index,
                "env_dir": str(cfg.env_dir),
                "attempt": work.attempt,
            },
            case_id=case.case_id,
        )
        command, harness_log = self._harness_command(row, work.attempt, case)
        if isinstance(image, ImageError):  # the launcher's failure, before the agent ran: never the agent's 0
            ran = RuntimeRun(
                status="error",
                setup_failed=True,
                duration_s=0.0,
                error_text=f"sandbox setup failed: image: {image}",
            )
        else:
            more: dict[str, Any] = {"image": image} if image is not None else {}
            if image is not None and changes is not None:
                more["changes"] = changes
            ran = await self._execute(
                session_config(cfg, case, self.opts.timeout),
                request,
                workspace,
                self._runtime_env(cfg, command is None),
                self.opts.sandbox,
                command=command,
                stderr_log=harness_log,
                **more,
            )
        close_info = await self.gateway.close(sid, ran.status)
        status = status_after_close(ran.status, close_info)
        rejected = rejected_summary(close_info)  # e.g. a CLI that retried 401s with a wrong key
        if rejected is not None:
            log.warning("session %s: %s", sid, rejected)
        # a close that answered 0 steps: the gateway reserved none for the session, so none is stored
        steps = [] if close_info.get("total_steps") == 0 else await self.store.trajectory(sid)
        end = classify(
            status,
            setup_failed=ran.setup_failed,
            node_lost=ran.node_lost,
            limit_exceeded=ran.limit_exceeded,
            unreachable=ran.gateway_unreachable,
            close_error=close_info.get("error"),
            steps=steps,
            claimed=ran.result.error_class if ran.result else None,
            error_text=ran.error_text,
            unrecorded=unrecorded_calls(close_info),
        )
        # a task outcome's reason: the runtime's error text, and a claimed outage the records do not show
        said = ran.error_text if end.infra else end.reason
        errors = [e for e in (said, close_info.get("error"), rejected) if e]
        # the task's tests, on a copy of the final workspace, once the agent has ended (docs/verifiers.md)
        graded = self.opts.enable_evaluation and cfg.evaluation != "none"
        in_image = image if isinstance(image, ImageRoot) else None
        verdict = (
            await verify_session(cfg, case, workspace, sid, in_image, changes if in_image else None)
            if graded and not end.infra
            else None
        )
        if verdict is not None and verdict.status == "setup_failed":
            end = verifier_setup_failed(verdict.reason)
        return AttemptRun(
            status, ran, close_info, steps, end, errors, verdict, in_image, isinstance(image, ImageError)
        )

    async def _conclude(
        self,
        work: Work,
        run: AttemptRun,
        cfg: EnvConfig,
        case: Case,
        workspace: Path,
        t0: float,
        started: Any,
        concluded: list[SessionRecord],
    ) -> SessionRecord | Retry:
        """Record the attempt; retry it, or finish the session (evaluated unless the attempt was an
        infrastructure failure: then reward NULL and ``eval_status`` ``infra_error``). Once the
        evaluation is made, the session's end is written whole even when the job stops meanwhile
        (``concluded`` then holds its record, and the stop's CancelledError is raised after it)."""
        row, n, sid, end = work.row, work.attempt, work.row.session_id, run.end
        duration = time.monotonic() - t0
        if not run.image_failed:  # a task's image says nothing of the gateway's health
            self.breaker.record(end.infra)
        if end.outcome in GATEWAY_CLASSES or run.close_info.get("error"):  # even a success whose close failed
            self.breaker.suspect()
        att = SessionAttempt(
            session_id=sid,
            attempt=n,
            job_id=row.job_id,
            status=run.status,
            outcome=end.outcome,
            infra=end.infra,
            reason=end.reason,
            step_count=len(run.steps),
            started_at=started,
            finished_at=utcnow(),
            duration_s=duration,
        )
        retries_used = n - work.first
        if (
            end.infra
            and not run.image_failed  # the job keeps the failure: a retry would get it again
            and self.retry.retries(end.outcome)
            and retries_used < self.retry.max_retries
        ):
            att.retry_in_s = self.retry.delay_s(retries_used + 1, self._rng)
            await self.store.record_attempt(att)
            await self.store.update_job_session(
                sid, status="retrying", outcome=end.outcome, error_text=end.reason, duration_s=duration
            )
            self._tell_failure(sid, n, end, f"retry in {att.retry_in_s:.1f} s")
            work.attempts.append(att)
            work.attempt = n + 1
            return Retry(att.retry_in_s)
        await self.store.record_attempt(att)
        work.attempts.append(att)
        trajectory = to_trajectory(sid, run.steps)
        evaluation: Evaluation | None = None
        if end.infra:
            self._tell_failure(sid, n, end, "not retried: the session ends not graded")
            status, error_text = "error", end.reason
            eval_status = INFRA_EVAL_STATUS if self.opts.enable_evaluation else None
            eval_reason = (
                f"not graded: infrastructure failure ({end.outcome}) in attempt {n}"
                if self.opts.enable_evaluation
                else None
            )
        else:
            status, error_text = run.status, "; ".join(run.errors) or None
            evaluation = await self._evaluate(
                cfg, case, row, run.runtime, trajectory, workspace, run.verdict, run.image
            )
            eval_status = evaluation.status if evaluation else None
            eval_reason = evaluation.reason if evaluation else None

        async def finish() -> SessionRecord:
            await keep_workspace(self.store, row, cfg.workspace_archive, workspace)  # what a regrade grades
            result = SessionResult(
                status=cast(FinalStatus, status),
                outcome=end.outcome,
                attempts=n,
                error=error_text,
                duration_s=time.monotonic() - t0,
                runtime_result=run.runtime.result.model_dump(mode="json")
                if run.runtime and run.runtime.result
                else None,
                sandbox=run.runtime.sandbox if run.runtime else None,
                reward=evaluation.score if evaluation else None,
                eval_status=eval_status,
                eval_reason=eval_reason,
                eval_detail=_detail(evaluation, run.verdict),
                evaluation=evaluation.model_dump(mode="json") if evaluation else None,
            )
            await self.store.finish_job_session(sid, result)
            return record_of(row, result, trajectory, work.attempts)

        writing = asyncio.ensure_future(finish())
        stopped = False
        while not writing.done():  # the end written whole: a stop waits for it (a short write)
            try:
                await asyncio.shield(writing)
            except asyncio.CancelledError:
                stopped = True
        if stopped:
            if writing.exception() is None:
                concluded.append(writing.result())
            else:  # not written: the session is left cancelled, resumable
                log.error("session %s: its end could not be written: %r", sid, writing.exception())
            raise asyncio.CancelledError
        record = writing.result()
        concluded.append(record)
        return record

    def _harness_command(
        self, row: JobEnvironment, attempt: int, case: Case
    ) -> tuple[RuntimeCommand | None, Path | None]:
        """For a harness row: the wrapper's command, or the harness's own runtime (with the env's
        code, as the env's runtime sees it) (the harness and install folders bound
        read-only, and the task's solution folder for a harness that uses it: the oracle) and the
        host file that keeps its log; (None, None) for the env's own runtime."""
        if row.harness is None:
            return None, None
        h = self.ctx.harnesses[row.harness]
        command = RuntimeCommand(
            argv=h.argv(),
            folders=[h.folder, h.install_dir],
            env={"PYTHONPATH": str(CODE_ROOT)},
            env_code=h.runtime is not None and not h.uses_solution,
            solution=Path(case.solution_dir) if h.uses_solution and case.solution_dir else None,
        )  # the solution: at /solution, as Harbor's oracle has it
        log = (
            (self.ctx.log_dir.resolve() / "harness" / f"{row.session_id}-a{attempt}.log")
            if self.ctx.log_dir
            else None
        )
        return command, log

    def _runtime_env(self, cfg: EnvConfig, own: bool = True) -> dict[str, str]:
        """The env's extra environment variables (unless ``own`` is false: a harness session),
        plus ``OPENAI_API_KEY`` = the gateway's key when its auth is on (it wins over the env's
        own: only that key opens the gateway)."""
        env = dict(cfg.runtime.env) if own else {}
        if self.ctx.gateway_api_key:
            env["OPENAI_API_KEY"] = self.ctx.gateway_api_key
        return env

    async def _cancelled(self, work: Work, t0: float, started: Any) -> None:
        sid = work.row.session_id
        why = (
            f"stopped: {self.stop_reason}"
            if self.stop_reason is not None
            else "cancelled by the user (Ctrl-C)"
        )
        await self.gateway.close(sid, "cancelled")
        await self.store.record_attempt(
            SessionAttempt(
                session_id=sid,
                attempt=work.attempt,
                job_id=work.row.job_id,
                status="cancelled",
                outcome="cancelled",
                reason=why,
                started_at=started,
                finished_at=utcnow(),
                duration_s=time.monotonic() - t0,
                step_count=len(await self.store.trajectory(sid)),
            )
        )
        await self.store.update_job_session(sid, status="cancelled", finished=False, error_text=why)

    async def _evaluate(
        self,
        cfg: EnvConfig,
        case: Case,
        row: JobEnvironment,
        ran: RuntimeRun | None,
        trajectory: Any,
        workspace: Path,
        verdict: VerifierResult | None = None,
        image: ImageRoot | None = None,
    ) -> Evaluation | None:
        """The session's evaluation; a grading failure is attributed by the case's control
        (``rollout.grading.attribution``): the agent's 0, or ``grader_broken``; for a session in
        ``image``, the control starts from the image's WORKDIR and its tests run in the image."""
        if not self.opts.enable_evaluation:
            return None
        done = await self._grade(cfg, case, row, ran.result if ran else None, trajectory, workspace, verdict)
        if done is None:
            return None

        async def grade_control(start: Path) -> Evaluation:
            if image is not None:
                await asyncio.to_thread(_image_start, image, start, own_files(source_for(cfg, case), cfg))
            control = (
                await verify_session(cfg, case, start, f"{row.session_id}-control", image)
                if case.tests_dir
                else None
            )
            graded = await self._grade(
                cfg, case, row, None, to_trajectory(row.session_id, []), start, control
            )
            return graded or Evaluation(status="error", score=0.0, reason="the control was not graded")

        done = await self._controls.judge(done, case, grade_control)
        if done.status == GRADER_BROKEN:
            log.error("env %s, case %s, session %s: %s", cfg.name, case.case_id, row.session_id, done.reason)
            if self._on_grader_broken is not None:
                self._on_grader_broken(cfg.name, done.reason)
        return done

    async def _grade(
        self,
        cfg: EnvConfig,
        case: Case,
        row: JobEnvironment,
        start: SimulationStartResult | None,
        trajectory: Any,
        workspace: Path,
        verdict: VerifierResult | None,
    ) -> Evaluation | None:
        path = self.evaluator(cfg)
        if verdict is not None and (path is None or verdict.status not in ("rewarded", "no_reward")):
            return verifier_outcome(verdict)  # the tests' reward is the score; a timeout a grading failure
        if self.grader is None or path is None:
            return None
        spec = self._specs.get((cfg.name, path))
        if spec is None:  # built once per env and evaluator file (it resolves the path)
            spec = self._specs[(cfg.name, path)] = build_eval_spec(cfg.name, path, self.opts.eval_timeout)
        request = EvalRequest(
            job_id=row.job_id,
            session_id=row.session_id,
            env_name=cfg.name,
            case_id=case.case_id,
            group_id=row.group_id,
            sample_index=row.sample_index,
            model=row.llm_model,
            env_params={**cfg.params, "dataset": case.row},
            start_result=start,
            verifier=verdict.for_evaluator() if verdict else None,
        )
        return await self.grader.evaluate(
            path,
            request,
            spec,
            trajectory,
            workspace,
            grader_mode(cfg, self.opts.grader_job_mode()),
            GraderLimits(memory_mb=cfg.grader.memory_mb, processes=cfg.grader.processes),
        )
