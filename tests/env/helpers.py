"""Shared helpers for the env tests: load evaluators by path (as the launcher does), build the
evaluator's inputs with the wire types, and run a runtime as a real subprocess."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from rollout.contract.protocol import (
    EvalRequest,
    EvalSpec,
    SimulationStartRequest,
    SimulationStartResult,
    Trajectory,
    TrajectoryStep,
)

REPO = Path(__file__).resolve().parents[2]
ENV_ROOT = REPO / "env"


def load_evaluator(env_name: str) -> ModuleType:
    """Import ``env/<env_name>/rule_evaluator.py`` by file path under a private module name."""
    path = ENV_ROOT / env_name / "rule_evaluator.py"
    spec = importlib.util.spec_from_file_location(f"_test_rule_evaluator_{env_name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def eval_spec(env_name: str) -> EvalSpec:
    return EvalSpec(
        eval_id=f"{env_name}/rule",
        timeout_s=60,
        evaluator_path=str(ENV_ROOT / env_name / "rule_evaluator.py"),
    )


def eval_request(
    env_name: str,
    row: dict[str, Any],
    start_result: SimulationStartResult | None = None,
    workspace: str | None = None,
) -> EvalRequest:
    return EvalRequest(
        job_id="job-1",
        session_id="sess-1",
        env_name=env_name,
        case_id="0",
        group_id="g-1",
        sample_index=0,
        model="m",
        env_params={"dataset": row},
        start_result=start_result,
        workspace=workspace,
    )


def trajectory(*contents: str | None) -> Trajectory:
    """A trajectory with one ok step per content; ``final_response`` = the last non-empty one."""
    steps = [
        TrajectoryStep(seq=i, step_id=i + 1, model="m", endpoint="chat.completions", status="ok", content=c)
        for i, c in enumerate(contents)
    ]
    final = next((c for c in reversed(contents) if c), "")
    return Trajectory(session_id="sess-1", steps=steps, final_response=final)


def start_request(base_url: str, dataset: dict[str, Any], **overrides: Any) -> SimulationStartRequest:
    """A start request for session ``sess-1`` whose gateway prefix is ``<base_url>/sessions/sess-1``."""
    fields: dict[str, Any] = {
        "job_id": "job-1",
        "session_id": "sess-1",
        "agent_name": "test",
        "agent_id": "a-1",
        "group_id": "g-1",
        "gateway_base_url": f"{base_url}/sessions/sess-1",
        "model": "m",
        "env_params": {"dataset": dataset},
    }
    fields.update(overrides)
    return SimulationStartRequest(**fields)


async def run_runtime_file(
    script: Path, request: SimulationStartRequest | str, cwd: Path, timeout_s: float = 60
) -> tuple[int, list[str], str]:
    """Run ``python script`` with the request on stdin; (exit code, stdout lines, stderr text)."""
    payload = request if isinstance(request, str) else request.model_dump_json()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(script),
        cwd=cwd,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(payload.encode()), timeout_s)
    assert proc.returncode is not None
    return proc.returncode, out.decode().splitlines(), err.decode()


def last_result(stdout_lines: list[str]) -> SimulationStartResult:
    """The ``SimulationStartResult`` on the last stdout line."""
    return SimulationStartResult.model_validate(json.loads(stdout_lines[-1]))
