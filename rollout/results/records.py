"""Per-session records of a job, rebuilt from the store (so a resumed job reports all sessions)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from rollout.contract.protocol import Trajectory
from rollout.core.session_ids import SessionIds
from rollout.grading.trajectory import to_trajectory
from rollout.results.report import AttemptRecord, SessionRecord
from rollout.results.session_fields import session_fields
from store import JobEnvironment, SessionAttempt, SessionResult, SessionStep, Store, attempt_session_id
from store.session_result import CUT_OFF_OUTCOMES


def attempt_records(row: JobEnvironment, attempts: Sequence[SessionAttempt]) -> list[AttemptRecord]:
    """The attempts of a finished session, in order; each names the session id its steps are kept
    under (``<sid>~a<n>`` for an earlier attempt, the session id for the last one)."""
    last = max((a.attempt for a in attempts), default=0)
    return [
        AttemptRecord(
            attempt=a.attempt,
            status=a.status,
            outcome=a.outcome,
            infra=a.infra,
            reason=a.reason,
            step_count=a.step_count,
            steps_session_id=row.session_id
            if a.attempt == last
            else attempt_session_id(row.session_id, a.attempt),
            retry_in_s=a.retry_in_s,
            duration_s=a.duration_s,
            started_at=a.started_at.isoformat() if a.started_at else None,
            finished_at=a.finished_at.isoformat() if a.finished_at else None,
        )
        for a in sorted(attempts, key=lambda a: a.attempt)
    ]


STEP_KEYS = ("seq", "prompt_tokens", "completion_tokens", "total_tokens", "latency_ms", "ttft_ms")


def record_of(
    row: JobEnvironment,
    result: SessionResult,
    traj: Trajectory,
    attempts: Sequence[SessionAttempt] = (),
    steps: Sequence[SessionStep] | None = None,
) -> SessionRecord:
    """The JSONL record of one finished session: its row's identity, its ``result``, its recorded
    steps (``steps``, for their timings; else ``traj``'s, without timings) and its attempts; the
    shared fields come from :func:`session_fields`, as ``launcher.py export``'s."""
    listed = attempt_records(row, attempts)
    said = (result.runtime_result or {}).get("metrics")
    said = said if isinstance(said, dict) else None  # the runtime's result line's own (its words)
    metrics = said or {} if row.harness is not None else {}
    step_rows = (
        [{k: getattr(s, k) for k in STEP_KEYS} for s in sorted(steps, key=lambda s: s.seq)]
        if steps is not None
        else [{"seq": s.seq, **(s.usage or {})} for s in traj.steps]
    )
    shared = session_fields(
        {
            "env_id": row.session_id,
            "job_id": row.job_id,
            "env_name": row.env_name,
            "case_id": row.case_id,
            "group_id": row.group_id,
            "llm_model": row.llm_model,
            "harness": row.harness,
            "sample_index": row.sample_index,
            "status": result.status,
            "outcome": result.outcome,
            "reward": result.reward,
            "eval_status": result.eval_status,
            "eval_reason": result.eval_reason,
            "error_text": result.error,
            "duration_s": result.duration_s,
            "started_at": row.started_at,
            "finished_at": row.finished_at,
        },
        step_rows,
    )
    return SessionRecord.model_validate(
        {
            **shared.model_dump(),
            "reason": result.eval_reason,
            "sandbox": result.sandbox,
            "grader_isolation": result.grader_isolation,
            "verifier_container": result.verifier_container,
            "retried": any(a.outcome not in CUT_OFF_OUTCOMES for a in listed[:-1]),
            "metrics": said,
            "harness_exit": metrics.get("harness_exit"),
            "answer": metrics.get("answer"),
            "attempts": [a.model_dump() for a in listed],
            "trajectory": [s.model_dump(mode="json") for s in traj.steps],
        }
    )


async def job_records(store: Store, job_id: str) -> list[SessionRecord]:
    """Records of every finished session of a job, ordered by env, case, sample."""
    return [r async for r in iter_job_records(store, job_id)]


async def iter_job_records(store: Store, job_id: str, page: int = 256) -> AsyncIterator[SessionRecord]:
    """The records of ``job_records``, in the same order, built ``page`` sessions at a time (a job
    of any size never holds more than a page of rows)."""
    ids = SessionIds()
    async for sid in store.job_session_ids(job_id, finished_only=True):
        ids.append(sid)
    for i in range(0, len(ids), page):
        chunk = ids[i : i + page]
        attempts = await store.session_attempts(chunk)
        for r in await store.job_sessions_by_id(chunk):
            if r.finished:
                steps = await store.trajectory(r.session_id)
                yield record_of(
                    r,
                    SessionResult.of_row(r),
                    to_trajectory(r.session_id, steps),
                    attempts.get(r.session_id, []),
                    steps,
                )
