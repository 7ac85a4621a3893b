"""Per-session records of a job, rebuilt from the store (so a resumed job reports all sessions)."""

from __future__ import annotations

from rollout.protocol import Trajectory
from rollout.report import SessionRecord
from rollout.trajectory import to_trajectory, usage_total
from store import JobEnvironment, Store


def record_of(row: JobEnvironment, traj: Trajectory) -> SessionRecord:
    """The JSONL record of one finished session row and its recorded steps."""
    return SessionRecord.model_validate({
        "session_id": row.env_id, "job_id": row.job_id, "env_name": row.env_name, "case_id": row.case_id,
        "group_id": row.group_id, "model": row.llm_model, "sample_index": row.sample_index, "status": row.status,
        "score": row.reward, "eval_status": row.eval_status, "reason": row.eval_reason, "error": row.error_text,
        "duration_s": row.duration_s, "usage": usage_total(traj.steps), "step_count": len(traj.steps),
        "sandbox": row.sandbox,
        "trajectory": [s.model_dump(mode="json") for s in traj.steps],
    })


async def job_records(store: Store, job_id: str) -> list[SessionRecord]:
    """Records of every finished session of a job, ordered by env, case, sample."""
    rows = [r for r in await store.job_sessions(job_id) if r.finished]
    return [record_of(r, to_trajectory(r.env_id, await store.trajectory(r.env_id))) for r in rows]
