"""The runtime of task-directory envs (``python -m env.task_runtime``): the bash agent loop
(``env.bash_agent``) in the session's workspace on the case's ``instruction``; ``succeeded`` when
``outputs/answer.json`` parses (or, with ``answer_file: false``, when the loop ended without an
error). Its params are in docs/bash-agent.md."""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path

from env.bash_agent import LoopParams, run_agent
from env.runtime_kit import openai_client, run_runtime
from rollout.protocol import SimulationStartRequest, SimulationStartResult

logger = logging.getLogger("env.task_runtime")

ANSWER_PATH = "outputs/answer.json"
ANSWER_MAX_BYTES = 16 * 1024 * 1024


def check_answer(workspace: Path) -> str | None:
    """None when ``outputs/answer.json`` exists and parses as JSON, else why not."""
    path = workspace / ANSWER_PATH
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO planted there must not block the runtime
    except FileNotFoundError:
        return f"{ANSWER_PATH} is missing"
    except OSError as exc:
        return f"{ANSWER_PATH} is unreadable or not JSON: {exc}"
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return f"{ANSWER_PATH} is not a regular file"
        try:
            json.loads(f.read(ANSWER_MAX_BYTES + 1).decode("utf-8"))
        except (OSError, ValueError) as exc:
            return f"{ANSWER_PATH} is unreadable or not JSON: {exc}"
    return None


def main(req: SimulationStartRequest) -> SimulationStartResult:
    """Run the agent in the cwd and report, with metrics ``steps``, ``tool_calls``,
    ``format_errors``, ``answer_present``, ``stop_reason``; ValueError for an unknown ``protocol``."""
    workspace = Path.cwd()
    params = LoopParams.from_env_params(req.env_params)
    default_t = req.env_params.get("temperature")
    temperature = (
        req.temperature if req.temperature is not None else None if default_t is None else float(default_t)
    )
    outcome = run_agent(
        openai_client(req),
        model=req.model,
        instruction=str(req.env_params["dataset"]["instruction"]),
        cwd=str(workspace),
        params=params,
        max_steps=req.max_steps,
        temperature=temperature,
    )
    expects_answer = req.env_params.get("answer_file", True) is not False
    answer_error = check_answer(workspace) if expects_answer else None
    failed = answer_error is not None or (not expects_answer and outcome.error is not None)
    logger.info(
        "session %s: %s after %d steps, answer: %s",
        req.session_id,
        outcome.stop_reason,
        outcome.steps,
        answer_error or "present",
    )
    errors = [e for e in (outcome.error, answer_error) if e]
    return SimulationStartResult(
        session_id=req.session_id,
        status="failed"
        if failed
        else "truncated"
        if not expects_answer and outcome.truncated
        else "succeeded",
        step_count=outcome.steps,
        terminated=outcome.finished,
        truncated=outcome.truncated,
        error_text="; ".join(errors) or None,
        error_class=outcome.error_class if failed else None,
        metrics={
            "steps": outcome.steps,
            "tool_calls": outcome.tool_calls,
            "format_errors": outcome.format_errors,
            "answer_present": answer_error is None,
            "stop_reason": outcome.stop_reason,
        },
    )


if __name__ == "__main__":
    run_runtime(main)
