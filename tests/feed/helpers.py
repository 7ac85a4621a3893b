"""Building a job straight in a real SQLite store, as the launcher and the gateway write it; a toy
env for the launcher (one model call per session, graded by sample index)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from store import JobEnvironment, SessionResult, SessionStep, Store

REPO = Path(__file__).resolve().parents[2]


def session(
    sid: str, job: str, group: str, k: int, *, case: str = "c", env: str = "toy", model: str = "m"
) -> JobEnvironment:
    return JobEnvironment(
        session_id=sid,
        job_id=job,
        env_name=env,
        case_id=case,
        llm_model=model,
        group_id=group,
        sample_index=k,
        status="running",
    )


def step(sid: str, seq: int, text: str, *, llm_model: str = "m", **extra: Any) -> SessionStep:
    return SessionStep(
        session_id=sid,
        seq=seq,
        step_id=seq,
        llm_model=llm_model,
        endpoint="chat.completions",
        messages=[{"role": "user", "content": f"q{seq}"}],
        response={"choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]},
        finish_reason="stop",
        prompt_tokens=4,
        completion_tokens=2,
        **extra,
    )


async def finish(
    store: Store, sid: str, score: float | None, eval_status: str | None = "scored", **values: Any
) -> None:
    values.setdefault("status", "succeeded")
    await store.finish_job_session(sid, SessionResult(reward=score, eval_status=eval_status, **values))


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


RUNTIME = """
from env.runtime_kit import chat_completion, openai_client, run_runtime
from rollout.contract.protocol import SimulationStartResult

def main(req):
    client = openai_client(req, max_retries=0)
    completion, text = chat_completion(client, model=req.model,
                                       messages=[{"role": "user", "content": req.env_params["dataset"]["q"]}])
    return SimulationStartResult(session_id=req.session_id, status="succeeded", metrics={"text": text})

run_runtime(main)
"""

# sample 0 passes, sample 1 fails; case "d" has an evaluator that crashes on sample 1
EVALUATOR = """
def evaluate(request, spec, trajectory):
    if request.case_id == "d" and request.sample_index == 1:
        raise KeyError("grader bug")
    return {"score": 10 if request.sample_index == 0 else 0, "reason": trajectory.final_response}
"""

CASES = ["a", "b", "c", "d"]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def make_env(root: Path) -> None:
    """The toy env under ``root/toy``."""
    env_dir = root / "toy"
    (env_dir / "data").mkdir(parents=True)
    (env_dir / "runtime.py").write_text(RUNTIME)
    (env_dir / "rule_evaluator.py").write_text(EVALUATOR)
    (env_dir / "data" / "cases.jsonl").write_text(
        "".join(json.dumps({"id": c, "q": f"q {c}"}) + "\n" for c in CASES)
    )
    (env_dir / "env.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "toy",
                "dataset": {"format": "jsonl", "path": "data/cases.jsonl", "id_field": "id"},
                "runtime": {"command": ["{python}", "{env_dir}/runtime.py"], "timeout_s": 400},
                "max_steps": 2,
            }
        )
    )
