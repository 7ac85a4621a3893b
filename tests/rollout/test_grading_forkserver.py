"""The grader's fork server spoken to directly, as ``rollout.grading.sandbox`` does: as root it runs
each evaluation itself (no helper process per evaluation); a bad request, or an evaluation the
launcher gives up at any moment, fails that evaluation only and leaves no process or fd behind."""

from __future__ import annotations

import array
import json
import os
import secrets
import select
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from rollout.grading.sandbox import FORKED_INFO_FD, FORKSERVER, GraderLimits, _child_env, grader_command
from tests.rollout.sandbox_helpers import process_parents, require_bwrap

BOTH_WAYS = pytest.mark.parametrize("helpers", [False, True], ids=["server", "helpers"])
DEADLINE_S = 60.0  # far past what any step here takes: only a hang reaches it


class Server:
    """A fork server process and its socket."""

    def __init__(self, helpers: bool) -> None:
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen(
            [sys.executable, "-S", "-s", "-B", str(FORKSERVER), str(theirs.fileno())]
            + (["helpers"] if helpers else []),
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=_child_env(),
        )
        theirs.close()

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def children(self) -> list[int]:
        return [pid for pid, ppid in process_parents().items() if ppid == self.proc.pid]

    def close(self) -> None:
        self.sock.close()
        try:
            self.proc.wait(DEADLINE_S)
        finally:
            if self.proc.returncode is None:
                self.proc.kill()
                self.proc.wait()


class Call:
    """One request and the launcher's ends of its five pipes (job, result, output, status, hold)."""

    def __init__(self, server: Server, msg: bytes) -> None:
        pipes = [os.pipe() for _ in range(5)]
        job, result, out, status, hold = pipes
        theirs = [job[0], result[1], out[1], status[1], hold[0]]
        self.job, self.result, self.out, self.status, self.hold = (
            job[1],
            result[0],
            out[0],
            status[0],
            hold[1],
        )
        try:
            server.sock.sendmsg(
                [msg], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", theirs).tobytes())]
            )
        finally:
            for fd in theirs:
                os.close(fd)

    def line(self) -> str | None:
        """The next status line; None at the end of the pipe."""
        got = b""
        while not got.endswith(b"\n"):
            ready, _, _ = select.select([self.status], [], [], DEADLINE_S)
            assert ready, f"no status from the fork server in {DEADLINE_S} s (so far {got!r})"
            chunk = os.read(self.status, 1)
            if not chunk:
                return got.decode() or None
            got += chunk
        return got.decode().strip()

    def send_job(self, job: dict[str, Any]) -> None:
        """Write the job and close the pipe (the evaluation reads it to its end)."""
        os.write(self.job, json.dumps(job).encode())
        os.close(self.job)
        self.job = os.open(os.devnull, os.O_RDONLY)

    def let_go(self) -> None:
        if self.hold >= 0:
            os.close(self.hold)
            self.hold = -1

    def lines(self, let_go_after: int = 99) -> list[str]:
        """Every status line to the pipe's end, the sandbox let go after ``let_go_after`` lines or
        an ``exit`` / ``error:`` line (as the launcher does)."""
        got: list[str] = []
        if let_go_after == 0:
            self.let_go()
        while (line := self.line()) is not None:
            got.append(line)
            if len(got) >= let_go_after or line.split(" ")[0] in ("exit", "error:"):
                self.let_go()
        return got

    def close(self) -> None:
        self.let_go()
        for fd in (self.job, self.result, self.out, self.status):
            os.close(fd)


def _nspid_depth(pid: int) -> int:
    """How many PID namespaces ``pid`` has a number in (1: only the host's)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return len(line.split()) - 1
    return 1


def _request(tmp_path: Path, code: str, **changes: Any) -> tuple[bytes, dict[str, Any]]:
    """A request for an evaluation of ``code`` (its ``evaluate``) and the job to write to its job pipe."""
    envs = tmp_path / "envs"
    (envs / "t").mkdir(parents=True, exist_ok=True)
    path = envs / "t" / "rule_evaluator.py"
    path.write_text(code)
    req = {
        "argv": grader_command([(envs, envs)], None, GraderLimits(), FORKED_INFO_FD),
        "env": _child_env(),
        "cwd": "/tmp",
        "procs": [],
        **changes,
    }
    job = {
        "evaluator": str(path),
        "request": {"session_id": "s", "env_name": "t", "case_id": "c", "env_params": {}},
        "spec": {"eval_id": "t/rule", "timeout_s": 60.0, "evaluator_path": str(path)},
        "trajectory": {"session_id": "s"},
        "rlimits": {},
        "nonce": secrets.token_hex(8),
        "result_fd": 3,
    }
    return json.dumps(req).encode(), job


def _evaluate(server: Server, msg: bytes, job: dict[str, Any]) -> tuple[list[str], bytes]:
    """The status lines and the result of one evaluation run to its end."""
    call = Call(server, msg)
    try:
        call.send_job(job)
        lines = call.lines()
        result = b""
        while chunk := os.read(call.result, 65536):
            result += chunk
        return lines, result
    finally:
        call.close()


def _settled(server: Server, fds: int) -> None:
    """The server is back to ``fds`` fds with no child left (it reaps what it started)."""
    end = time.monotonic() + DEADLINE_S
    while (server.fds(), server.children()) != (fds, []) and time.monotonic() < end:
        time.sleep(0.05)
    assert (server.fds(), server.children()) == (fds, []), "the fork server kept fds or processes"
    assert server.proc.poll() is None, "the fork server ended"


@BOTH_WAYS
def test_as_root_the_fork_server_forks_each_evaluation_itself_without_a_helper(
    tmp_path: Path, helpers: bool
) -> None:
    """As root the server starts bwrap and forks the evaluation into the sandbox itself: while an
    evaluation runs, the server's children are bwrap and the evaluation (a process of the sandbox's
    PID namespace), not a helper per evaluation (~4 ms of CPU each); ``helpers`` keeps the helper."""
    require_bwrap()
    if os.geteuid() != 0:
        pytest.skip("the fork server runs evaluations itself only as root")
    server = Server(helpers)
    try:
        quick, quick_job = _request(tmp_path / "quick", "def evaluate(r, s, t):\n    return 7\n")
        _evaluate(server, quick, quick_job)
        base = server.fds()
        msg, job = _request(tmp_path, "import time\ndef evaluate(r, s, t):\n    time.sleep(600)\n")
        call = Call(server, msg)
        call.send_job(job)
        assert call.line().startswith("sandbox ")  # type: ignore[union-attr]
        assert call.line().startswith("started ")  # type: ignore[union-attr]
        children = server.children()
        kinds = sorted(
            "bwrap"
            if Path(f"/proc/{pid}/comm").read_text().strip() == "bwrap"
            else f"depth {_nspid_depth(pid)}"
            for pid in children
        )
        assert kinds == (["depth 1"] if helpers else ["bwrap", "depth 2"]), kinds
        call.let_go()  # the launcher's timeout: the sandbox is killed whole
        assert call.lines() == ["exit 9"]  # killed (wait status 9)
        call.close()
        _settled(server, base)
        # no epoll instance: its watches count against a budget of the launcher's uid, which the
        # sandbox's processes share (the uid they map to) and can use up
        held = {
            os.readlink(f"/proc/{server.proc.pid}/fd/{fd}")
            for fd in os.listdir(f"/proc/{server.proc.pid}/fd")
        }
        assert "anon_inode:[eventpoll]" not in held, held
    finally:
        server.close()


BAD = [
    b"not json",
    b"[]",
    {"argv": []},
    {"argv": ["/nonexistent/bwrap", "--version"]},
    {"procs": ["/nonexistent/cgroup.procs"]},
    {"env": None},
    {"argv": ["/bin/sh", "-c", "echo not a sandbox"]},
]


@BOTH_WAYS
@pytest.mark.parametrize("bad", range(len(BAD)))
def test_a_bad_request_fails_that_evaluation_only(tmp_path: Path, helpers: bool, bad: int) -> None:
    """A request the server cannot run is an ``error:`` line for it; the server stays, keeps
    nothing of it, and the next evaluation scores."""
    require_bwrap()
    server = Server(helpers)
    try:
        good, job = _request(tmp_path, "def evaluate(r, s, t):\n    return 7\n")
        lines, result = _evaluate(server, good, job)
        base = server.fds()
        case = BAD[bad]
        msg = case if isinstance(case, bytes) else json.dumps({**json.loads(good), **case}).encode()
        call = Call(server, msg)
        got = call.lines()
        call.close()
        assert any(line.startswith("error: ") for line in got), got
        assert not any(line.startswith("started") for line in got), got
        _settled(server, base)
        lines, result = _evaluate(server, good, job)
        assert lines[-1] == "exit 0" and json.loads(result.partition(b"\n")[2])["score"] == 7.0, (
            lines,
            result,
        )
    finally:
        server.close()


@BOTH_WAYS
def test_evaluations_given_up_at_any_moment_leave_nothing_behind(tmp_path: Path, helpers: bool) -> None:
    """The launcher lets a sandbox go (closes the hold pipe) at once, after ``sandbox``, after
    ``started`` or after ``exit``, for evaluations that end at once or run on, several at a time:
    every sandbox is killed and reaped, the server keeps no fd, and it goes on serving."""
    require_bwrap()
    server = Server(helpers)
    try:
        quick, job = _request(tmp_path, "def evaluate(r, s, t):\n    return 7\n")
        slow, slow_job = _request(
            tmp_path / "slow", "import time\ndef evaluate(r, s, t):\n    time.sleep(600)\n"
        )
        _evaluate(server, quick, job)
        base = server.fds()
        calls: list[tuple[Call, int]] = []
        for i in range(24):
            msg, body = (quick, job) if i % 2 else (slow, slow_job)
            call = Call(server, msg)
            call.send_job(body)
            after = (i // 2) % 4
            calls.append((call, after if i % 2 else min(after, 2)))  # a slow one has no exit to wait for
        for call, after in calls:
            got = call.lines(let_go_after=after)
            call.close()
            assert not any(line.startswith("error:") for line in got) or after == 0, got
        _settled(server, base)
        lines, result = _evaluate(server, quick, job)
        assert lines[-1] == "exit 0" and json.loads(result.partition(b"\n")[2])["score"] == 7.0
    finally:
        server.close()


TRACED = r"""
import ctypes, os, subprocess, sys, time

def evaluate(r, s, t):
    ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: a program it starts may trace it
    tracer = (
        "import ctypes, os, sys, time\n"
        "libc = ctypes.CDLL(None)\n"
        "pid = int(sys.argv[1])\n"
        "libc.ptrace(16, pid, 0, 0)\n"  # PTRACE_ATTACH
        "os.waitpid(pid, 0x40000000)\n"  # __WALL: the attach stop
        "libc.ptrace(7, pid, 0, 0)\n"  # PTRACE_CONT; never waits again: the zombie stays its own
        "time.sleep(3600)\n"
    )
    subprocess.Popen([sys.executable, "-S", "-c", tracer, str(os.getpid())])
    while b"TracerPid:\t0\n" in open("/proc/self/status", "rb").read():
        time.sleep(0.01)
    os._exit(0)
"""


@BOTH_WAYS
def test_an_evaluation_traced_by_its_own_program_stalls_no_other_evaluation(
    tmp_path: Path, helpers: bool
) -> None:
    """An evaluation that a program of its sandbox traces, ending so, is a zombie only its tracer
    can reap until the tracer lets go: the server must not wait for it (one thread serves every
    evaluation), and it still answers that evaluation's end once the sandbox is killed."""
    require_bwrap()
    server = Server(helpers)
    try:
        msg, job = _request(tmp_path / "traced", TRACED)
        traced = Call(server, msg)
        traced.send_job(job)
        assert traced.line().startswith("sandbox ")  # type: ignore[union-attr]
        started = traced.line()
        assert started is not None and started.startswith("started "), started
        pid = int(started.split()[1])
        end = time.monotonic() + DEADLINE_S
        while (
            Path(f"/proc/{pid}/stat").exists()
            and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        ):
            assert time.monotonic() < end, "the traced evaluation never ended"
            time.sleep(0.02)
        quick, quick_job = _request(tmp_path / "quick", "def evaluate(r, s, t):\n    return 7\n")
        lines, result = _evaluate(server, quick, quick_job)  # meanwhile: answered at once
        assert lines[-1] == "exit 0" and json.loads(result.partition(b"\n")[2])["score"] == 7.0, lines
        traced.let_go()  # (a helper waits for this: its evaluation's end never reaches it)
        assert traced.lines() == ["exit 0"]
        traced.close()
    finally:
        server.close()


CLONES = r"""
import ctypes

def evaluate(r, s, t):
    libc = ctypes.CDLL(None)
    for signal in (17, 0, 17, 0):  # SIGCHLD, and no signal at all at their end
        if libc.syscall(56, 0x00008000 | signal, 0, 0, 0, 0) == 0:  # clone(CLONE_PARENT): a sibling
            libc._exit(0)
    return 7
"""


@BOTH_WAYS
def test_processes_an_evaluation_makes_the_servers_children_are_reaped(tmp_path: Path, helpers: bool) -> None:
    """``clone(CLONE_PARENT)`` makes the evaluation's siblings, children of the process that forked
    it: unreaped, they would hold host pids and keep the sandbox's init (which waits for every
    process of its namespace) and so bwrap from ending, the evaluation from ever being done."""
    require_bwrap()
    server = Server(helpers)
    try:
        quick, quick_job = _request(tmp_path / "quick", "def evaluate(r, s, t):\n    return 7\n")
        _evaluate(server, quick, quick_job)
        base = server.fds()
        msg, job = _request(tmp_path, CLONES)
        for _ in range(3):
            lines, result = _evaluate(server, msg, job)
            assert lines[-1] == "exit 0" and json.loads(result.partition(b"\n")[2])["score"] == 7.0, lines
        _settled(server, base)
    finally:
        server.close()
