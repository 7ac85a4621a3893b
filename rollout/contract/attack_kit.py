"""What the scripted attacks of ``launcher.py audit`` share inside the sandbox (docs/audit.md): the
start request read from stdin, an answer written every way a grader may read one (the answer
file, a text file, the result line's metrics), the result line printed. Standard library and
``rollout.contract.protocol`` only: bound read-only into every sandbox like the rest of the
contract, and run under the runtime contract (cwd = the workspace).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from rollout.contract.protocol import SimulationStartRequest, SimulationStartResult, model_json

ANSWER_FILE = "outputs/answer.json"
TEXT_FILE = "outputs/answer.txt"


def start() -> SimulationStartRequest:
    """The session's start request, read from stdin."""
    return SimulationStartRequest.model_validate(json.loads(sys.stdin.read()))


def case_row(req: SimulationStartRequest) -> dict[str, Any]:
    """The public case row (hidden fields already removed by the launcher)."""
    row = req.env_params.get("dataset")
    return row if isinstance(row, dict) else {}


def instruction(req: SimulationStartRequest) -> str:
    """The task's text: its ``instruction``, else its ``question`` / ``prompt``, else the whole row."""
    row = case_row(req)
    for key in ("instruction", "question", "prompt", "problem", "input"):
        if isinstance(row.get(key), str):
            return str(row[key])
    return json.dumps(row)


def write(rel: str, data: str | bytes) -> Path:
    """Write ``data`` to ``rel`` under the workspace (folders made), returning its path."""
    p = Path.cwd() / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.is_symlink() or p.exists() and not p.is_dir():
        p.unlink()
    p.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass"))
    return p


def answer_everywhere(answer: Any, text: str | None = None) -> dict[str, Any]:
    """Write ``answer`` as ``outputs/answer.json`` and ``text`` (default: the answer as text) as
    ``outputs/answer.txt``; returns the metrics that carry it on the result line (what the bundled
    runtimes report: ``answer``, ``extracted_answer``, ``completion_text``)."""
    text = text if text is not None else (answer if isinstance(answer, str) else json.dumps(answer))
    write(ANSWER_FILE, json.dumps(answer))
    write(TEXT_FILE, text)
    return {"answer": answer, "extracted_answer": text, "completion_text": text}


def workspace_files(pattern: str = "*") -> list[Path]:
    """Regular files of the workspace matching ``pattern`` (not under ``outputs/`` or ``.git/``)."""
    root = Path.cwd()
    return sorted(
        p
        for p in root.rglob(pattern)
        if p.is_file() and not p.is_symlink() and not {"outputs", ".git"} & set(p.relative_to(root).parts[:1])
    )


def finish(
    req: SimulationStartRequest,
    status: str = "succeeded",
    metrics: dict[str, Any] | None = None,
    **extra: Any,
) -> None:
    """Print the result line (``status``, ``metrics`` and any other field) and exit 0."""
    result = SimulationStartResult(
        session_id=req.session_id,
        status=status,  # type: ignore[arg-type]
        metrics=metrics or {},
        **extra,
    )
    sys.stdout.write(model_json(result) + "\n")
    sys.stdout.flush()
    os._exit(0)
