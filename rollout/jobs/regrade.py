"""Regrade a finished job: run each env's current ``rule_evaluator.py`` again on what the store
kept (trajectory, start result, case row, final workspace), with no runtime and no model call.

Evaluation goes through a ``rollout.grading.Grader``, as in a run (grader sandbox, timeout, score rule, clamp and
error outcomes as a run). The new evaluation replaces the session's reward; the previous one is
kept (``job_environments.eval_history``, the last step's ``meta_json["evaluation_history"]``).
Sessions that cannot be regraded (unfinished, infrastructure failure, no evaluator, no kept
workspace) keep their previous evaluation and are listed with the reason. See docs/regrade.md.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import tempfile
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from rollout.contract.protocol import EvalRequest, SimulationStartResult
from rollout.core.envs import Case, EnvConfigError, task_folder_env
from rollout.core.logs import plural
from rollout.core.outcomes import INFRA_CLASSES
from rollout.core.safactory import env_folders
from rollout.core.setup import SetupError, init_store, open_store
from rollout.grading.attribution import Controls
from rollout.grading.evaluation import Evaluation, build_eval_spec
from rollout.grading.evaluator_loader import env_evaluator, evaluator_for
from rollout.grading.grader import Grader, GraderSetupError
from rollout.grading.trajectory import to_trajectory
from rollout.jobs.options import SharedOptions
from rollout.jobs.workspace_archive import ArchiveError, restore_workspace
from rollout.results.records import job_records
from rollout.results.report import SessionRecord, write_jsonl
from store import GRADER_BROKEN, JobEnvironment, Store, is_unavailable, utcnow

log = logging.getLogger(__name__)

BlockKind = Literal[
    "not_finished",
    "infrastructure_failure",
    "no_evaluator",
    "no_workspace",
    "bad_stored_data",
    "regrade_error",
]


class RegradeOptions(SharedOptions):
    """What to regrade and how: the job, the store, where the evaluators are now (``agent_root``,
    or the folders of ``agent_configs``), which envs (empty: all of the job's), the evaluator
    timeout in seconds, how many evaluations run at once, and the JSONL output."""

    job_id: str
    agent_configs: list[Path] = Field(default_factory=list)
    tasks: list[Path] = Field(default_factory=list)  # the --tasks folders the job ran
    env_names: list[str] = Field(default_factory=list)
    grader_isolation: Literal["bwrap", "none"] = "bwrap"


class Regraded(BaseModel):
    """One session graded again: its evaluation before (None when it had none) and after."""

    session_id: str
    env_name: str
    case_id: str
    sample_index: int
    before_status: str | None
    before_score: float | None
    after_status: str
    after_score: float | None
    reason: str | None

    @property
    def changed(self) -> bool:
        """True when the status or the score differs from before."""
        return (self.before_status, self.before_score) != (self.after_status, self.after_score)


class NotRegraded(BaseModel):
    """A session left with its previous evaluation: ``kind`` groups the reasons, ``reason`` says
    what was missing for this session."""

    session_id: str
    env_name: str
    case_id: str
    sample_index: int
    kind: BlockKind
    reason: str


class RegradeResult(BaseModel):
    """The regrade of a job: every finished session's record of the selected envs (after the
    regrade), the sessions regraded and those left as they were, the JSONL path and the store."""

    job_id: str
    records: list[SessionRecord]
    regraded: list[Regraded]
    not_regraded: list[NotRegraded]
    out: Path
    store: str


"""Session statuses that are the agent's own result (gradable even when the run did not grade them)."""


def regrade_blocker(row: JobEnvironment) -> tuple[BlockKind, str] | None:
    """Why a session row must not be regraded, or None: unfinished sessions, and sessions whose last
    attempt ended in an infrastructure failure (``outcome`` in ``INFRA_CLASSES``; their reward is
    NULL and the trainer masks them: a regrade must not turn that into a score). Rows written
    before outcomes were recorded (``outcome`` NULL) fall back to their status: only task statuses
    are graded. A session the run did not grade (evaluation off, no evaluator) is graded."""
    if not row.finished:
        return "not_finished", (
            f"not finished (status {row.status}): complete it with --resume --job-id {row.job_id} first"
        )
    if row.outcome in INFRA_CLASSES:
        return "infrastructure_failure", f"not graded in the run ({row.outcome}: {row.error_text})"
    if row.outcome is None and row.reward is None and row.status not in _TASK_STATUSES:
        return (
            "infrastructure_failure",
            f"the run ended in status {row.status} without a score ({row.error_text})",
        )
    return None


_TASK_STATUSES = frozenset({"succeeded", "failed", "truncated", "timeout"})


def _evaluators(opts: RegradeOptions, env_names: set[str]) -> tuple[dict[str, Path | None], set[str]]:
    """env name -> the evaluator a run would use now (as an attempt finds it), None if none; and
    the names of the ``--tasks`` envs of Harbor tasks (their verifiers grade them)."""
    dirs: dict[str, Path] = {}
    for p in opts.agent_configs:
        try:
            dirs.update(env_folders(p))
        except EnvConfigError as e:
            raise SetupError(str(e)) from e
    own: dict[str, Path | None] = {}
    harbor: set[str] = set()
    for p in opts.tasks:
        try:
            cfg = task_folder_env(p)
        except EnvConfigError as e:
            raise SetupError(str(e)) from e
        own[cfg.name] = env_evaluator(opts.agent_root, cfg)
        if cfg.dataset.format == "harbor":
            harbor.add(cfg.name)
    return {
        name: own[name] if name in own else evaluator_for(opts.agent_root, name, dirs.get(name))
        for name in env_names
    }, harbor


def _file_sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _start_case(row: JobEnvironment) -> Case:
    """The case of ``row`` as far as its control needs it: its starting files (a task folder's
    ``files_dir``, as the session row keeps it), none otherwise."""
    dataset = (row.env_params or {}).get("dataset")
    files = dataset.get("files_dir") if isinstance(dataset, dict) else None
    return Case(
        env_name=row.env_name,
        case_id=row.case_id,
        row=dataset if isinstance(dataset, dict) else {},
        files_dir=files if isinstance(files, str) and Path(files).is_dir() else None,
    )


async def _regrade_one(
    store: Store,
    grader: Grader,
    controls: Controls,
    row: JobEnvironment,
    path: Path,
    sha256: str | None,
    timeout_s: float,
) -> Regraded | NotRegraded:
    def blocked(kind: BlockKind, reason: str) -> NotRegraded:
        return NotRegraded(
            session_id=row.session_id,
            env_name=row.env_name,
            case_id=row.case_id,
            sample_index=row.sample_index,
            kind=kind,
            reason=reason,
        )

    kept = await store.workspace_archive(row.session_id)
    if kept is None:
        return blocked("no_workspace", "no kept workspace (the run did not archive it)")
    if kept.status != "kept" or kept.archive is None:
        return blocked("no_workspace", kept.reason or f"workspace archive status {kept.status}")
    try:
        start_result = SimulationStartResult.model_validate(row.result) if row.result is not None else None
    except ValidationError as e:
        return blocked("bad_stored_data", f"stored start result is invalid: {e.errors()[0]['msg']}")
    trajectory = to_trajectory(row.session_id, await store.trajectory(row.session_id))
    with tempfile.TemporaryDirectory(prefix=f"regrade-{row.env_name}-"[:40]) as tmp:
        workspace = Path(tmp)
        try:
            await asyncio.to_thread(restore_workspace, kept.archive, kept.sha256, workspace)
        except ArchiveError as e:
            return blocked("no_workspace", f"kept workspace unusable: {e}")
        request = EvalRequest(
            job_id=row.job_id,
            session_id=row.session_id,
            env_name=row.env_name,
            case_id=row.case_id,
            group_id=row.group_id,
            sample_index=row.sample_index,
            model=row.llm_model,
            env_params=dict(row.env_params or {}),
            start_result=start_result,
        )
        spec = build_eval_spec(row.env_name, path, timeout_s)
        evaluation: Evaluation = await grader.evaluate(path, request, spec, trajectory, workspace)

    async def grade_control(start: Path) -> Evaluation:
        return await grader.evaluate(
            path,
            request.model_copy(update={"start_result": None}),
            spec,
            to_trajectory(row.session_id, []),
            start,
        )

    evaluation = await controls.judge(evaluation, _start_case(row), grade_control)  # as in a run
    meta = {
        **evaluation.model_dump(mode="json"),
        "regraded_at": utcnow().isoformat(),
        "evaluator_path": str(path.resolve()),
        "evaluator_sha256": sha256,
    }
    await store.record_regrade(
        row.session_id,
        reward=evaluation.score,
        eval_status=evaluation.status,
        eval_reason=evaluation.reason,
        eval_detail=evaluation.detail(),
        eval_meta=meta,
    )
    return Regraded(
        session_id=row.session_id,
        env_name=row.env_name,
        case_id=row.case_id,
        sample_index=row.sample_index,
        before_status=row.eval_status,
        before_score=row.reward,
        after_status=evaluation.status,
        after_score=evaluation.score,
        reason=evaluation.reason,
    )


async def regrade_job(
    opts: RegradeOptions,
    on_start: Callable[[int], None] | None = None,
    on_done: Callable[[Regraded | NotRegraded], None] | None = None,
) -> RegradeResult:
    """Regrade the finished sessions of ``opts.job_id`` (only ``opts.env_names`` when given),
    ``opts.pool_size`` at a time; ``on_start(n_sessions)`` is called once the sessions are known,
    ``on_done`` after each session. Starts no process and
    makes no network call. Raises SetupError for an agent root that is not a folder, an unknown
    job or an env the job does not have.
    Each session's new evaluation is committed on its own, so an interruption leaves every session
    with either its new or its previous evaluation."""
    if not opts.agent_configs and not opts.tasks and not opts.agent_root.is_dir():
        where = "" if opts.agent_root.is_absolute() else f" (in {Path.cwd()})"
        raise SetupError(
            f"agent root {opts.agent_root} is not a directory{where}: run from the project folder or "
            "pass --agent-root (the evaluators are looked up there), or the job's --tasks DIR"
        )
    store = open_store(opts.db_path, existing=True)
    try:
        await init_store(store)
        rows = await store.job_sessions(opts.job_id)
        if not rows:
            raise SetupError(f"--regrade: no job {opts.job_id!r} in {store.identity()}")
        job_envs = sorted({r.env_name for r in rows})
        unknown = set(opts.env_names) - set(job_envs)
        if unknown:
            raise SetupError(
                f"--env: job {opts.job_id} has no sessions of env {sorted(unknown)} (has {job_envs})"
            )
        if opts.env_names:
            rows = [r for r in rows if r.env_name in opts.env_names]
        evaluators, verified = _evaluators(opts, {r.env_name for r in rows})
        digests = {name: _file_sha256(path) for name, path in evaluators.items() if path is not None}
        if on_start:
            on_start(len(rows))
        regraded: list[Regraded] = []
        not_regraded: list[NotRegraded] = []
        gate = asyncio.Semaphore(opts.pool_size)
        controls = Controls()

        def note(item: Regraded | NotRegraded) -> None:
            (regraded if isinstance(item, Regraded) else not_regraded).append(item)  # type: ignore[arg-type]
            if on_done:
                on_done(item)

        async def one(row: JobEnvironment) -> None:
            block = regrade_blocker(row)
            path = evaluators[row.env_name]
            if block is None and path is None:
                block = (
                    "no_evaluator",
                    f"env {row.env_name!r} is graded by its tasks' verifiers (tests/test.sh), which "
                    "--regrade does not run again (docs/verifiers.md)"
                    if row.env_name in verified
                    else f"env {row.env_name!r} has no rule_evaluator.py under {opts.agent_root} (an env the "
                    "job ran from --tasks DIR or --agent-config needs that flag again)",
                )
            if block is not None:
                note(
                    NotRegraded(
                        session_id=row.session_id,
                        env_name=row.env_name,
                        case_id=row.case_id,
                        sample_index=row.sample_index,
                        kind=block[0],
                        reason=block[1],
                    )
                )
                return
            assert path is not None
            async with gate:
                try:
                    item = await _regrade_one(
                        store, grader, controls, row, path, digests[row.env_name], opts.eval_timeout
                    )
                except Exception as e:
                    if is_unavailable(e):  # the database itself failed: stop the regrade
                        raise
                    log.exception("regrade of session %s failed", row.session_id)
                    item = NotRegraded(
                        session_id=row.session_id,
                        env_name=row.env_name,
                        case_id=row.case_id,
                        sample_index=row.sample_index,
                        kind="regrade_error",
                        reason=f"the regrade failed for this session: {type(e).__name__}: {e}",
                    )
                note(item)

        async with Grader(opts.grader_isolation) as grader:
            try:
                await grader.start(p.parent.parent for p in evaluators.values() if p is not None)
            except GraderSetupError as e:
                raise SetupError(str(e)) from e
            tasks = [asyncio.ensure_future(one(r)) for r in rows]
            try:
                await asyncio.gather(*tasks)
            finally:  # on an error or Ctrl-C: stop the others (each commit is atomic)
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                await controls.aclose()
        selected = {r.session_id for r in rows}
        records = [r for r in await job_records(store, opts.job_id) if r.session_id in selected]
        out = opts.out or Path("runs") / f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{opts.job_id}-regrade.jsonl"
        write_jsonl(out, records)
        await store.checkpoint()
        order = {r.session_id: i for i, r in enumerate(rows)}
        regraded.sort(key=lambda x: order[x.session_id])
        not_regraded.sort(key=lambda x: order[x.session_id])
        return RegradeResult(
            job_id=opts.job_id,
            records=records,
            regraded=regraded,
            not_regraded=not_regraded,
            out=out,
            store=store.identity(),
        )
    finally:
        await store.close()


def render_regrade_summary(result: RegradeResult, max_ids: int = 5) -> str:
    """Lines under the table: how many sessions were regraded and changed, then per (env, kind)
    the sessions left with their previous evaluation, one reason and up to ``max_ids`` ids."""
    changed = sum(1 for r in result.regraded if r.changed)
    lines = [
        f"regrade of job {result.job_id}: {plural(len(result.regraded), 'session')} regraded "
        f"({changed} changed), {len(result.not_regraded)} not regraded (previous evaluation kept)"
    ]
    groups: dict[tuple[str, str], list[NotRegraded]] = defaultdict(list)
    for item in result.not_regraded:
        groups[(item.env_name, item.kind)].append(item)
    for (env, kind), items in sorted(groups.items()):
        ids = ", ".join(f"{i.case_id}#{i.sample_index}" for i in items[:max_ids])
        more = f" and {len(items) - max_ids} more" if len(items) > max_ids else ""
        lines.append(f"  {env}: {len(items)} cannot be regraded ({kind}): {items[0].reason} [{ids}{more}]")
    return "\n".join(lines)


def regrade_exit_code(result: RegradeResult) -> int:
    """0 when every selected session got a new evaluation and no evaluator errored, timed out or
    was found broken, else 2 (the launcher's code for "something did not run")."""
    failed = any(r.after_status in ("error", "timeout", GRADER_BROKEN) for r in result.regraded)
    return 2 if failed or result.not_regraded else 0
