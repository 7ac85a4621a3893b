"""The scheduler: turns envs x cases x samples into sessions and runs exactly ``pool_size`` of
them at once.

Per session: a ``job_environments`` row, a runtime in a fresh temporary workspace (``files/`` of a
task copied in), the gateway session closed, then (optionally) evaluation, then the row finished
with the score written back as the reward of the last step. Ctrl-C cancels the sessions in flight:
each runtime's process group is killed, its gateway session closed, its row marked ``cancelled``
and left unfinished (so ``--resume`` runs it again); nothing is half-written.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from rollout.envs import Case, EnvConfig
from rollout.evaluation import EvalOutcome, build_eval_spec, run_evaluation
from rollout.evaluator_loader import discover_evaluator
from rollout.protocol import EvalRequest, SimulationStartRequest
from rollout.records import record_of
from rollout.report import SessionRecord
from rollout.runtime_local import RuntimeOutcome, run_local
from rollout.services import auth_headers
from rollout.trajectory import to_trajectory
from rollout.workspace_archive import keep_workspace
from store import JobEnvironment, Store, utcnow

log = logging.getLogger(__name__)

# job_environments.status values that mean the harness failed (not the agent): exit code 2
HARNESS_FAILURES = frozenset({"error", "timeout"})


@dataclass(frozen=True)
class RunSettings:
    """Job-wide settings: the route key, temperature (None = route default), step budget override
    (None = the env's ``max_steps``), concurrency, evaluation switch and timeout (seconds), and
    the folder that holds the sessions' workspaces (None: the system temp folder), and the
    gateway's API key (None: its auth is off): sent on the launcher's own calls (session close)
    and given to each runtime as ``OPENAI_API_KEY`` (what the openai SDK reads; a runtime using
    another client can read ``GATEWAY_API_KEY``, which it inherits when set)."""

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


def session_rows(job_id: str, model: str, envs: list[tuple[EnvConfig, list[Case]]], group_size: int,
                 max_steps: int | None) -> list[JobEnvironment]:
    """One ``job_environments`` row per (env, case, sample). The ``group_id`` of a case's samples is
    shared (uuid5 of job, env and case); session ids are random uuid4 hex."""
    rows: list[JobEnvironment] = []
    for cfg, cases in envs:
        for case in cases:
            group = uuid.uuid5(uuid.NAMESPACE_URL, f"{job_id}/{cfg.name}/{case.case_id}").hex[:16]
            for k in range(group_size):
                rows.append(JobEnvironment(
                    env_id=uuid.uuid4().hex, job_id=job_id, env_name=cfg.name, case_id=case.case_id,
                    llm_model=model, group_id=group, sample_index=k,
                    env_params={**cfg.params, "dataset": case.row}, status="pending",
                    max_steps=max_steps if max_steps is not None else cfg.max_steps,
                ))
    return rows


class Scheduler:
    """Runs a job's session rows with ``pool_size`` workers. ``envs`` maps env name to config,
    ``cases`` maps (env name, case id) to the case. ``on_done`` is called with each record."""

    def __init__(self, store: Store, settings: RunSettings, envs: dict[str, EnvConfig],
                 cases: dict[tuple[str, str], Case], on_done: Callable[[SessionRecord], None] | None = None) -> None:
        self.store = store
        self.s = settings
        self.envs = envs
        self.cases = cases
        self.on_done = on_done
        self.records: list[SessionRecord] = []
        self._http: httpx.AsyncClient | None = None

    async def run(self, rows: list[JobEnvironment]) -> list[SessionRecord]:
        """Run every row; returns one record per finished session (cancelled ones are absent).
        Cancelling this coroutine cancels the sessions in flight cleanly."""
        queue: asyncio.Queue[JobEnvironment] = asyncio.Queue()
        for r in rows:
            queue.put_nowait(r)
        async with httpx.AsyncClient(timeout=httpx.Timeout(30, read=120),  # close may wait for calls in flight
                                     headers=auth_headers(self.s.gateway_api_key)) as http:
            self._http = http
            workers = [asyncio.create_task(self._worker(queue), name=f"worker-{i}")
                       for i in range(min(self.s.pool_size, max(1, len(rows))))]
            try:
                await asyncio.gather(*workers)
            finally:
                for w in workers:
                    w.cancel()
                await asyncio.gather(*workers, return_exceptions=True)
        return self.records

    async def _worker(self, queue: asyncio.Queue[JobEnvironment]) -> None:
        while True:
            try:
                row = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            record = await self.run_session(row)
            self.records.append(record)
            if self.on_done:
                self.on_done(record)

    async def run_session(self, row: JobEnvironment) -> SessionRecord:
        """Run one session end to end (see the module docstring) and return its record."""
        cfg = self.envs[row.env_name]
        case = self.cases[(row.env_name, row.case_id)]
        sid = row.env_id
        t0 = time.monotonic()
        await self.store.update_job_session(sid, status="running", attempts=row.attempts + 1, started_at=utcnow(),
                                            finished=False)
        workspace = Path(tempfile.mkdtemp(prefix=f"{cfg.name}-{row.case_id}-{row.sample_index}-"[:60],
                                          dir=self.s.workspace_root))
        try:
            if case.files_dir:
                shutil.copytree(case.files_dir, workspace, dirs_exist_ok=True)
            request = SimulationStartRequest(
                job_id=row.job_id, session_id=sid, agent_name=cfg.name, agent_id=f"{cfg.name}-{row.sample_index}",
                group_id=row.group_id, gateway_base_url=f"{self.s.gateway_url.rstrip('/')}/{sid}",
                model=row.llm_model, temperature=self.s.temperature,
                max_steps=row.max_steps if row.max_steps is not None else -1,
                env_params={**cfg.params, "dataset": case.public_row()},
                metadata={"case_id": case.case_id, "sample_index": row.sample_index, "env_dir": str(cfg.env_dir)},
            )
            try:
                outcome = await run_local(cfg.command(), request, workspace, cfg.runtime.timeout_s,
                                          self._runtime_env(cfg))
            except OSError as e:
                outcome = RuntimeOutcome(status="error", duration_s=time.monotonic() - t0, setup_failed=True,
                                         error_text=f"cannot start runtime {cfg.command()[:3]}: {e}")
            close_info = await self._close(sid, outcome.status)
            status = outcome.status
            if status == "succeeded" and close_info.get("truncated"):
                status = "truncated"
            errors = [e for e in (outcome.error_text, close_info.get("error")) if e]
            steps = await self.store.trajectory(sid)
            trajectory = to_trajectory(sid, steps)
            evaluation = await self._evaluate(cfg, case, row, outcome, trajectory, workspace)
            await keep_workspace(self.store, row, cfg.workspace_archive, workspace)  # what a regrade grades
            duration = time.monotonic() - t0
            final = {
                "status": status, "result": outcome.result.model_dump(mode="json") if outcome.result else None,
                "error_text": "; ".join(errors) or None, "duration_s": duration,
                "eval_status": evaluation.status if evaluation else None,
                "eval_reason": evaluation.reason if evaluation else None,
                "eval_detail": {"raw_repr": evaluation.raw_repr, "artifacts": evaluation.artifacts}
                if evaluation else None,
            }
            reward = evaluation.score if evaluation else None
            await self.store.finish_job_session(
                sid, reward=reward, eval_meta=evaluation.model_dump(mode="json") if evaluation else None, **final)
            return record_of(row.model_copy(update={**final, "reward": reward, "finished": True}), trajectory)
        except asyncio.CancelledError:
            # finish the bookkeeping even if cancelled again meanwhile: nothing half-written
            cleanup = asyncio.ensure_future(self._cancelled(sid))
            while not cleanup.done():
                try:
                    await asyncio.shield(cleanup)
                except asyncio.CancelledError:
                    continue
            raise
        except Exception as e:  # a harness bug must fail this session only, with its reason recorded
            log.exception("session %s failed in the launcher", sid)
            final = {"status": "error", "error_text": f"launcher error: {type(e).__name__}: {e}",
                     "duration_s": time.monotonic() - t0}
            await self.store.finish_job_session(sid, reward=None, eval_meta=None, **final)
            steps = await self.store.trajectory(sid)
            return record_of(row.model_copy(update={**final, "finished": True}), to_trajectory(sid, steps))
        finally:
            if not self.s.keep_workspaces:
                shutil.rmtree(workspace, ignore_errors=True)

    def _runtime_env(self, cfg: EnvConfig) -> dict[str, str]:
        """The env's extra environment variables, plus ``OPENAI_API_KEY`` = the gateway's key
        when its auth is on (it wins over the env's own: only that key opens the gateway)."""
        env = dict(cfg.runtime.env)
        if self.s.gateway_api_key:
            env["OPENAI_API_KEY"] = self.s.gateway_api_key
        return env

    async def _cancelled(self, sid: str) -> None:
        await self._close(sid, "cancelled")
        await self.store.update_job_session(sid, status="cancelled", finished=False,
                                            error_text="cancelled by the user (Ctrl-C)")

    async def _close(self, sid: str, status: str) -> dict[str, Any]:
        """Close the gateway session; returns the gateway's answer, or ``{"error": ...}``."""
        assert self._http is not None
        url = f"{self.s.gateway_url.rstrip('/')}/{sid}/close"
        try:
            r = await self._http.post(url, json={"reason": status, "completion_mode": status})
        except httpx.HTTPError as e:
            return {"error": f"closing the gateway session failed: {type(e).__name__}: {e}"}
        if r.status_code != 200:
            return {"error": f"closing the gateway session failed: HTTP {r.status_code}: {r.text[:200]}"}
        return dict(r.json())

    async def _evaluate(self, cfg: EnvConfig, case: Case, row: JobEnvironment, outcome: RuntimeOutcome,
                        trajectory: Any, workspace: Path) -> EvalOutcome | None:
        if not self.s.enable_evaluation:
            return None
        path = discover_evaluator(self.s.agent_root, cfg.name)
        if path is None:
            path = discover_evaluator(cfg.env_dir.parent, cfg.name)
        if path is None:
            return None
        request = EvalRequest(
            job_id=row.job_id, session_id=row.env_id, env_name=cfg.name, case_id=case.case_id,
            group_id=row.group_id, sample_index=row.sample_index, model=row.llm_model,
            env_params={**cfg.params, "dataset": case.row}, start_result=outcome.result, workspace=str(workspace),
        )
        spec = build_eval_spec(cfg.name, path, self.s.eval_timeout_s)
        return await run_evaluation(path, request, spec, trajectory)
