"""The runtime of a harness session: ``python -m rollout.contract.harness_runtime HARNESS_DIR INSTALL_DIR``.

Run by the launcher in the session's sandbox (cwd = the workspace), like any env runtime: reads
the ``SimulationStartRequest`` on stdin, asks the harness how to start (``Harness.launch``),
writes its files, runs its ``argv`` in the workspace with a private HOME, and prints one
``SimulationStartResult`` line last on stdout with ``metrics = {harness, harness_exit, answer}``.
The CLI's stdout and stderr both go to this process's stderr, which the launcher keeps as the
harness log. Standard library, pydantic and ``rollout.{harness,protocol}`` only.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from rollout.contract.harness import (
    HARNESS_FILE,
    SOLUTION_ENV,
    Harness,
    HarnessContext,
    HarnessLaunch,
    load_harness_file,
)
from rollout.contract.protocol import (
    SimulationStartRequest,
    SimulationStartResult,
    model_from_json,
    model_json,
)

_MISSING = object()
ANSWER_MAX_BYTES = 16 * 1024 * 1024


def _say(text: str) -> None:
    print(f"[harness_runtime] {text}", file=sys.stderr, flush=True)


def context(req: SimulationStartRequest, workspace: Path, home: Path, install_dir: Path) -> HarnessContext:
    """The harness's view of the session: the instruction of the case (the public row: nothing
    hidden), the route, the session URL and key as this process sees them, and the env's params."""
    dataset = req.env_params.get("dataset") or {}
    instruction = dataset.get("instruction")
    if not isinstance(instruction, str):
        raise ValueError("the case has no instruction (a harness runs task-directory envs only)")
    return HarnessContext(
        instruction=instruction,
        model=req.model,
        session_url=req.gateway_base_url,
        api_key=os.environ.get("OPENAI_API_KEY", "sk-rollout-local"),
        workspace=str(workspace),
        home=str(home),
        install_dir=str(install_dir),
        max_steps=req.max_steps,
        temperature=req.temperature,
        params={k: v for k, v in req.env_params.items() if k != "dataset"},
        solution_dir=os.environ.get(SOLUTION_ENV) or None,
        case_id=req.case_id,
        instruction_path=req.instruction_path,
    )


def write_files(launch: HarnessLaunch, workspace: Path, home: Path) -> None:
    """Write ``launch.files``; each path must be absolute and under ``home`` or ``workspace``
    (ValueError otherwise)."""
    for name, text in launch.files.items():
        p = Path(name)
        if (
            not p.is_absolute()
            or ".." in p.parts
            or not (p.is_relative_to(home) or p.is_relative_to(workspace))
        ):
            raise ValueError(f"harness file {name!r}: must be an absolute path under {home} or {workspace}")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")


def read_answer(workspace: Path, answer_path: str) -> tuple[Any, str | None]:
    """(the parsed answer file, None), or (``_MISSING``, why not) when it is absent, outside the
    workspace or not JSON."""
    rel = Path(answer_path)
    if rel.is_absolute() or ".." in rel.parts:
        return _MISSING, f"answer_path {answer_path!r} must be relative to the workspace, without '..'"
    try:
        fd = os.open(workspace / rel, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO planted there must not block
    except FileNotFoundError:
        return _MISSING, f"{answer_path} is missing"
    except OSError as e:
        return _MISSING, f"{answer_path} is unreadable or not JSON: {e}"
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return _MISSING, f"{answer_path} is not a regular file"
        try:
            return json.loads(f.read(ANSWER_MAX_BYTES + 1).decode("utf-8")), None
        except (OSError, ValueError) as e:
            return _MISSING, f"{answer_path} is unreadable or not JSON: {e}"


def run(
    req: SimulationStartRequest, harness: Harness, install_dir: Path, workspace: Path
) -> SimulationStartResult:
    """Launch the harness for ``req`` in ``workspace`` and report what it left. Raises OSError
    when the CLI cannot be started, ValueError for a bad launch (the runtime then prints no
    result: the launcher records why from this process's stderr)."""
    home = Path(tempfile.mkdtemp(prefix="harness-home-"))
    try:
        launch = harness.launch(context(req, workspace, home, install_dir))
        write_files(launch, workspace, home)
        env = {**os.environ, "HOME": str(home), **launch.env}
        _say(f"{harness.name} {harness.version}: {shlex.join(launch.argv)}")
        proc = subprocess.run(
            launch.argv,
            cwd=workspace,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=sys.stderr.fileno(),
            stderr=sys.stderr.fileno(),
            check=False,
        )
    finally:
        shutil.rmtree(home, ignore_errors=True)
    code = proc.returncode
    answer_path = None if req.env_params.get("answer_file", True) is False else launch.answer_path
    if answer_path is None:  # no answer file (the harness's or the env's word): the task's tests grade it
        answer, why = None, None if code == 0 else f"{harness.name} exited with code {code}"
        present = code == 0
    else:
        answer, why = read_answer(workspace, answer_path)
        present = answer is not _MISSING
    _say(f"{harness.name} exited with {code}; answer: {why or 'present'}")
    errors = list(
        dict.fromkeys(e for e in (why, f"{harness.name} exited with code {code}" if code else None) if e)
    )
    return SimulationStartResult(
        session_id=req.session_id,
        status="succeeded" if present else "failed",
        terminated=code == 0,
        error_text="; ".join(errors) or None,
        error_class="upstream_unavailable"
        if not present and code in harness.unavailable_exit_codes
        else None,
        metrics={"harness": harness.name, "harness_exit": code, "answer": answer if present else None},
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point (module docstring). Exit 0 with the result printed; 2 for bad arguments or an
    unreadable start request; 1 when the harness could not be launched (no result printed)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        _say("usage: python -m rollout.contract.harness_runtime HARNESS_DIR INSTALL_DIR")
        return 2
    try:
        req = model_from_json(SimulationStartRequest, sys.stdin.read())
    except ValueError as e:
        _say(f"unreadable start request: {e}")
        return 2
    try:
        harness = load_harness_file(Path(args[0]) / HARNESS_FILE)
        result = run(req, harness, Path(args[1]), Path.cwd())
    except Exception as e:  # the launcher reads why from stderr: the session fails, nothing else
        _say(f"cannot run the harness: {type(e).__name__}: {e}")
        return 1
    sys.stdout.write(model_json(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
