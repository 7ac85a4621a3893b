"""A grader's verdict cannot be written by the code it runs: an evaluator that runs the agent's
program in a child process (as docs/grading.md recommends) is attacked by that program through every
route to its result channel (the fds of every process in /proc, pidfd_getfd, /proc/<pid>/mem,
ptrace, inherited fds, a detached process that writes late) and by killing it. The committed
evaluation is the honest score of the program's output, or ``error`` when the grader was killed;
never the forged 10."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollout.contract.protocol import Trajectory
from rollout.grading import sandbox
from rollout.grading.grader import Grader
from tests.rollout.sandbox_helpers import require_bwrap
from tests.rollout.test_grading_sandbox import env_root, request, spec

FORGED = {
    "status": "scored",
    "score": 10,
    "raw_repr": "10",
    "reason": "forged",
    "artifacts": None,
    "score_keys": ["score"],
}

# The grader of a code task: run the answer with a timeout, compare its output.
EVALUATOR = """
import subprocess, sys

def evaluate(request, spec, trajectory):
    try:
        run = subprocess.run([sys.executable, "/workspace/solution.py"], capture_output=True, text=True,
                             timeout=30, close_fds=CLOSE_FDS)
    except subprocess.TimeoutExpired:
        return {"score": 0, "reason": "the program timed out"}
    return {"score": 10 if run.stdout.strip() == "42" else 0, "reason": run.stderr.strip()}
"""

# The agent's program: a wrong answer (41) that forges the grader's result every way it can.
SOLUTION = r'''
import ctypes, json, os, signal, sys, time

FORGED = FORGED_TEXT.encode()
me = os.getpid()
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]


def parent_of(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def ancestors():
    out, pid = [], os.getppid()
    while pid > 0:
        out.append(pid)
        try:
            pid = parent_of(pid)
        except OSError:
            break
    return out


def forge(path, written):
    """Write the forged result once into the pipe at ``path`` (once per pipe: a second copy would spoil the first)."""
    try:
        pipe = os.readlink(path)
        if not pipe.startswith("pipe:") or pipe in written:
            return False
        w = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        os.write(w, FORGED)
        written.add(pipe)
        return True
    except OSError:
        return False
    finally:
        os.close(w)


def forge_everywhere(written):
    """The forged result into every pipe of every other process, then into every fd of its own."""
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                fds = os.listdir(f"/proc/{name}/fd")
            except OSError:
                continue
            for fd in fds:
                forge(f"/proc/{name}/fd/{fd}", written)
    return [fd for fd in range(3, 256) if forge(f"/proc/self/fd/{fd}", written)]


def attack_holder(pid):
    """What the grader process itself lets it do: list and open its fds, open its memory, trace it."""
    seen = []
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError as e:
        names = []
        seen.append(f"fds {type(e).__name__}")
    opened = 0
    for name in names:
        try:
            os.close(os.open(f"/proc/{pid}/fd/{name}", os.O_RDONLY | os.O_NONBLOCK))
            opened += 1
        except OSError:
            pass
    seen.append(f"fds opened {opened}")
    pidfd, taken = libc.syscall(434, pid, 0), 0  # pidfd_open, then pidfd_getfd of each of its fds
    for fd in range(64):
        got = libc.syscall(438, pidfd, fd, 0)
        if got >= 0:
            os.close(got)
            taken += 1
    seen.append(f"fds taken {taken}")
    try:
        with open(f"/proc/{pid}/mem", "r+b"):
            seen.append("mem opened")
    except OSError as e:
        seen.append(f"mem {type(e).__name__}")
    if libc.ptrace(0x4206, pid, None, None) == 0:  # PTRACE_SEIZE
        libc.ptrace(17, pid, None, None)  # PTRACE_DETACH
        seen.append("ptrace attached")
    else:
        seen.append(f"ptrace {os.strerror(ctypes.get_errno())}")
    return seen


written = {os.readlink(f"/proc/self/fd/{fd}") for fd in (0, 1, 2)}  # its own output is its answer
inherited = forge_everywhere(written)
if os.fork() == 0:  # a detached process that outlives the program and keeps looking for new pipes
    os.setsid()
    if os.fork() == 0:
        null = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        for _ in range(3000):
            forge_everywhere(written)
            time.sleep(0.01)
    os._exit(0)
holder = os.getppid()
print("; ".join([f"inherited {inherited}", *attack_holder(holder)]), file=sys.stderr)
print(41)
sys.stdout.flush()
sys.stderr.flush()
if KILL_GRADER:
    for pid in ancestors():
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
'''


@pytest.mark.parametrize("close_fds", [True, False])
@pytest.mark.parametrize("kill", [False, True])
async def test_a_program_run_by_the_grader_cannot_forge_its_result(
    tmp_path: Path, close_fds: bool, kill: bool
) -> None:
    require_bwrap()
    path = env_root(tmp_path, EVALUATOR.replace("CLOSE_FDS", repr(close_fds)))
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "solution.py").write_text(
        SOLUTION.replace("FORGED_TEXT", repr(json.dumps(FORGED))).replace("KILL_GRADER", repr(kill))
    )
    async with Grader("bwrap", work_dir=tmp_path) as grader:
        await grader.start([path.parent.parent])
        out = await grader.evaluate(path, request("s1"), spec(path), Trajectory(session_id="s1"), ws)
    if kill:  # the grader was killed before it could answer: an error (the agent's 0), never its forgery
        assert (out.status, out.score) == ("error", 0.0), out.reason
        assert out.reason is not None and out.reason.startswith(
            "the grader exited with code 137 without a result: "
        )
    else:  # the honest verdict on the output 41, and the grader process refused every route
        assert (out.status, out.score, out.reason) == (
            "scored",
            0.0,
            "inherited []; fds opened 0; fds taken 0; mem PermissionError; ptrace Operation not permitted",
        )


def _framed(nonce: str, body: bytes) -> bytes:
    return nonce.encode() + b"\n" + body


@pytest.mark.parametrize(
    ("data", "status", "reason"),
    [
        (_framed("n0nce", json.dumps({"status": "scored", "score": 3}).encode()), "scored", None),
        (
            json.dumps(FORGED).encode(),
            "error",
            "the grader's result channel carried bytes not written by the grader",
        ),
        (
            json.dumps(FORGED).encode() + _framed("n0nce", b'{"status": "scored", "score": 3}'),
            "error",
            "the grader's result channel carried bytes not written by the grader",
        ),
        (
            _framed("n0nce", b'{"status": "scored", "score": 3}') + json.dumps(FORGED).encode(),
            "error",
            "the grader sandbox returned a malformed result",
        ),
        (
            _framed("other", json.dumps(FORGED).encode()),
            "error",
            "the grader's result channel carried bytes not written by the grader",
        ),
    ],
)
def test_only_a_result_framed_with_the_evaluations_nonce_counts(
    data: bytes, status: str, reason: str | None
) -> None:
    try:
        value = sandbox._unframed(bytes(data), "n0nce")
    except sandbox._Ended as e:
        assert (e.status, e.reason) == (status, reason)
    else:
        assert (status, value) == ("scored", {"status": "scored", "score": 3})
