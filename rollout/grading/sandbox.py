"""The grader sandbox: one evaluation in a child process under bubblewrap (docs/grading.md).

``evaluate_in_sandbox`` runs ``rollout.grading.child`` in a fresh sandbox per evaluation (forked
into it by the Grader's ``ForkServer`` where it can enter one, else started there): the
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

import array
import asyncio
import contextlib
import functools
import hmac
import json
import logging
import math
import os
import secrets
import signal
import site
import socket
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollout.contract.protocol import EvalRequest, EvalSpec, Trajectory
from rollout.grading import scoring
from rollout.grading.evaluation import EvalStatus, Evaluation
from rollout.sandbox.bwrap import NAMESPACE_FLAGS, WORKSPACE, Binds, SandboxUnavailable, clean_env, proc_args
from rollout.sandbox.cgroups import SessionCgroup
from rollout.sandbox.runner import CODE_ROOT, sandbox_support

RESULT_FD = 3
"""The result pipe's fd in an evaluation the fork server starts (``forkserver.RESULT_FD``)."""
FORKED_INFO_FD = 3
"""bwrap's ``--info-fd`` in a sandbox the fork server's helper starts (it puts the pipe there)."""

MiB = 1024 * 1024
CHILD = Path(__file__).with_name("child.py")
CHILD_PATH = os.pathsep.join([str(CODE_ROOT), *site.getsitepackages()])
"""The child's import path: the project, then the venv's packages. It runs without ``site`` (``-S``:
no ``.pth`` processing, ~20 ms less per evaluation), so packages installed through a ``.pth`` file
(editable installs) are not importable by evaluators in the sandbox."""
FORKSERVER = Path(__file__).with_name("forkserver.py")
ANCHOR = ["/bin/sh", "-c", "echo; read x"]
"""The first process of a sandbox the fork server enters: says the sandbox is set up (a line), then
holds its namespaces until its stdin closes or it is killed."""
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


class _ServerGone(Exception):
    """The fork server cannot be reached, even started again (``reason``), or (``lasting``
    False) gave no answer for this evaluation (it died meanwhile): never the evaluation's failure."""

    def __init__(self, reason: str, lasting: bool = True) -> None:
        super().__init__(reason)
        self.reason, self.lasting = reason, lasting


class _Ended(Exception):
    """The evaluation cannot give a result; ``status`` and ``reason`` say why."""

    def __init__(self, status: EvalStatus, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@functools.lru_cache(maxsize=16)
def _grader_binds(tmp_mb: int, roots: tuple[tuple[Path, Path], ...]) -> tuple[str, ...]:
    """The binds every evaluation of a job shares (the snapshots are the job's), made once."""
    b = Binds()
    b.args += ["--size", str(tmp_mb * MiB), "--tmpfs", "/tmp"]
    b.system()
    b.interpreter()
    b.ro(CODE_ROOT / "rollout")
    if all(host != CODE_ROOT / "env" for _, host in roots):  # else its snapshot is bound there
        b.ro(CODE_ROOT / "env")  # the bundled env package (graders import ``env.*``)
    for snapshot, host in roots:
        b.ro(snapshot, host)
    return tuple(b.args)


def grader_command(
    roots: list[tuple[Path, Path]],
    workspace: Path | None,
    limits: GraderLimits,
    info_fd: int | None = None,
) -> list[str]:
    """The bwrap command line of one evaluation; ``roots`` are (snapshot folder, host path) pairs.
    With ``info_fd`` (the fork server's way) bwrap writes the sandbox's pid there and the sandbox
    runs ``ANCHOR`` instead of the child. Raises SandboxUnavailable."""
    support = sandbox_support()
    return [
        support.bwrap,
        *NAMESPACE_FLAGS,
        *_grader_binds(limits.tmp_mb, tuple(roots)),
        *(["--ro-bind", str(workspace), WORKSPACE] if workspace is not None else []),
        *proc_args(),
        "--dev",
        "/dev",
        "--chdir",
        WORKSPACE if workspace is not None else "/tmp",
        *(["--info-fd", str(info_fd), "--", *ANCHOR] if info_fd is not None else []),
        *(["--", sys.executable, "-S", "-s", "-B", str(CHILD)] if info_fd is None else []),
    ]


async def evaluate_in_sandbox(
    path: Path,
    request: EvalRequest,
    spec: EvalSpec,
    trajectory: Trajectory,
    workspace: Path | None,
    roots: list[tuple[Path, Path]],
    limits: GraderLimits | None = None,
    forks: ForkServer | None = None,
) -> Evaluation:
    """Evaluate one session in the grader sandbox (module docstring). ``path`` is the evaluator
    at its host path (bound from the snapshot in ``roots``); ``workspace`` the host folder shown as
    ``/workspace`` (``request.workspace`` is set to that); ``forks``: the Grader's fork server, used
    when it can enter a sandbox here. Never raises but CancelledError."""
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
    forked = forks is not None and await forks.usable(roots, limits)
    try:
        argv = grader_command(roots, workspace, limits, info_fd=FORKED_INFO_FD if forked else None)
    except SandboxUnavailable as e:
        return outcome("error", 0.0, reason=f"the grader sandbox cannot start: {e}")
    support = sandbox_support()
    cg = support.session_cgroup(limits.memory_mb * MiB, limits.processes)
    rlimits = {"cpu": math.ceil(timeout) + 1, "fsize": limits.tmp_mb * MiB, "core": 0}
    if support.memory is None:
        rlimits["as"] = limits.memory_mb * MiB
    inside = request.model_copy(update={"workspace": WORKSPACE if workspace is not None else None})
    nonce = secrets.token_hex(16)
    job: dict[str, Any] = {
        "evaluator": str(path),
        "request": inside.model_dump(mode="json"),
        "spec": spec.model_dump(mode="json"),
        "trajectory": trajectory.model_dump(mode="json"),
        "rlimits": rlimits,
        "nonce": nonce,
    }
    try:
        cg.create(f"rollout-grade-{request.session_id[:24]}-{uuid.uuid4().hex[:6]}")
    except OSError as e:
        return outcome("error", 0.0, reason=f"the grader sandbox cannot start: cgroup: {e}")
    result_r, result_w = os.pipe()  # handed on with no await between: whoever takes them closes them
    job["result_fd"] = result_w
    try:
        if forked:
            assert forks is not None
            try:
                run = _Forked(forks, argv, workspace, limits, cg)
                value = await run.evaluate(
                    {**job, "result_fd": RESULT_FD}, result_r, result_w, started + timeout, nonce
                )
            except _ServerGone as gone:  # the launcher's failure: this evaluation (or all) the old way
                if gone.lasting:
                    forks.disable(gone.reason)
                else:
                    log.warning("grader: %s: evaluating %s again", gone.reason, request.session_id)
                    started = time.monotonic()  # a fresh evaluation, with its whole time
                    cg.kill_all()
                forked = False
                argv = grader_command(roots, workspace, limits)
                result_r, result_w = os.pipe()
                job["result_fd"] = result_w
        if not forked:
            value = await _run_child(
                cg.joined(argv), job, result_r, result_w, started + timeout, limits, cg, nonce
            )
    except _Ended as e:
        if e.status == "timeout":
            return outcome("timeout", 0.0, reason=f"evaluator timed out after {float(timeout)!r} s")
        return outcome(e.status, 0.0, reason=e.reason)
    except SandboxUnavailable as e:
        return outcome("error", 0.0, reason=f"the grader sandbox cannot start: {e}")
    finally:
        await cg.aremove()
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
    except BaseException:  # cancelled while it started
        os.close(result_r)
        raise
    finally:
        os.close(result_w)
    loop = asyncio.get_running_loop()

    def kill() -> None:
        """Kill the whole sandbox; the readers go on to the end of its pipes (a paused pipe would
        keep ``wait()`` from returning)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        cg.kill_all()

    got = _Collect(limits, kill)

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

    async def whole() -> int:
        assert proc.stdout is not None
        await asyncio.gather(feed(), got.output(proc.stdout), got.results(result_reader))
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
    return got.ending(rc, nonce, cg)


class _Collect:
    """What one evaluation sends back, read to the ends of its pipes: its output's tail and size,
    its framed result, and why it was stopped (``over``); ``kill`` stops the whole sandbox."""

    def __init__(self, limits: GraderLimits, kill: Callable[[], None]) -> None:
        self.limits, self.kill = limits, kill
        self.result, self.tail, self.printed = bytearray(), bytearray(), 0
        self.over: list[str] = []

    def stop(self, why: str | None = None) -> None:
        """Kill the sandbox; ``why`` (the first one kept) makes the evaluation an error."""
        if why is not None and not self.over:
            self.over.append(why)
        self.kill()

    async def output(self, stream: asyncio.StreamReader) -> None:
        """What the grader prints: its tail kept, the sandbox killed past the output limit."""
        while chunk := await stream.read(65536):
            self.printed += len(chunk)
            if self.over:
                continue
            self.tail.extend(chunk)
            del self.tail[:-OUTPUT_TAIL_BYTES]
            if self.printed > self.limits.output_bytes:
                self.stop(f"the grader printed more than {self.limits.output_bytes // MiB} MiB")

    async def results(self, stream: asyncio.StreamReader) -> None:
        """The result channel, the sandbox killed past the result limit."""
        while chunk := await stream.read(65536):
            if self.over:
                continue
            self.result.extend(chunk)
            if len(self.result) > self.limits.result_bytes:
                self.stop(f"the grader's result is larger than {self.limits.result_bytes // MiB} MiB")

    def ending(self, rc: int, nonce: str, cg: SessionCgroup) -> Any:
        """The result of an evaluation that ended (``rc``: its exit code, negative for a signal),
        or _Ended saying why there is none."""
        if self.over:
            raise _Ended("error", self.over[0])
        if self.result:
            return _unframed(bytes(self.result), nonce)
        hit = cg.exceeded()
        if hit == "memory":
            raise _Ended("error", f"the grader exceeded its memory limit ({self.limits.memory_mb} MiB)")
        if hit == "processes":
            raise _Ended("error", f"the grader exceeded its process limit ({self.limits.processes})")
        last = bytes(self.tail).decode("utf-8", "replace").strip().splitlines()[-1:] or ["no output"]
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


log = logging.getLogger(__name__)


@functools.cache
def _child_env() -> dict[str, str]:
    """The grader child's environment, made once per process (never changed by its users)."""
    return clean_env({"PYTHONPATH": CHILD_PATH, "HOME": "/tmp"})


class ForkServer:
    """The Grader's fork server (``rollout.grading.forkserver``): one process, started at the first
    evaluation, that forks each evaluation into its sandbox instead of starting an interpreter
    there. ``usable`` says whether it can enter a sandbox on this machine (checked once, with a
    sandbox of the first evaluation's kind); when it cannot, evaluations start the child as before,
    and the log says why once. ``helpers``: a helper per evaluation even as root (as without root)."""

    def __init__(self, helpers: bool = False) -> None:
        self.helpers = helpers
        self._proc: asyncio.subprocess.Process | None = None
        self._sock: socket.socket | None = None
        self._lock = asyncio.Lock()  # the first start and check
        self._restarting = asyncio.Lock()
        self._checked: bool | None = None
        self.unavailable: str | None = None

    async def _start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-S",
                "-s",
                "-B",
                str(FORKSERVER),
                str(theirs.fileno()),
                *(["helpers"] if self.helpers else []),
                pass_fds=(theirs.fileno(),),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
                start_new_session=True,
                env=_child_env(),
            )
        except OSError:
            ours.close()
            raise
        finally:
            theirs.close()
        self._sock = ours

    async def usable(self, roots: list[tuple[Path, Path]], limits: GraderLimits) -> bool:
        """Whether evaluations go through the server (starts and checks it the first time)."""
        if self._checked is not None:
            return self._checked
        async with self._lock:
            if self._checked is None:
                try:
                    await self._start()
                    cg = SessionCgroup(None, None, None, None)
                    run = _Forked(self, grader_command(roots, None, limits, FORKED_INFO_FD), None, limits, cg)
                    why = await run.probe(time.monotonic() + 30)
                except Exception as e:  # noqa: BLE001  # whatever stops the check: not used here
                    why = f"{type(e).__name__}: {e}"
                self.unavailable = why
                self._checked = why is None
                if why is not None:
                    log.info(
                        "grader: the fork server cannot enter a sandbox here (%s): an interpreter per evaluation",
                        why,
                    )
        return bool(self._checked)

    def disable(self, why: str) -> None:
        """No evaluation goes through the server any more (it cannot be reached: ``why``)."""
        self._checked, self.unavailable = False, why
        log.warning(
            "grader: the fork server cannot be reached (%s): an interpreter per evaluation from now on", why
        )

    async def send(self, request: dict[str, Any], fds: list[int]) -> None:
        """One request and its fds, the server started again once when it is gone (by one caller:
        the others send to the new one); OSError when it cannot be."""
        data = [json.dumps(request).encode()]
        fds_msg = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
        for again in (False, True):
            proc = self._proc
            try:
                if self._sock is None or proc is None or proc.returncode is not None:
                    raise ConnectionError("the grader's fork server is not running")
                self._sock.sendmsg(data, fds_msg)
                return
            except OSError:
                if again:
                    raise
                async with self._restarting:
                    if self._proc is proc:  # nobody started it again meanwhile
                        log.warning("grader: the fork server was gone; starting it again")
                        await self.close()
                        await self._start()

    async def close(self) -> None:
        """Stop the server (it ends when its socket closes; killed if it does not)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._proc is not None and self._proc.returncode is None:
            try:
                await asyncio.wait_for(self._proc.wait(), 5)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self._proc.kill()
                await self._proc.wait()


class _Forked:
    """One evaluation through the fork server, whose helper starts the sandbox (bwrap running
    ``ANCHOR``) in the evaluation's cgroups and enters it; the pipes are read as the child's would
    be. ``kill`` kills the sandbox's process group (while the hold pipe is open the helper keeps
    bwrap unreaped, so the group's id cannot be another's), then closes the hold pipe, which makes
    the helper kill the sandbox whole, reap bwrap and end."""

    def __init__(
        self,
        forks: ForkServer,
        argv: list[str],
        workspace: Path | None,
        limits: GraderLimits,
        cg: SessionCgroup,
    ) -> None:
        """``argv``: the sandbox's bwrap command line (``grader_command`` with ``info_fd=3``)."""
        self.forks, self.argv, self.workspace, self.limits, self.cg = forks, argv, workspace, limits, cg
        self._group: int | None = None  # the sandbox's process group, once the helper says it
        self._hold: int | None = None  # the hold pipe's write end, written never: closed, the sandbox ends

    def kill(self, groups: bool = True) -> None:
        """Kill the sandbox (its PID namespace takes the evaluation and all it started), let the
        helper go, and (``groups``) kill what is left in the groups: their remover does too."""
        if self._group is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._group, signal.SIGKILL)
        if self._hold is not None:
            os.close(self._hold)
            self._hold = None
            self._group = None  # the helper may reap bwrap from now on: never signalled again
        if groups:
            self.cg.kill_all()

    def said(self, line: bytes) -> tuple[str, str]:
        """One status line as (word, rest), ``sandbox <pgid>`` taken note of (never 0 or 1: this
        process's own group, every process)."""
        word, _, rest = line.decode("ascii", "replace").strip().partition(" ")
        if word == "sandbox" and self._hold is not None and rest.isdigit() and int(rest) > 1:
            self._group = int(rest)
        return word, rest

    async def start(self, extra: dict[str, Any], fds: list[int]) -> None:
        """Send the request (``extra`` added; ``fds``: job, result, output, status) with the hold
        pipe. Raises OSError when the server cannot be reached."""
        hold_r, self._hold = os.pipe()
        request = {
            "argv": self.argv,
            "env": _child_env(),
            "cwd": WORKSPACE if self.workspace is not None else "/tmp",
            **extra,
        }
        try:
            await self.forks.send(request, [*fds, hold_r])
        finally:
            os.close(hold_r)

    async def probe(self, deadline: float) -> str | None:
        """Start a sandbox of this kind, enter it, drop the capabilities, run nothing: None when
        that works here, else why not."""
        loop = asyncio.get_running_loop()
        status_r, status_w = os.pipe()
        nulls = [os.open(os.devnull, os.O_RDONLY), *(os.open(os.devnull, os.O_WRONLY) for _ in range(2))]
        try:
            try:
                await self.start({"procs": [], "cwd": "/tmp", "probe": True}, [*nulls, status_w])
            finally:
                for fd in (*nulls, status_w):
                    os.close(fd)
            stream = asyncio.StreamReader()
            status_file = os.fdopen(status_r, "rb", buffering=0)
            status_r = -1
            transport, _ = await loop.connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(stream), status_file
            )
            lines: list[str] = []
            try:
                while line := await asyncio.wait_for(
                    stream.readline(), max(0.0, deadline - time.monotonic())
                ):
                    word, rest = self.said(line)
                    lines.append(f"{word} {rest}".strip())
                    if word in ("exit", "error:"):
                        self.kill()
            finally:
                transport.close()
            if "exit 0" in lines:
                return None
            return next((x.removeprefix("error: ") for x in lines if x.startswith("error: ")), None) or (
                f"the check ended so: {' / '.join(lines) or 'no answer'}"
            )
        except TimeoutError:
            return "no answer in 30 s"
        finally:
            if status_r >= 0:
                os.close(status_r)
            self.kill()

    async def evaluate(
        self, job: dict[str, Any], result_r: int, result_w: int, deadline: float, nonce: str
    ) -> Any:
        """The evaluation's result (as ``_run_child``'s); raises _Ended when there is none, or
        _ServerGone when the fork server cannot be reached. Takes both ends of the result pipe;
        the sandbox is gone when it returns."""
        owned = [result_r, result_w]  # fds still to close here (a transport closes its own)
        transports: list[asyncio.BaseTransport] = []
        try:
            return await self._evaluate(job, owned, transports, deadline, nonce)
        finally:
            for t in transports:
                t.close()
            for fd in owned:
                os.close(fd)
            self.kill(groups=False)  # evaluate_in_sandbox removes the groups next

    async def _evaluate(
        self,
        job: dict[str, Any],
        owned: list[int],
        transports: list[asyncio.BaseTransport],
        deadline: float,
        nonce: str,
    ) -> Any:
        limits, loop = self.limits, asyncio.get_running_loop()
        result_r, result_w = owned
        got = _Collect(limits, self.kill)
        job_r, job_w = os.pipe()
        owned += [job_r, job_w]
        out_r, out_w = os.pipe()
        owned += [out_r, out_w]
        status_r, status_w = os.pipe()
        owned += [status_r, status_w]
        try:
            await self.start({"procs": self.cg.procs_files}, [job_r, result_w, out_w, status_w])
        except OSError as e:
            raise _ServerGone(f"{type(e).__name__}: {e}") from e
        finally:  # the server and its helper hold these now (or nobody does)
            for fd in (job_r, result_w, out_w, status_w):
                owned.remove(fd)
                os.close(fd)

        def opened(fd: int, mode: str) -> Any:
            owned.remove(fd)  # the file object closes it from here on
            return os.fdopen(fd, mode, buffering=0)

        async def reader(fd: int, limit: int) -> asyncio.StreamReader:
            stream = asyncio.StreamReader(limit=limit)
            transport, _ = await loop.connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(stream), opened(fd, "rb")
            )
            transports.append(transport)
            return stream

        job_pipe, _ = await loop.connect_write_pipe(asyncio.Protocol, opened(job_w, "wb"))
        transports.append(job_pipe)
        job_pipe.write(json.dumps(job, ensure_ascii=True).encode("ascii"))
        job_pipe.close()  # written as the evaluation reads it; dropped if it dies first
        output = await reader(out_r, 65536)
        results = await reader(result_r, limits.result_bytes + 1)
        status = await reader(status_r, 65536)
        ended: list[int] = []

        answered: list[str] = []

        async def read_status() -> None:
            while line := await status.readline():
                word, rest = self.said(line)
                if word == "exit":
                    try:
                        ended.append(os.waitstatus_to_exitcode(int(rest)))
                    except ValueError:
                        got.stop(f"the fork server said {line[:100]!r}")
                    self.kill()  # what the evaluation left running dies with the sandbox: the pipes close
                elif word == "error:":
                    got.stop(f"the grader sandbox cannot start: {rest}")
                answered.append(word)

        task = asyncio.ensure_future(asyncio.gather(got.output(output), got.results(results), read_status()))
        try:
            try:
                await asyncio.wait_for(asyncio.shield(task), timeout=max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                raise _Ended("timeout", "timed out") from None
        finally:
            if not task.done():
                got.stop()
                try:
                    await asyncio.wait_for(asyncio.shield(task), PIPE_DRAIN_S)
                except (TimeoutError, _Ended):
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
        if not {"exit", "error:"} & set(answered):  # its status pipe closed with no end said
            raise _ServerGone("the grader's fork server gave no answer for an evaluation", lasting=False)
        rc = ended[0] if ended else -signal.SIGKILL
        return got.ending(128 - rc if rc < 0 else rc, nonce, self.cg)
