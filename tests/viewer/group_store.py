"""A store with one group of text-protocol sessions (the bash agent's ``protocol: text``: a command
in a fenced block, its output sent back as a user message), the first sample's final workspace
kept: for the group page, the session page's raw rows and the bundle."""

from __future__ import annotations

from pathlib import Path

from rollout.core.envs import WorkspaceArchiveConfig
from rollout.jobs.workspace_archive import build_archive
from store import JobEnvironment, SessionStep, SessionWorkspace, Store

JOB, GROUP, ENV, CASE = "tj", "grp-text", "e", "c"
TASK = "Count the lines of notes.txt."


def sid(k: int, group: str = GROUP) -> str:
    return f"{group}-{k}"


def output(k: int) -> str:
    """What sample ``k``'s command printed, as the bash agent sends it back."""
    return f"<returncode>0</returncode>\n<output>\nOUTPUT-OF-SAMPLE-{k} {'x' * 60}\n</output>"


def command(k: int) -> str:
    return f"```bash\nwc -l notes.txt  # sample {k} {'long-argument-' * 8}\n```"


def _steps(k: int, group: str) -> list[SessionStep]:
    first = [{"role": "system", "content": "You run bash commands."}, {"role": "user", "content": TASK}]
    second = [*first, {"role": "assistant", "content": command(k)}, {"role": "user", "content": output(k)}]

    def step(seq: int, messages: list[dict[str, str]], answer: str) -> SessionStep:
        return SessionStep(
            session_id=sid(k, group),
            seq=seq,
            step_id=seq,
            llm_model="m",
            endpoint="chat.completions",
            messages=messages,
            response={
                "choices": [{"message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}]
            },
            finish_reason="stop",
            prompt_tokens=10,
            completion_tokens=5,
            total_tokens=15,
        )

    return [step(1, first, command(k)), step(2, second, f"There are {k + 3} lines.")]


async def fill(db: Path, samples: int, workspace: Path, group: str = GROUP, job: str = JOB) -> None:
    """``samples`` sessions of ``group`` in ``job``; sample 0 keeps ``workspace``."""
    store = Store(f"sqlite://{db}")
    await store.init()
    try:
        await store.add_job_sessions(
            [
                JobEnvironment(
                    session_id=sid(k, group),
                    job_id=job,
                    env_name=ENV,
                    case_id=CASE,
                    llm_model="m",
                    group_id=group,
                    sample_index=k,
                )
                for k in range(samples)
            ]
        )
        for k in range(samples):
            await store.update_job_session(
                sid(k, group),
                finished=True,
                status="succeeded",
                reward=10.0 if k == 0 else 0.0,
                eval_status="scored",
                eval_reason=f"reason {k}",
            )
        await store.write_batch([s for k in range(samples) for s in _steps(k, group)], [])
        kept = build_archive(workspace, WorkspaceArchiveConfig())
        await store.save_workspace_archive(
            SessionWorkspace(session_id=sid(0, group), job_id=job, env_name=ENV, **kept.columns())
        )
    finally:
        await store.close()
