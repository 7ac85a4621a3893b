"""``launcher.py grade``: sessions recorded without a job (a client named them on the gateway:
inspect_ai, verifiers, the openai SDK with ``X-Session-ID``) attached to an env and graded by its
``rule_evaluator.py``, as a new job (docs/regrade.md, "Sessions without a job").

Each selected session gets a ``job_environments`` row (the env, its case, group = the case, sample
index in order, status from the gateway session) and its steps the job's id; it is then graded as a
regrade grades (``rollout.jobs.regrade``): no runtime, no model call, the grader sandbox, trajectory
= the recorded steps, no workspace, no start result, and a grading failure attributed by a control
(the same grader with no steps)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, Field

from rollout.contract.protocol import EvalRequest
from rollout.core.envs import Case, EnvConfig, EnvConfigError, load_cases, scan_envs
from rollout.core.plan import group_id
from rollout.core.setup import SetupError, init_store, open_store
from rollout.grading.attribution import Controls
from rollout.grading.evaluation import Evaluation, build_eval_spec
from rollout.grading.evaluator_loader import env_evaluator
from rollout.grading.grader import Grader, GraderSetupError
from rollout.grading.trajectory import to_trajectory
from rollout.jobs.options import SharedOptions
from rollout.results.records import job_records
from rollout.results.report import SessionRecord, write_jsonl
from store import JobEnvironment, SessionResult, Store
from store.feed import FeedQueries

log = logging.getLogger(__name__)

OPEN_STATUSES = frozenset({"active", "closing", "interrupted"})
"""Gateway statuses of a session its client may still be calling: graded only with ``include_active``."""


class GradeOptions(SharedOptions):
    """Which sessions (``session_ids``, or every session without a job matching ``tag`` and the
    ``since``/``until`` window on their first call), the env and its case (``case_id`` for all, or
    ``case_field``: the key of the first call's request ``metadata`` naming it), the new job id,
    the store, where the envs are, the evaluator timeout and concurrency, the JSONL output."""

    env_name: str
    session_ids: list[str] = Field(default_factory=list)
    tag: tuple[str, str] | None = None
    since: AwareDatetime | None = None
    until: AwareDatetime | None = None
    case_id: str | None = None
    case_field: str | None = None
    job_id: str | None = None
    include_active: bool = False
    grader_isolation: Literal["bwrap", "none"] = "bwrap"


class GradeResult(BaseModel):
    """The new job: its id, every session's record, the JSONL path and the store."""

    job_id: str
    records: list[SessionRecord]
    out: Path
    store: str


def request_metadata(steps: list[Any]) -> dict[str, Any]:
    """The ``metadata`` object of a session's first recorded request (``{}`` when none)."""
    for st in steps:
        meta = (st.request or {}).get("metadata") if isinstance(st.request, dict) else None
        return meta if isinstance(meta, dict) else {}
    return {}


def _env(opts: GradeOptions) -> tuple[EnvConfig, Path, dict[str, Case]]:
    try:
        found, _ = scan_envs(opts.agent_root)
    except EnvConfigError as e:
        raise SetupError(str(e)) from e
    cfg = next((c for c in found if c.name == opts.env_name), None)
    if cfg is None:
        raise SetupError(
            f"--env: no env {opts.env_name!r} under {opts.agent_root} (have {sorted(c.name for c in found)})"
        )
    path = env_evaluator(opts.agent_root, cfg)
    if path is None:
        raise SetupError(f"env {cfg.name} has no rule_evaluator.py: nothing to grade with")
    try:
        cases = {c.case_id: c for c in load_cases(cfg)}
    except EnvConfigError as e:
        raise SetupError(str(e)) from e
    return cfg, path, cases


def _utc(t: datetime) -> datetime:
    """A stored time as UTC (SQLite reads it back without a zone)."""
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


async def _select(store: Store, opts: GradeOptions) -> list[dict[str, Any]]:
    """The gateway rows of the selected sessions, by first call; SetupError for one in a job, an
    unknown one, an open one (without ``include_active``) or none at all."""
    queries = FeedQueries(store.reader)
    ids = list(dict.fromkeys(opts.session_ids)) or None
    if ids is not None:
        owned = await queries.jobs_of_sessions(ids)
        if owned:
            sid, job = sorted(owned.items())[0]
            raise SetupError(
                f"session {sid!r} is already in job {job!r}: grade it again with --regrade --job-id {job}"
            )
    rows = await queries.jobless_sessions(ids)
    if ids is not None and len(rows) < len(ids):
        raise SetupError(
            f"no session {sorted(set(ids) - {r['session_id'] for r in rows})[0]!r} in {store.identity()}"
        )
    rows = [
        r
        for r in rows
        if (opts.since is None or _utc(r["created_at"]) >= opts.since)
        and (opts.until is None or _utc(r["created_at"]) < opts.until)
    ]
    if opts.tag is not None:
        key, value = opts.tag
        rows = [
            r for r in rows if request_metadata(await store.trajectory(r["session_id"])).get(key) == value
        ]
    if not rows:
        raise SetupError(f"no session without a job matches the selection in {store.identity()}")
    still = [r["session_id"] for r in rows if r["status"] in OPEN_STATUSES]
    if still and not opts.include_active:
        raise SetupError(
            f"session {still[0]!r} is still {rows[[r['session_id'] for r in rows].index(still[0])]['status']}"
            f" ({len(still)} open in all): close it (POST /v1/sessions/ID/close, or the gateway's "
            "session_idle_close_s), or pass --include-active to grade what it recorded so far"
        )
    return rows


def _status(gw: dict[str, Any]) -> str:
    """The job status of a gateway session: ``truncated`` when its budget ended it, else ``succeeded``
    (its client ran it to its end)."""
    return (
        "truncated"
        if gw["status"] == "truncated" or gw.get("completion_mode") == "truncated"
        else "succeeded"
    )


async def _rows(
    store: Store,
    opts: GradeOptions,
    job_id: str,
    cfg: EnvConfig,
    cases: dict[str, Case],
    gws: list[dict[str, Any]],
) -> list[JobEnvironment]:
    out: list[JobEnvironment] = []
    for k, gw in enumerate(gws):
        sid = gw["session_id"]
        case_id = opts.case_id
        if case_id is None:
            value = request_metadata(await store.trajectory(sid)).get(str(opts.case_field))
            if not isinstance(value, str | int) or isinstance(value, bool):
                raise SetupError(
                    f"session {sid!r}: its first request's metadata has no {opts.case_field!r} "
                    "naming a case (pass --case ID)"
                )
            case_id = str(value)
        case = cases.get(case_id)
        if case is None:
            raise SetupError(f"session {sid!r}: env {cfg.name} has no case {case_id!r}")
        out.append(
            JobEnvironment(
                session_id=sid,
                job_id=job_id,
                env_name=cfg.name,
                case_id=case_id,
                llm_model=gw.get("route") or "unknown",
                group_id=group_id(job_id, cfg.name, case_id),
                sample_index=k,
                env_params={**cfg.params, "dataset": case.row},
                max_steps=gw.get("max_steps"),
                status=_status(gw),
                attempts=1,
                outcome=_status(gw),
                started_at=gw.get("created_at"),
            )
        )
    return out


async def _grade_one(
    store: Store, grader: Grader, controls: Controls, row: JobEnvironment, path: Path, timeout_s: float
) -> None:
    trajectory = to_trajectory(row.session_id, await store.trajectory(row.session_id))
    request = EvalRequest(
        job_id=row.job_id,
        session_id=row.session_id,
        env_name=row.env_name,
        case_id=row.case_id,
        group_id=row.group_id,
        sample_index=row.sample_index,
        model=row.llm_model,
        env_params=dict(row.env_params or {}),
        start_result=None,
    )
    spec = build_eval_spec(row.env_name, path, timeout_s)
    evaluation: Evaluation = await grader.evaluate(path, request, spec, trajectory, None)

    async def grade_control(_start: Path) -> Evaluation:  # the same grader, no steps, no workspace
        return await grader.evaluate(path, request, spec, to_trajectory(row.session_id, []), None)

    # whose failure it is (docs/trust-model.md, "Failure attribution")
    evaluation = await controls.judge(
        evaluation, Case(env_name=row.env_name, case_id=row.case_id, row={}), grade_control
    )
    result = SessionResult(
        status=row.status,
        outcome=row.outcome,
        attempts=1,  # type: ignore[arg-type]
        reward=evaluation.score,
        eval_status=evaluation.status,
        eval_reason=evaluation.reason,
        eval_detail=evaluation.detail(),
        evaluation=evaluation.model_dump(mode="json"),
    )
    await store.finish_job_session(row.session_id, result)


async def grade_sessions(opts: GradeOptions) -> GradeResult:
    """Attach the selected sessions to ``opts.env_name`` as a new job and grade each,
    ``opts.pool_size`` at a time. Raises SetupError for a bad selection, env or case, or a job id
    that exists. A grading that fails on the store stops it; each session's evaluation is committed
    on its own."""
    if (opts.case_id is None) == (opts.case_field is None):
        raise SetupError(
            "give --case ID (every session is that case) or --case-field KEY (the key of the "
            "first request's metadata naming its case)"
        )
    if not opts.session_ids and opts.tag is None and opts.since is None and opts.until is None:
        raise SetupError("select the sessions: --session ID, --tag KEY=VALUE or --since/--until")
    cfg, path, cases = _env(opts)
    job_id = opts.job_id or f"grade-{datetime.now(UTC):%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"
    store = open_store(opts.db_path)
    try:
        await init_store(store)
        if await store.job_exists(job_id):
            raise SetupError(f"job {job_id!r} already exists in {store.identity()}: choose another --job-id")
        rows = await _rows(store, opts, job_id, cfg, cases, await _select(store, opts))
        try:
            await store.attach_sessions(rows)
        except ValueError as e:  # another process attached one meanwhile
            raise SetupError(str(e)) from e
        gate = asyncio.Semaphore(opts.pool_size)
        controls = Controls()

        async def one(row: JobEnvironment) -> None:
            async with gate:
                await _grade_one(store, grader, controls, row, path, opts.eval_timeout)

        async with Grader(opts.grader_isolation) as grader:
            try:
                await grader.start([path.parent.parent])
            except GraderSetupError as e:
                raise SetupError(str(e)) from e
            try:
                await asyncio.gather(*(one(r) for r in rows))
            finally:
                await controls.aclose()
        records = await job_records(store, job_id)
        out = opts.out or Path("runs") / f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{job_id}.jsonl"
        write_jsonl(out, records)
        await store.checkpoint()
        return GradeResult(job_id=job_id, records=records, out=out, store=store.identity())
    finally:
        await store.close()
