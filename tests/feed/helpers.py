"""Building a job straight in a real SQLite store, as the launcher and the gateway write it."""

from __future__ import annotations

from typing import Any

from store import JobEnvironment, SessionStep, Store


def session(sid: str, job: str, group: str, k: int, *, case: str = "c", env: str = "toy",
            model: str = "m") -> JobEnvironment:
    return JobEnvironment(session_id=sid, job_id=job, env_name=env, case_id=case, llm_model=model, group_id=group,
                          sample_index=k, status="running")


def step(sid: str, seq: int, text: str, **extra: Any) -> SessionStep:
    return SessionStep(session_id=sid, seq=seq, step_id=seq, llm_model="m", endpoint="chat.completions",
                       messages=[{"role": "user", "content": f"q{seq}"}],
                       response={"choices": [{"message": {"role": "assistant", "content": text},
                                              "finish_reason": "stop"}]},
                       finish_reason="stop", prompt_tokens=4, completion_tokens=2, **extra)


async def finish(store: Store, sid: str, score: float | None, eval_status: str | None = "scored",
                 **values: Any) -> None:
    values.setdefault("status", "succeeded")
    await store.finish_job_session(sid, reward=score, eval_meta=None, eval_status=eval_status, **values)


async def make_job(store: Store, job: str, groups: dict[str, int]) -> dict[str, list[str]]:
    """Sessions (unfinished) of ``groups`` (group id -> samples), one step each; returns group ->
    session ids by sample."""
    out: dict[str, list[str]] = {}
    rows, steps = [], []
    for g, n in groups.items():
        for k in range(n):
            sid = f"{job}-{g}-{k}"
            out.setdefault(g, []).append(sid)
            rows.append(session(sid, job, g, k, case=f"case-{g}"))
            steps.append(step(sid, 1, f"answer {sid}"))
    await store.add_job_sessions(rows)
    await store.write_batch(steps, [])
    return out
