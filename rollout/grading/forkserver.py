"""The grader's fork server (docs/grading.md, "Cost"): one process per ``Grader``, started outside
any sandbox with the grader child's modules loaded, that runs each evaluation in a fresh grader
sandbox without starting an interpreter.

    python -S -s -B forkserver.py FD [helpers]

On the Unix socket FD (``SOCK_SEQPACKET``) each message is a JSON request ``{"argv", "env",
"procs", "cwd"}`` with five fds: the job's pipe, the result pipe, the output pipe, a status pipe
and a hold pipe. ``argv`` is bwrap's command line (``--info-fd 3``, its first process only holding
the sandbox on its stdin, a pipe of the server's side, never the launcher's hold pipe: a process of
the sandbox can open that stdin through ``/proc``), started in a session of its own (``sandbox
<pgid>`` is said) so that it and every process of the sandbox are in the evaluation's cgroups
(``procs``) before it makes anything. Once that first process says the sandbox is set up, a pidfd
of it is taken and the evaluation forked into the sandbox's user, IPC, UTS, network, cgroup, PID
and mount namespaces and its root (``setns``, ``chroot``): it leads a session of its own, drops
every capability (bounding set, ambient, effective, permitted; ``no_new_privs``; the securebits
that keep a later ``execve`` from giving them back), then runs ``rollout.grading.child`` as the
sandbox's child process would, its stdin the job, its stdout and stderr the output pipe, the
result pipe at fd 3. The status pipe gets ``started <pid>`` and then ``exit <wait status>``, or
``error: <why>`` when the sandbox cannot be started or entered. The launcher closing the hold pipe
lets the sandbox go: it is killed (its first process through the pidfd: the PID namespace takes
the rest; bwrap's group), at once if the evaluation still runs, else after its end (until then
bwrap is not reaped: the group's id is the launcher's to kill); the status pipe closes once all of
it is gone.

As root (a process that may ``setns`` a PID namespace) the server does this itself (``_Run``): it
spawns bwrap held at a gate (``--args GATE_FD``, a pipe bwrap reads to its end before it makes
anything) until it has written bwrap's pid into the cgroups, forks the evaluation into the
sandbox's PID namespace (``setns`` for its next child, then back), the evaluation joining the
cgroups and entering the other namespaces itself, and waits for everything through pidfds. Else
(or with ``helpers``) it forks a helper per evaluation that joins the cgroups, starts bwrap, enters
the namespaces and forks the evaluation, as one blocking sequence: ~4 ms more CPU per evaluation.
Stdlib only besides the child and the network helper's ``join_groups``.
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
import selectors
import signal
import socket
import sys
import time
from typing import Any

from rollout.grading import child
from rollout.sandbox.netns_helper import join_groups, kill_group

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
_CLONE_NEWPID = 0x20000000
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
SWEEP_S = 0.05
"""How often the server reaps what it could not on its event while some evaluation waits on that."""
GATE_FD = 5
"""The fd bwrap reads its gate from (``--args``) in a sandbox this server starts itself: a pipe
it closes once bwrap is in the evaluation's cgroups."""


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
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 64) for fd in (job_fd, out_fd, result_fd)]  # out of dup2's way
        for fd, to in zip((high[0], high[1], high[1], high[2]), (0, 1, 2, RESULT_FD), strict=True):
            os.dup2(fd, to)
        os.closerange(RESULT_FD + 1, os.sysconf("SC_OPEN_MAX"))  # the server's (other evaluations')
        _drop_capabilities()
        os.environ.clear()
        os.environ.update(env)
        random.seed()  # not the server's state: each evaluation draws its own numbers
        child.main()
    except BaseException as e:  # noqa: BLE001  # whatever it is, the evaluation ends here
        with contextlib.suppress(BaseException):
            os.write(2, f"rollout-grader: {type(e).__name__}: {e}\n".encode("utf-8", "replace"))
        os._exit(1)
    finally:
        os._exit(0)  # never back into the server's code


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
            kill_group(self.pid)

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


def _namespaces(pid: int) -> tuple[list[tuple[int, int]], list[int], int]:
    """Fds of the namespaces of sandbox process ``pid``, in the order they are entered (the pid
    one among them), the fds to close once entered, and its root's fd."""
    ns = [(os.open(f"/proc/{pid}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC), kind) for name, kind in _NAMESPACES]
    opened = [fd for fd, _ in ns]
    try:
        root = os.open(f"/proc/{pid}/root", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        opened.append(root)
        # the namespaces are owned by the user namespace bwrap made; its process is in a nested one
        # (--disable-userns): enter the owner, then the others, then the nested one
        owner = fcntl.ioctl(ns[1][0], _NS_GET_USERNS)
        opened.append(owner)
    except BaseException:
        for fd in opened:
            os.close(fd)
        raise
    nested = [ns[0][0]] if os.fstat(owner).st_ino != os.fstat(ns[0][0]).st_ino else []
    order = [(owner, _CLONE_NEWUSER), *ns[1:], *((u, _CLONE_NEWUSER) for u in nested)]
    return order, opened, root


def _enter(order: list[tuple[int, int]], root: int, cwd: str) -> None:
    """Enter the namespaces in ``order`` and the sandbox's root, then ``cwd`` in it."""
    for fd, kind in order:
        _check(_LIBC.setns(fd, kind), f"setns {kind:#x}")
    os.fchdir(root)
    os.chroot(".")
    os.chdir(cwd)


def _helper(req: dict[str, Any], fds: list[int]) -> None:
    """Join the cgroups, start the sandbox in them, enter it, fork the evaluation, report its end,
    release the sandbox: never returns."""
    job_fd, result_fd, out_fd, status_fd, hold_fd = fds
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # bwrap dies with this (--die-with-parent)
    sandbox = _Sandbox()
    try:
        os.set_blocking(hold_fd, False)
        join_groups(os.getpid(), req["procs"])  # first: bwrap and every process of the sandbox start in them
        sandbox.start(req, status_fd)
        order, opened, root = _namespaces(sandbox.init_pid)
        _enter(order, root, str(req["cwd"]))
        for fd in opened:
            os.close(fd)
        evaluation = _fork()
    except BaseException as e:  # noqa: BLE001
        os.write(status_fd, f"error: {type(e).__name__}: {e}\n".encode("utf-8", "replace"))
        sandbox.release(hold_fd)
        os._exit(1)
    if evaluation == 0:
        for fd in (status_fd, hold_fd, sandbox.init, sandbox.holding):
            if fd >= 0:
                os.close(fd)
        _evaluation_or_probe(req, job_fd, result_fd, out_fd)
    for fd in (job_fd, result_fd, out_fd):
        os.close(fd)
    os.write(status_fd, f"started {evaluation}\n".encode())
    status = _wait(evaluation, hold_fd, sandbox)
    os.write(status_fd, f"exit {status}\n".encode())
    sandbox.release(hold_fd)
    os._exit(0)


def _evaluation_or_probe(req: dict[str, Any], job_fd: int, result_fd: int, out_fd: int) -> None:
    """In the sandbox: the evaluation, or for the launcher's check (``probe``) only the dropping
    of the capabilities. Never returns."""
    try:
        signal.set_wakeup_fd(-1)  # the server's: a signal here must not write to that fd number
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        if req.get("probe"):  # the launcher's check that this works here: enter, drop, end
            _drop_capabilities()
            os._exit(0)
        _evaluation(job_fd, result_fd, out_fd, dict(req["env"]))
    finally:
        os._exit(1)


def _receive(sock: socket.socket) -> tuple[bytes, list[int]]:
    """One request and its fds, close-on-exec (bwrap, started for it, must hold none of them, nor
    the sandbox after it)."""
    fds = array.array("i")
    msg, anc, _, _ = sock.recvmsg(65536, socket.CMSG_SPACE(5 * fds.itemsize), socket.MSG_CMSG_CLOEXEC)
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    return msg, list(fds)


def _own_pid_namespace(helpers: bool) -> int:
    """An fd of this process's PID namespace when it can run evaluations without helpers (root
    that may ``setns`` a PID namespace, a kernel with pidfds), else -1."""
    if helpers or os.geteuid() != 0:
        return -1
    try:
        home = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return -1
    try:
        os.close(os.pidfd_open(os.getpid()))
        _check(_LIBC.setns(home, _CLONE_NEWPID), "setns pid")  # its own: changes nothing
    except OSError:
        os.close(home)
        return -1
    return home


class _Run:
    """One evaluation this server runs without a helper (module docstring, "As root"): bwrap
    spawned here and held at its gate until it is in the evaluation's cgroups, the evaluation
    forked into the sandbox's PID namespace, both waited for through pidfds. ``ready`` takes the
    events of its fds; once the launcher let the sandbox go and both ended, it closes every fd."""

    def __init__(self, fds: list[int], sel: selectors.BaseSelector, home: int) -> None:
        self.job, self.result, self.out, self.status, self.hold = fds
        self.sel, self.home = sel, home
        self.req: dict[str, Any] = {}
        self.sandbox = _Sandbox()
        self.bwrap = -1  # its pidfd, watched once let go (till then its group is the launcher's)
        self.said_r = self.info_r = -1
        self.said = b""
        self.evaluation, self.evaluation_pid = -1, -1  # the evaluation's pidfd and pid while it runs
        self.let_go = False

    def _say(self, line: str) -> None:
        with contextlib.suppress(OSError):  # the launcher gave the evaluation up
            os.write(self.status, f"{line}\n".encode("utf-8", "replace"))

    def begin(self, msg: bytes) -> None:
        """Start the sandbox; ``error: <why>`` when it cannot be."""
        try:
            os.set_blocking(self.hold, False)
            self.sel.register(self.hold, selectors.EVENT_READ, (self, "hold"))
        except (OSError, ValueError) as e:  # nothing started: done at once
            self._say(f"error: {type(e).__name__}: {e}")
            self.let_go = True
            self.settle()
            return
        try:
            req = json.loads(msg)
            if not isinstance(req, dict):
                raise ValueError("the request is not an object")
            self.req = req
            self._spawn([str(a) for a in req["argv"]])
        except Exception as e:  # noqa: BLE001  # this evaluation's: the server stays
            self._say(f"error: {type(e).__name__}: {e}")

    def _spawn(self, argv: list[str]) -> None:
        """bwrap (``argv``, its ``--info-fd`` 3) in a session of its own, its gate open once it is
        in the evaluation's cgroups; ``sandbox <pgid>`` said."""
        if not argv:
            raise ValueError("no command")
        self.info_r, info_w = os.pipe()
        self.said_r, said_w = os.pipe()  # the first process's stdout and stderr: its line, or bwrap's error
        stdin_r, self.sandbox.holding = os.pipe()  # never the launcher's hold pipe (module docstring)
        gate_r, gate_w = os.pipe()
        try:
            high = [
                fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 64) for fd in (stdin_r, said_w, said_w, info_w, gate_r)
            ]
            try:
                moves = [
                    (os.POSIX_SPAWN_DUP2, fd, to) for fd, to in zip(high, (0, 1, 2, 3, GATE_FD), strict=True)
                ]
                pid = os.posix_spawn(
                    argv[0],
                    [argv[0], "--args", str(GATE_FD), *argv[1:]],
                    dict(self.req["env"]),
                    file_actions=moves,
                    setsid=True,
                )
            finally:
                for fd in high:
                    os.close(fd)
            try:
                self.bwrap = os.pidfd_open(pid)
            except OSError:
                kill_group(pid)
                os.waitpid(pid, 0)
                raise
            self.sandbox.pid = pid
            try:
                join_groups(pid, self.req["procs"])
            except BaseException:
                self.sandbox.kill()  # at the gate: it started nothing
                raise
        finally:
            os.close(gate_w)  # bwrap goes on, in its groups (or reads nothing: it was killed)
            for fd in (stdin_r, said_w, info_w, gate_r):
                os.close(fd)
        os.set_blocking(self.said_r, False)
        os.set_blocking(self.info_r, False)
        self._say(f"sandbox {pid}")
        self.sel.register(self.said_r, selectors.EVENT_READ, (self, "said"))

    def ready(self, what: str) -> None:
        """One event: the sandbox's first line, the launcher letting it go, an end."""
        if what == "said":
            self._said()
        elif what == "hold":
            try:
                gone = _let_go(self.hold)
            except OSError:
                gone = True
            if gone:
                self._release()
        elif what == "exit":
            self.evaluation = self._drop(self.evaluation)  # first: an error below never repeats
            self.reap()
            if self.evaluation_pid > 0:  # ended, not reapable: a process of the sandbox traces it
                self.sandbox.kill()  # the tracer dies with the sandbox; a sweep reaps it then
        else:  # bwrap ended, after the launcher let the sandbox go
            self.bwrap = self._drop(self.bwrap)
            self.reap()
        self.settle()

    def reap(self) -> None:
        """Reap what ended (the evaluation; bwrap once let go), never waiting: a process the
        sandbox traces is reapable only once the tracer let go of it (a later sweep)."""
        if self.evaluation_pid > 0 and self.evaluation < 0:
            try:
                pid, status = os.waitpid(self.evaluation_pid, os.WNOHANG)
            except ChildProcessError:
                pid, status = self.evaluation_pid, -1
            if pid:
                self.evaluation_pid = -1
                if status >= 0:
                    self._say(f"exit {status}")
        if self.let_go and self.sandbox.pid > 0 and self.bwrap < 0:
            try:
                pid, _ = os.waitpid(self.sandbox.pid, os.WNOHANG)
            except ChildProcessError:
                pid = self.sandbox.pid
            if pid:
                self.sandbox.pid = -1

    def waiting(self) -> bool:
        """Whether it waits for an end the kernel may not signal (an evaluation a sandbox's process
        traced; bwrap, whose init waits for what the evaluation made of this server's children)."""
        return (self.evaluation_pid > 0 and self.evaluation < 0) or (self.let_go and self.sandbox.pid > 0)

    def pids(self) -> tuple[int, int]:
        """The evaluation's and bwrap's pids while they are this server's to reap (else -1)."""
        return self.evaluation_pid, self.sandbox.pid

    def fail(self, e: Exception) -> None:
        """An event that raised: this evaluation fails (the launcher then lets its sandbox go)."""
        self._say(f"error: {type(e).__name__}: {e}")
        self.sandbox.kill()

    def _drop(self, fd: int) -> int:
        """Stop watching ``fd`` and close it; -1."""
        if fd >= 0:
            with contextlib.suppress(KeyError):
                self.sel.unregister(fd)
            os.close(fd)
        return -1

    def _said(self) -> None:
        try:
            chunk = os.read(self.said_r, 4096)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        self.said += chunk
        if self.said != b"\n" and chunk and len(self.said) < 4096:
            return  # more to come: the line, or bwrap's error to its end
        self.said_r = self._drop(self.said_r)
        if self.said != b"\n":  # bwrap's error: it ends with the sandbox
            err = " / ".join(self.said.decode("utf-8", "replace").split("\n")).strip(" /")
            self._say(f"error: OSError: {err[-300:] or 'bwrap ended'}")
            return
        try:
            self._fork()
        except Exception as e:  # noqa: BLE001
            self._say(f"error: {type(e).__name__}: {e}")

    def _fork(self) -> None:
        """Fork the evaluation into the sandbox's PID namespace; ``started <pid>`` said."""
        try:
            pid = int(json.loads(os.read(self.info_r, 65536))["child-pid"])  # written before the line
        except (ValueError, KeyError, TypeError, OSError):
            raise OSError("bwrap gave no pid") from None
        self.info_r = self._drop(self.info_r)
        # alive: it holds the sandbox, and nothing of the evaluation runs yet
        self.sandbox.init_pid, self.sandbox.init = pid, os.pidfd_open(pid)
        order, opened, root = _namespaces(pid)
        try:
            pid_ns = next(fd for fd, kind in order if kind == _CLONE_NEWPID)
            _check(_LIBC.setns(pid_ns, _CLONE_NEWPID), "setns pid")  # for this process's next child only
            try:
                child = _fork()
            except BaseException:
                _home(self.home)
                raise
            if child == 0:
                self._evaluate([(fd, kind) for fd, kind in order if kind != _CLONE_NEWPID], root)
            _home(self.home)
        finally:
            for fd in opened:
                os.close(fd)
        self.evaluation_pid = child
        for fd in (self.job, self.result, self.out):
            os.close(fd)
        self.job = self.result = self.out = -1
        try:
            self.evaluation = os.pidfd_open(child)
        except OSError:
            self.sandbox.kill()  # its PID namespace takes the evaluation
            os.waitpid(child, 0)
            self.evaluation_pid = -1
            raise
        self.sel.register(self.evaluation, selectors.EVENT_READ, (self, "exit"))
        self._say(f"started {child}")

    def _evaluate(self, order: list[tuple[int, int]], root: int) -> None:
        """The forked evaluation: its groups (their files are not in the sandbox), the sandbox's
        other namespaces and root, then the evaluation. Never returns."""
        try:
            signal.set_wakeup_fd(-1)  # the server's (module docstring)
            join_groups(0, self.req["procs"])
            _enter(order, root, str(self.req["cwd"]))
        except BaseException as e:  # noqa: BLE001
            self._say(f"error: {type(e).__name__}: {e}")
            os._exit(1)
        _evaluation_or_probe(self.req, self.job, self.result, self.out)  # closes every other fd

    def _release(self) -> None:
        """The launcher let the sandbox go: kill it whole; bwrap is reaped once it ended."""
        self.let_go = True
        self.hold = self._drop(self.hold)
        self.said_r = self._drop(self.said_r)
        self.sandbox.kill()
        if self.bwrap >= 0:
            self.sel.register(self.bwrap, selectors.EVENT_READ, (self, "bwrap"))

    @property
    def done(self) -> bool:
        """Let go, with the evaluation and bwrap reaped: every fd closed."""
        return self.status < 0

    def settle(self) -> None:
        """Once let go, with the evaluation and bwrap reaped: every fd closed."""
        if self.done or not self.let_go or self.evaluation_pid > 0 or self.sandbox.pid > 0:
            return
        for fd in (self.evaluation, self.bwrap, self.hold):
            self._drop(fd)
        self.evaluation = self.bwrap = self.hold = -1
        for fd in (self.info_r, self.sandbox.init, self.sandbox.holding, self.job, self.result, self.out):
            if fd >= 0:
                os.close(fd)
        os.close(self.status)  # last: its end tells the launcher all of it is gone
        self.status = self.info_r = self.sandbox.init = self.sandbox.holding = -1
        self.job = self.result = self.out = -1


def _home(home: int) -> None:
    """This process's own PID namespace for its next children again; it ends when it cannot be
    (a bwrap it started next would be in a sandbox's)."""
    if _LIBC.setns(home, _CLONE_NEWPID) != 0:
        os.write(
            2, f"forkserver: cannot return to its PID namespace: {os.strerror(ctypes.get_errno())}\n".encode()
        )
        os._exit(70)


def _children() -> set[int]:
    """This process's children (it has one thread)."""
    me = os.getpid()
    try:
        with open(f"/proc/{me}/task/{me}/children", "rb") as f:
            return {int(p) for p in f.read().split()}
    except OSError as e:
        if not isinstance(e, FileNotFoundError):
            return set()  # (no fd to spare) the next sweep
        # a kernel without that file: every process's parent
        found = set()
        for name in os.listdir("/proc"):
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    if name.isdigit() and int(f.read().rsplit(b")", 1)[1].split()[1]) == me:
                        found.add(int(name))
            except (OSError, ValueError, IndexError):
                continue
        return found


def _sweep(runs: set[_Run]) -> None:
    """Reap what ended and was not reaped on its event, and any child this server did not make
    (an evaluation's ``clone(CLONE_PARENT)``): until it is reaped, its sandbox's init cannot end."""
    known: set[int] = set()
    for run in list(runs):
        try:
            run.reap()
            run.settle()
        except Exception as e:  # noqa: BLE001  # one evaluation's: the server stays
            run.fail(e)
        if run.done:
            runs.discard(run)
        known.update(run.pids())
    for pid in _children() - known:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def _serve_here(sock: socket.socket, home: int) -> None:
    """Answer requests until the launcher closes its end, each evaluation run by this process."""
    # poll, not epoll: epoll's watches count against a budget per user, which a sandbox's processes
    # (the launcher's uid outside) can use up
    sel = selectors.PollSelector()
    sel.register(sock, selectors.EVENT_READ, None)
    woken_r, woken_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)  # SIGCHLD: a sweep
    signal.set_wakeup_fd(woken_w, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel.register(woken_r, selectors.EVENT_READ, "child")
    runs: set[_Run] = set()
    swept = due = 0.0  # when it last swept; when a sweep is due (0: none)
    while True:
        if any(run.waiting() for run in runs):
            due = due or swept + SWEEP_S
        wait = max(0.0, due - time.monotonic()) if due else (1.0 if runs else None)
        events = sel.select(wait)
        if not events:
            due = due or time.monotonic()  # now and then while evaluations run: what made no sign
        for key, _ in events:
            if sel.get_map().get(key.fd) is not key:
                continue  # unregistered by an earlier event of this batch
            if key.data == "child":
                with contextlib.suppress(BlockingIOError):
                    os.read(woken_r, 4096)
                due = due or swept + SWEEP_S  # at most one sweep per SWEEP_S, however many end
                continue
            if key.data is None:
                msg, fds = _receive(sock)
                if not msg:
                    return
                if len(fds) != 5:
                    for fd in fds:
                        os.close(fd)
                    continue
                run = _Run(fds, sel, home)
                runs.add(run)
                run.begin(msg)
            else:
                run, what = key.data
                try:
                    run.ready(what)
                except Exception as e:  # noqa: BLE001  # one evaluation's: the server stays
                    run.fail(e)
            if run.done:
                runs.discard(run)
        if due and time.monotonic() >= due:
            _sweep(runs)
            swept, due = time.monotonic(), 0.0


def serve(sock: socket.socket, helpers: bool = False) -> None:
    """Answer requests until the launcher closes its end: as root, each evaluation run by this
    process (``_Run``), else (or ``helpers``) by a helper forked for it."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    for name in os.listdir("/proc/self/fd"):  # no fd of this process's reaches a sandbox it starts
        if int(name) > 2:
            with contextlib.suppress(OSError):
                os.set_inheritable(int(name), False)
    home = _own_pid_namespace(helpers)
    if home >= 0:
        _serve_here(sock, home)
        return
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the helpers are reaped by the kernel
    while True:
        msg, fds = _receive(sock)
        if not msg:
            return
        if len(fds) == 5:
            try:
                req = json.loads(msg)
                helper = _fork()
            except (ValueError, OSError) as e:  # a bad request, no process to spare: this evaluation fails
                with contextlib.suppress(OSError):
                    os.write(fds[3], f"error: {type(e).__name__}: {e}\n".encode())
                helper = -1
            if helper == 0:
                sock.close()
                _helper(req, list(fds))
        for fd in fds:
            os.close(fd)


if __name__ == "__main__":
    for _name in PRELOAD:
        importlib.import_module(_name)
    serve(socket.socket(fileno=int(sys.argv[1])), helpers=sys.argv[2:] == ["helpers"])
