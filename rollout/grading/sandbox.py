"""The grader sandbox: one evaluation in a child process under bubblewrap (docs/grading.md).

``evaluate_in_sandbox`` runs ``rollout.grading.child`` in a fresh sandbox per evaluation: the
system folders and the interpreter read-only, the project's ``rollout`` and ``env`` packages
read-only (graders anywhere may import ``env.*``), each env root read-only from the job's snapshot
(bound at its host path, so ``spec.evaluator_path`` is the same string inside), the session's workspace copy read-only at ``/workspace``, a private ``/tmp``,
no network, a clean environment, memory and process caps (cgroups when there are, else
``RLIMIT_AS``), CPU-time and file-size limits, output counted. At the timeout the whole sandbox
is killed (its process group, its cgroups; the pid namespace takes the rest). The result comes on
a pipe of its own, framed with a nonce of this evaluation that only the child's own code holds
(it is non-dumpable, the pipe close-on-exec: programs the evaluator starts cannot reach either).
Whatever the child does, the answer is an ``Evaluation``: nothing raises but cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import math
import os
import secrets
import signal
import site
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollout.contract.protocol import EvalRequest, EvalSpec, Trajectory
from rollout.grading import scoring
from rollout.grading.evaluation import EvalStatus, Evaluation
from rollout.sandbox.bwrap import NAMESPACE_FLAGS, WORKSPACE, Binds, SandboxUnavailable, clean_env
from rollout.sandbox.cgroups import SessionCgroup
from rollout.sandbox.runner import CODE_ROOT, sandbox_support

MiB = 1024 * 1024
CHILD = Path(__file__).with_name("child.py")
CHILD_PATH = os.pathsep.join([str(CODE_ROOT), *site.getsitepackages()])
"""The child's import path: the project, then the venv's packages. It runs without ``site`` (``-S``:
no ``.pth`` processing, ~20 ms less per evaluation), so packages installed through a ``.pth`` file
(editable installs) are not importable by evaluators in the sandbox."""
PIPE_DRAIN_S = 10.0
"""After the sandbox is killed, how long its pipes may take to close before they are dropped."""
OUTPUT_TAIL_BYTES = 4096
"""How much of the grader's own output (stdout and stderr) is kept for the reason of a failure."""


@dataclass(frozen=True)
class GraderLimits:
    """One evaluation's limits: memory (MiB), processes, bytes it may print, its ``/tmp`` (MiB)
    and the bytes of its result."""

    memory_mb: int = 2048
    processes: int = 64
    output_bytes: int = 16 * MiB
    tmp_mb: int = 256
    result_bytes: int = 4 * MiB


class _Ended(Exception):
    """The evaluation cannot give a result; ``status`` and ``reason`` say why."""

    def __init__(self, status: EvalStatus, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def grader_command(roots: list[tuple[Path, Path]], workspace: Path | None, limits: GraderLimits) -> list[str]:
    """The bwrap command line of one evaluation; ``roots`` are (snapshot folder, host path) pairs.
    Raises SandboxUnavailable."""
    support = sandbox_support()
    b = Binds()
    b.args += ["--size", str(limits.tmp_mb * MiB), "--tmpfs", "/tmp"]
    b.system()
    b.interpreter()
    b.ro(CODE_ROOT / "rollout")
    b.ro(CODE_ROOT / "env")  # the bundled env package (graders import ``env.*``); a snapshot of it covers it
    for snapshot, host in roots:
        b.ro(snapshot, host)
    if workspace is not None:
        b.ro(workspace, WORKSPACE)
    return [
        support.bwrap,
        *NAMESPACE_FLAGS,
        *b.args,
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--chdir",
        WORKSPACE if workspace is not None else "/tmp",
        "--",
        sys.executable,
        "-S",
        "-s",
        "-B",
        str(CHILD),
    ]


async def evaluate_in_sandbox(
    path: Path,
    request: EvalRequest,
    spec: EvalSpec,
    trajectory: Trajectory,
    workspace: Path | None,
    roots: list[tuple[Path, Path]],
    limits: GraderLimits | None = None,
) -> Evaluation:
    """Evaluate one session in the grader sandbox (module docstring). ``path`` is the evaluator
    at its host path (bound from the snapshot in ``roots``); ``workspace`` the host folder shown as
    ``/workspace`` (``request.workspace`` is set to that). Never raises but CancelledError."""
    limits = limits or GraderLimits()
    started = time.monotonic()
    timeout = spec.timeout_s

    def outcome(status: EvalStatus, score: float | None, **kw: Any) -> Evaluation:
        reason = kw.pop("reason", None)
        return Evaluation(
            status=status,
            score=score,
            reason=None if reason is None else scoring.cut_text(reason),
            duration_s=time.monotonic() - started,
            isolation="bwrap",
            **kw,
        )

    if not (isinstance(timeout, int | float) and math.isfinite(timeout) and timeout > 0):
        return outcome("error", 0.0, reason=f"ValueError: invalid evaluator timeout_s {timeout!r}")
    try:
        argv = grader_command(roots, workspace, limits)
    except SandboxUnavailable as e:
        return outcome("error", 0.0, reason=f"the grader sandbox cannot start: {e}")
    support = sandbox_support()
    cg = SessionCgroup(support.memory, support.pids, limits.memory_mb * MiB, limits.processes)
    rlimits = {"cpu": math.ceil(timeout) + 1, "fsize": limits.tmp_mb * MiB, "core": 0}
    if support.memory is None:
        rlimits["as"] = limits.memory_mb * MiB
    inside = request.model_copy(update={"workspace": WORKSPACE if workspace is not None else None})
    result_r, result_w = os.pipe()
    nonce = secrets.token_hex(16)
    job = {
        "evaluator": str(path),
        "request": inside.model_dump(mode="json"),
        "spec": spec.model_dump(mode="json"),
        "trajectory": trajectory.model_dump(mode="json"),
        "rlimits": rlimits,
        "result_fd": result_w,
        "nonce": nonce,
    }
    try:
        await asyncio.to_thread(cg.create, f"rollout-grade-{request.session_id[:24]}-{uuid.uuid4().hex[:6]}")
    except OSError as e:
        os.close(result_r)
        os.close(result_w)
        return outcome("error", 0.0, reason=f"the grader sandbox cannot start: cgroup: {e}")
    try:
        value = await _run_child(
            cg.joined(argv), job, result_r, result_w, started + timeout, limits, cg, nonce
        )
    except _Ended as e:
        if e.status == "timeout":
            return outcome("timeout", 0.0, reason=f"evaluator timed out after {float(timeout)!r} s")
        return outcome(e.status, 0.0, reason=e.reason)
    finally:
        await asyncio.shield(asyncio.to_thread(cg.remove))
    return _checked(value, outcome)


async def _run_child(
    argv: list[str],
    job: dict[str, Any],
    result_r: int,
    result_w: int,
    deadline: float,
    limits: GraderLimits,
    cg: SessionCgroup,
    nonce: str,
) -> Any:
    """Start the child, feed it the job, collect its result; raise _Ended when there is none."""
    env = clean_env({"PYTHONPATH": CHILD_PATH, "HOME": "/tmp"})
    payload = json.dumps(job, ensure_ascii=True).encode("ascii")
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            pass_fds=(result_w,),
            start_new_session=True,
            env=env,
        )
    except OSError as e:
        os.close(result_r)
        raise _Ended("error", f"the grader sandbox cannot start: {e}") from e
    finally:
        os.close(result_w)
    loop = asyncio.get_running_loop()
    result = bytearray()
    tail = bytearray()
    printed = [0]
    over: list[str] = []

    def kill(why: str | None = None) -> None:
        """Kill the whole sandbox; the readers go on to the end of its pipes (a paused pipe would
        keep ``wait()`` from returning)."""
        if why is not None and not over:
            over.append(why)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        cg.kill_all()

    result_file = os.fdopen(result_r, "rb", buffering=0)
    result_reader = asyncio.StreamReader(limit=limits.result_bytes + 1)
    result_pipe, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(result_reader), result_file
    )

    async def feed() -> None:
        assert proc.stdin is not None
        with contextlib.suppress(ConnectionError):
            proc.stdin.write(payload)
            await proc.stdin.drain()
            proc.stdin.close()

    async def read_output() -> None:
        assert proc.stdout is not None
        while chunk := await proc.stdout.read(65536):
            printed[0] += len(chunk)
            if over:
                continue
            tail.extend(chunk)
            del tail[:-OUTPUT_TAIL_BYTES]
            if printed[0] > limits.output_bytes:
                kill(f"the grader printed more than {limits.output_bytes // MiB} MiB")

    async def read_result() -> None:
        while chunk := await result_reader.read(65536):
            if over:
                continue
            result.extend(chunk)
            if len(result) > limits.result_bytes:
                kill(f"the grader's result is larger than {limits.result_bytes // MiB} MiB")

    async def whole() -> int:
        await asyncio.gather(feed(), read_output(), read_result())
        return await proc.wait()

    task = asyncio.ensure_future(whole())
    try:
        try:
            rc = await asyncio.wait_for(task, timeout=max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            raise _Ended("timeout", "timed out") from None
    finally:
        if not task.done():  # timed out or cancelled: kill, then let the readers reach the pipes' end
            kill()
            try:
                await asyncio.shield(asyncio.wait_for(asyncio.shield(task), PIPE_DRAIN_S))
            except (TimeoutError, _Ended):
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        result_pipe.close()  # closes result_file too
    if over:
        raise _Ended("error", over[0])
    if result:
        return _unframed(bytes(result), nonce)
    hit = cg.exceeded()
    if hit == "memory":
        raise _Ended("error", f"the grader exceeded its memory limit ({limits.memory_mb} MiB)")
    if hit == "processes":
        raise _Ended("error", f"the grader exceeded its process limit ({limits.processes})")
    last = bytes(tail).decode("utf-8", "replace").strip().splitlines()[-1:] or ["no output"]
    how = f"was killed by signal {-rc}" if rc < 0 else f"exited with code {rc}"
    raise _Ended("error", f"the grader {how} without a result: {last[0][-300:]}")


def _unframed(data: bytes, nonce: str) -> Any:
    """The JSON value of a result framed as ``nonce``, newline, JSON; raises _Ended (an error)
    for bytes that do not start with this evaluation's nonce or are not one JSON value after it."""
    head, sep, body = data.partition(b"\n")
    if not sep or not hmac.compare_digest(head, nonce.encode("ascii")):
        raise _Ended("error", "the grader's result channel carried bytes not written by the grader")
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        raise _Ended("error", "the grader sandbox returned a malformed result") from None


def _checked(value: Any, outcome: Any) -> Evaluation:
    """The child's answer as an Evaluation, its shape and score checked again here."""
    if not isinstance(value, dict) or value.get("status") not in ("scored", "invalid_reward", "error"):
        return outcome("error", 0.0, reason="the grader sandbox returned a malformed result")
    status = value["status"]
    score = value.get("score")
    if status == "scored":
        check = scoring.normalize_score(score)
        if check.status != "scored" or isinstance(score, bool) or not isinstance(score, int | float):
            return outcome("error", 0.0, reason="the grader sandbox returned a malformed score")
        score = check.score
    else:
        score = 0.0
    artifacts = value.get("artifacts")
    text = {k: value.get(k) if isinstance(value.get(k), str) else None for k in ("raw_repr", "reason")}
    keys = value.get("score_keys")
    keys = [k for k in keys if k in scoring.SCORE_KEYS] if isinstance(keys, list) else []
    return outcome(
        status,
        score,
        raw_repr=text["raw_repr"],
        reason=text["reason"],
        artifacts=artifacts if isinstance(artifacts, dict) else None,
        score_keys=keys,
    )
