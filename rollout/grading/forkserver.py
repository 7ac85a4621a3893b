"""The grader's fork server (docs/grading.md, "Cost"): one process per ``Grader``, started outside
any sandbox with the grader child's modules loaded, that runs each evaluation in a fresh grader
sandbox without starting an interpreter.

    python -S -s -B forkserver.py FD

On the Unix socket FD (``SOCK_SEQPACKET``) each message is a JSON request ``{"argv", "env",
"procs", "cwd"}`` with five fds: the job's pipe, the result pipe, the output pipe, a status pipe
and a hold pipe. For each request the server forks a helper that joins the evaluation's cgroups
(``procs``) and then starts the sandbox in them: ``argv`` is bwrap's command line (``--info-fd 3``,
its first process only holding the sandbox on its stdin, a pipe of the helper's), spawned in a
session of its own (the helper says ``sandbox <pgid>``). Once that process says the sandbox is set
up, the helper takes a pidfd of it, enters the sandbox's user, IPC, UTS, network, cgroup, PID and
mount namespaces and its root (``setns``, ``chroot``), and forks the evaluation itself, a process
of the sandbox's PID namespace: it leads a session of its own, drops every capability (bounding
set, ambient, effective, permitted; ``no_new_privs``; the securebits that keep a later ``execve``
from giving them back), then runs ``rollout.grading.child`` as the sandbox's child process would,
its stdin the job, its stdout and stderr the output pipe, the result pipe at fd 3. The helper
writes ``started <pid>`` and then ``exit <wait status>`` to the status pipe, or ``error: <why>``
when the sandbox cannot be started or entered (or the helper cannot be forked). The launcher
closing the hold pipe lets the sandbox go: the helper kills it (its first process through the
pidfd: the PID namespace takes the rest; bwrap's group), at once if the evaluation still runs,
else after its end (until then the group's id is the launcher's to kill), and reaps bwrap. Stdlib only besides the child.
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import fcntl
import importlib
import json
import os
import random
import select
import signal
import socket
import sys
from typing import Any

from rollout.grading import child

PRELOAD = (
    "inspect",  # the child's ``call_arguments``: ~6 ms of CPU when each evaluation imports it
    "dataclasses",
    "datetime",
    "difflib",
    "hashlib",
    "random",
    "statistics",
    "string",
    "textwrap",
    "unicodedata",
)
"""Standard-library modules imported once here, so that an evaluation (a fork) finds them loaded
instead of importing them in each sandbox (docs/grading.md, "Cost")."""

_LIBC = ctypes.CDLL(None, use_errno=True)
_PYTHON_LIBC = ctypes.PyDLL(None, use_errno=True)  # calls that keep the GIL: ``fork``
_NAMESPACES = (  # entered in this order (the user namespace as the helper says), the mount one last
    ("user", 0x10000000),
    ("ipc", 0x08000000),
    ("uts", 0x04000000),
    ("net", 0x40000000),
    ("cgroup", 0x02000000),
    ("pid", 0x20000000),
    ("mnt", 0x00020000),
)
_CLONE_NEWUSER = 0x10000000
_NS_GET_USERNS = 0xB701  # ioctl: the user namespace that owns a namespace
_PR_SET_PDEATHSIG = 1
_PR_CAPBSET_DROP = 24
_PR_SET_SECUREBITS = 28
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_SECUREBITS_LOCKED_ALL = 0x3F  # noroot, no_setuid_fixup, keep_caps (off) and their locks
_CAP_VERSION_3 = 0x20080522
_CapHeader, _CapData = ctypes.c_uint32 * 2, ctypes.c_uint32 * 6  # capset's arguments, typed once
_CAP_LINES = (b"CapPrm:", b"CapEff:", b"CapBnd:", b"CapAmb:")  # /proc/self/status lines checked
RESULT_FD = 3
"""The result pipe's fd in the evaluation (the job's ``result_fd``)."""


def _fork() -> int:
    """``fork()`` without Python's before- and after-fork work (``os.fork`` runs it): this server and
    its helpers have one thread, so no lock that work re-makes can be held by another, and it
    costs ~0.3 ms of page faults per fork (docs/grading.md, "Cost"). The one at-fork hook that
    matters here, ``random``'s reseed, the evaluation does itself."""
    pid = int(_PYTHON_LIBC.fork())
    if pid < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"fork: {os.strerror(err)}")
    return pid


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _drop_capabilities() -> None:
    """No capability now or after any ``execve`` (what bwrap's ``--cap-drop ALL`` gives the
    sandbox's own processes); raises OSError when one step fails."""
    _check(_LIBC.prctl(_PR_SET_SECUREBITS, _SECUREBITS_LOCKED_ALL, 0, 0, 0), "securebits")
    cap = 0
    while _LIBC.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
        cap += 1
    _check(_LIBC.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "ambient capabilities")
    _check(_LIBC.capset(_CapHeader(_CAP_VERSION_3, 0), _CapData()), "capset")
    _check(_LIBC.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    fd = os.open("/proc/self/status", os.O_RDONLY)
    try:
        status = os.read(fd, 65536)
    finally:
        os.close(fd)
    caps = [line[7:].strip() for line in status.split(b"\n") if line[:7] in _CAP_LINES]
    if len(caps) != 4 or any(int(c, 16) for c in caps):
        raise OSError(f"capabilities left after dropping them: {caps}")


def _evaluation(job_fd: int, result_fd: int, out_fd: int, env: dict[str, str]) -> None:
    """The evaluation process, inside the sandbox: never returns."""
    try:
        os.setsid()  # a group of its own: a kill(0, ...) must not reach the server, helpers, other evaluations
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        _drop_capabilities()
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 64) for fd in (job_fd, out_fd, result_fd)]  # out of dup2's way
        for fd, to in zip((high[0], high[1], high[1], high[2]), (0, 1, 2, RESULT_FD), strict=True):
            os.dup2(fd, to)
        os.closerange(RESULT_FD + 1, os.sysconf("SC_OPEN_MAX"))
        os.environ.clear()
        os.environ.update(env)
        random.seed()  # not the server's state: each evaluation draws its own numbers
        child.main()
    except BaseException as e:  # noqa: BLE001  # whatever it is, the evaluation ends here
        os.write(2, f"rollout-grader: {type(e).__name__}: {e}\n".encode("utf-8", "replace"))
        os._exit(1)
    os._exit(0)


class _Sandbox:
    """The sandbox a helper started: bwrap (``pid``, leading its process group) and a pidfd of the
    sandbox's first process, bwrap's init (killed, its PID namespace takes every process of it)."""

    def __init__(self) -> None:
        self.pid = -1
        self.init = -1  # the pidfd (-1: none yet, or this kernel has none)
        self.init_pid = -1
        self.holding = -1  # the write end of the first process's stdin: it holds until that closes

    def kill(self) -> None:
        """Kill the sandbox whole: its init (through the pidfd, never another process of that
        number), then bwrap's group."""
        if self.init >= 0:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                signal.pidfd_send_signal(self.init, signal.SIGKILL)
        if self.pid > 0:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)

    def start(self, req: dict[str, Any], status_fd: int) -> None:
        """Start the request's bwrap (``argv``, its ``--info-fd`` 3) in a session of its own, its
        first process's stdin a pipe of this helper's own (never the launcher's hold pipe: a process
        of the sandbox can open that stdin through ``/proc``); say ``sandbox <pgid>``; return once
        that process says the sandbox is set up. Raises OSError."""
        info_r, info_w = os.pipe()
        said_r, said_w = os.pipe()  # the first process's stdout and stderr: its line, or bwrap's error
        stdin_r, self.holding = os.pipe()
        try:
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 64) for fd in (stdin_r, said_w, said_w, info_w)]
            try:
                moves = [
                    (os.POSIX_SPAWN_DUP2, fd, to) for to, fd in enumerate(high)
                ]  # the rest: close-on-exec
                argv = [str(a) for a in req["argv"]]
                self.pid = os.posix_spawn(argv[0], argv, dict(req["env"]), file_actions=moves, setsid=True)
            finally:
                for fd in high:
                    os.close(fd)
            os.close(info_w)
            os.close(said_w)
            info_w = said_w = -1
            os.write(status_fd, f"sandbox {self.pid}\n".encode())
            said = b""
            while not said.endswith(b"\n") and (chunk := os.read(said_r, 4096)):
                said += chunk
            if said != b"\n":  # bwrap's error: it ends with the sandbox
                while len(said) < 4096 and (chunk := os.read(said_r, 4096)):
                    said += chunk
                err = " / ".join(said.decode("utf-8", "replace").split("\n")).strip(" /")
                raise OSError(err[-300:] or "bwrap ended")
            try:
                self.init_pid = int(
                    json.loads(os.read(info_r, 65536))["child-pid"]
                )  # written before the line
            except (ValueError, KeyError, TypeError):
                raise OSError("bwrap gave no pid") from None
            # alive: it holds the sandbox, and nothing of the evaluation runs yet
            with contextlib.suppress(OSError):  # a kernel without pidfds: bwrap's group and the cgroups only
                self.init = os.pidfd_open(self.init_pid)
        finally:
            for fd in (info_r, info_w, said_r, said_w, stdin_r):
                if fd >= 0:
                    os.close(fd)

    def release(self, hold_fd: int) -> None:
        """Once the launcher lets the sandbox go (closes its end of the hold pipe), kill it and reap
        bwrap: until then the group's id is the launcher's to kill."""
        while not _let_go(hold_fd):
            select.select([hold_fd], [], [])
        self.kill()
        if self.pid > 0:
            os.waitpid(self.pid, 0)


def _let_go(hold_fd: int) -> bool:
    """Whether the launcher closed its end of the hold pipe (it writes nothing; only this helper
    holds the read end, non-blocking)."""
    try:
        while chunk := os.read(hold_fd, 4096):
            del chunk
    except BlockingIOError:
        return False
    return True


def _wait(evaluation: int, hold_fd: int, sandbox: _Sandbox) -> int:
    """The evaluation's wait status; the sandbox killed as soon as the launcher lets it go (the hold
    pipe closed: a timeout), whatever its processes did to outlive bwrap."""
    woken_r, woken_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)  # SIGCHLD wakes the wait below
    signal.set_wakeup_fd(woken_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    watched = [hold_fd, woken_r]
    while True:
        done, status = os.waitpid(evaluation, os.WNOHANG)
        if done:
            return status
        ready, _, _ = select.select(watched, [], [])
        if woken_r in ready:
            os.read(woken_r, 512)
        if hold_fd in ready and hold_fd in watched and _let_go(hold_fd):
            watched.remove(hold_fd)  # the launcher let the sandbox go
            sandbox.kill()


def _helper(req: dict[str, Any], fds: list[int]) -> None:
    """Join the cgroups, start the sandbox in them, enter it, fork the evaluation, report its end,
    release the sandbox: never returns."""
    job_fd, result_fd, out_fd, status_fd, hold_fd = fds
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # bwrap dies with this (--die-with-parent)
    sandbox = _Sandbox()
    try:
        os.set_blocking(hold_fd, False)
        for path in req["procs"]:  # first: bwrap and every process of the sandbox start in them
            with open(str(path), "w") as f:
                f.write(str(os.getpid()))
        sandbox.start(req, status_fd)
        pid = sandbox.init_pid
        ns = [
            (os.open(f"/proc/{pid}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC), kind)
            for name, kind in _NAMESPACES
        ]
        root = os.open(f"/proc/{pid}/root", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        # the namespaces are owned by the user namespace bwrap made; its process is in a nested one
        # (--disable-userns): enter the owner, then the others, then the nested one
        owner = fcntl.ioctl(ns[1][0], _NS_GET_USERNS)
        users = [owner] + ([ns[0][0]] if os.fstat(owner).st_ino != os.fstat(ns[0][0]).st_ino else [])
        for fd, kind in [(users[0], _CLONE_NEWUSER), *ns[1:], *((u, _CLONE_NEWUSER) for u in users[1:])]:
            _check(_LIBC.setns(fd, kind), f"setns {kind:#x}")
        for fd in {owner, *(fd for fd, _ in ns)}:
            os.close(fd)
        os.fchdir(root)
        os.chroot(".")
        os.close(root)
        os.chdir(str(req["cwd"]))
        evaluation = _fork()
    except BaseException as e:  # noqa: BLE001
        os.write(status_fd, f"error: {type(e).__name__}: {e}\n".encode("utf-8", "replace"))
        sandbox.release(hold_fd)
        os._exit(1)
    if evaluation == 0:
        for fd in (status_fd, hold_fd, sandbox.init, sandbox.holding):
            if fd >= 0:
                os.close(fd)
        if req.get("probe"):  # the launcher's check that this works here: enter, drop, end
            try:
                _drop_capabilities()
            except OSError:
                os._exit(1)
            os._exit(0)
        _evaluation(job_fd, result_fd, out_fd, dict(req["env"]))
    for fd in (job_fd, result_fd, out_fd):
        os.close(fd)
    os.write(status_fd, f"started {evaluation}\n".encode())
    status = _wait(evaluation, hold_fd, sandbox)
    os.write(status_fd, f"exit {status}\n".encode())
    sandbox.release(hold_fd)
    os._exit(0)


def serve(sock: socket.socket) -> None:
    """Answer requests until the launcher closes its end."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the helpers are reaped by the kernel
    while True:
        fds = array.array("i")
        # close-on-exec: bwrap, which the helper starts, must hold none of them (nor the sandbox after it)
        msg, anc, _, _ = sock.recvmsg(65536, socket.CMSG_SPACE(5 * fds.itemsize), socket.MSG_CMSG_CLOEXEC)
        for level, kind, data in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
        if not msg:
            return
        if len(fds) == 5:
            try:
                helper = _fork()
            except OSError as e:  # no process to spare: this evaluation fails, the server stays
                with contextlib.suppress(OSError):
                    os.write(fds[3], f"error: cannot fork the helper: {e}\n".encode())
                helper = -1
            if helper == 0:
                sock.close()
                _helper(json.loads(msg), list(fds))
        for fd in fds:
            os.close(fd)


if __name__ == "__main__":
    for _name in PRELOAD:
        importlib.import_module(_name)
    serve(socket.socket(fileno=int(sys.argv[1])))
