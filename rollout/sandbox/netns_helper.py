"""Makes each sandbox's network ahead of it and starts the sandbox in it (docs/sandbox.md,
"Network"): one process per launcher, outside any sandbox, stdlib only.

    python -I -S netns_helper.py FD PORT

On the Unix socket FD (``SOCK_SEQPACKET``) each message is a kind and its fds. Per message the
helper forks a child that makes a user namespace (the helper's uid and gid mapped to themselves)
and a network namespace it owns, brings that namespace's loopback up and listens on
``127.0.0.1:PORT`` there; the first fd is a socket to answer on.

- ``n`` (one fd): the child answers ``ok`` with three fds (the listening socket, the user
  namespace, the network namespace) and exits: the namespaces live as long as someone holds them.
- ``s`` + a JSON ``{"argv", "rlimits", "procs", "cwd"}`` (optional ``"gate": GATE_FD``; six fds: the
  answer socket, then the command's stdin, stdout, stderr, status pipe and environment file): the
  child answers ``ok`` with the listening socket, starts a session of its own, sets ``rlimits``
  (bytes, soft and hard), joins the cgroups (``procs``: their ``cgroup.procs`` files), enters
  ``cwd`` and starts ``argv`` (``posix_spawn``) with those fds as 0, 1, 2, 3 and ``ENV_FD``, no
  other, an empty environment and ``DEFAULT_SIGNALS`` at their defaults; it answers ``started
  <pgid>`` (the group: itself and the command), waits for the command and answers ``exit <wait
  status>``. A command that cannot start says why on its status pipe (``error: ...``) and ends as
  127. The child dies with the helper, the command with it (bwrap's ``--die-with-parent``); the
  launcher closing the answer socket kills the group.

Run as root, the helper forks nothing for a gated ``s`` (``argv`` is bwrap reading ``--args
GATE_FD`` first, before it starts anything): it makes the network namespace itself (no user
namespace: root needs none), starts ``argv`` from there in a session of its own (the group: the
command alone) and returns to its own network namespace; while bwrap waits at the gate (a pipe
this process holds) it writes bwrap's pid into the cgroups and sets its limits (``prlimit``), then
opens the gate (a failure kills bwrap there) and answers ``started <pgid>``. It waits for every
command at once (pidfds), answers ``exit <wait status>``, kills a command's group when the
launcher closes its answer socket, and answers ``error: ...`` for a command that cannot start. A
forked child costs ~2 ms of CPU more per start (page faults, exit: docs/sandbox.md).

A failure is answered ``error: <why>``. The helper exits at EOF on FD; it ignores SIGINT (a
Ctrl-C is the launcher's to handle). Where it cannot return to its own network namespace it
exits at once (its commands die with it).
"""

import array
import contextlib
import ctypes
import fcntl
import json
import os
import resource
import select
import selectors
import signal
import socket
import struct
import sys

_LIBC = ctypes.CDLL(None, use_errno=True)
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_SIOCSIFFLAGS = 0x8914
_IFF_UP_RUNNING = 0x1 | 0x40
_PR_SET_PDEATHSIG = 1
STATUS_FD = 3
"""Where the command gets the status pipe (bwrap's ``--json-status-fd``)."""
ENV_FD = 6
"""Where the command gets its environment file (bwrap's ``--args``)."""
GATE_FD = 5
"""Where the command gets the gate (bwrap's first ``--args``: empty, read to its end before bwrap
starts anything): held shut until the command has its limits."""
DEFAULT_SIGNALS = (signal.SIGINT, signal.SIGPIPE, signal.SIGXFSZ)
"""Signals Python (or this helper) ignores, which the command gets at their defaults, as any
command a shell starts: a pipe's writer ends when its reader has gone, a file past the size limit
stops its writer, Ctrl-C works."""
_RLIMITS = {"fsize": resource.RLIMIT_FSIZE, "core": resource.RLIMIT_CORE, "as": resource.RLIMIT_AS}


def recv_fds(sock: socket.socket, size: int, max_fds: int) -> tuple[bytes, list[int]]:
    """A message and its fds, close-on-exec (``socket.recv_fds`` drops its ``flags``: its fds are
    inherited by every command started after)."""
    msg, anc, _, _ = sock.recvmsg(size, socket.CMSG_SPACE(max_fds * 4), socket.MSG_CMSG_CLOEXEC)
    fds = array.array("i")
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    return msg, list(fds)


def _unshare(flags: int, what: str) -> None:
    if _LIBC.unshare(flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare({what}): {os.strerror(err)}")


def _listen(port: int) -> socket.socket:
    """This network namespace's loopback up; a socket listening on it."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", _IFF_UP_RUNNING))
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(128)
    return listener


def _network(port: int, uid: int, gid: int) -> socket.socket:
    """This process in a new user and network namespace, its loopback up; the listening socket."""
    _unshare(_CLONE_NEWUSER | _CLONE_NEWNET, "user, net")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
    return _listen(port)


def _make(answer: socket.socket, port: int, uid: int, gid: int) -> None:
    listener = _network(port, uid, gid)
    user = os.open("/proc/self/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    net = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    socket.send_fds(answer, [b"ok"], [listener.fileno(), user, net])


def _spawn(answer: socket.socket, req: dict, fds: list[int], port: int, uid: int, gid: int) -> None:
    """The network, then the command (module docstring), waited for. This process leads a process
    group of its own, the command in it (the launcher kills the group whole); it joins the cgroups
    and takes the limits itself, so that the command starts with them (``posix_spawn``: no copy of
    this process for it). The launcher closing ``answer`` kills the group."""
    listener = _network(port, uid, gid)
    socket.send_fds(answer, [b"ok"], [listener.fileno()])
    listener.close()
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # with the helper (the launcher gone)
    woken_r, woken_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)  # SIGCHLD wakes the wait below
    signal.set_wakeup_fd(woken_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    os.setsid()
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 64) for fd in fds]  # out of the targets' way
    for fd in fds:
        os.close(fd)
    argv = [str(a) for a in req["argv"]]
    try:
        for name, value in req["rlimits"].items():
            resource.setrlimit(_RLIMITS[name], (int(value), int(value)))
        join_groups(os.getpid(), req["procs"])
        os.chdir(str(req["cwd"]))
        moves = [
            (os.POSIX_SPAWN_DUP2, fd, to) for fd, to in zip(high, (0, 1, 2, STATUS_FD, ENV_FD), strict=True)
        ]
        if req.get("gate") == GATE_FD:  # open: the limits are this process's already
            high.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
            moves.append((os.POSIX_SPAWN_DUP2, high[-1], GATE_FD))
        pid = os.posix_spawn(  # every other fd is close-on-exec
            argv[0], argv, {}, file_actions=moves, setsigdef=DEFAULT_SIGNALS
        )
    except OSError as e:  # the status pipe's first line says why (a setup failure)
        why = f"error: cannot start the sandbox: {type(e).__name__}: {e}\n"
        os.write(high[3], why.encode("utf-8", "replace"))
        pid = -1
    finally:
        for fd in high:
            os.close(fd)
    try:
        answer.send(f"started {os.getpid()}".encode())
        if pid < 0:
            answer.send(b"exit 32512")  # 127 << 8: the shell's "cannot run"
            return
        poll = select.poll()  # not select(): this process's fds may be numbered past 1024
        poll.register(answer.fileno(), select.POLLIN)
        poll.register(woken_r, select.POLLIN)
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            ready = [fd for fd, _ in poll.poll()]
            if woken_r in ready:
                os.read(woken_r, 512)
            elif not answer.recv(1):  # the launcher gave the session up
                raise ConnectionError("the launcher closed the answer")
        answer.send(f"exit {status}".encode())
    except BaseException:
        os.killpg(0, signal.SIGKILL)  # the launcher is gone (or this failed): nothing of the session stays
        raise


def _setns(fd: int, kind: int) -> None:
    if _LIBC.setns(fd, kind) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def _own_network() -> int:
    """An fd of this process's network namespace when it can make network namespaces and return
    to its own without a fork (root), and wait through pidfds; else -1."""
    if os.geteuid() != 0:
        return -1
    home = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.close(os.pidfd_open(os.getpid()))  # commands are waited for through pidfds
        _unshare(_CLONE_NEWNET, "net")
        _setns(home, _CLONE_NEWNET)
    except OSError:
        os.close(home)
        return -1
    return home


def join_groups(pid: int, paths: list[str]) -> None:
    """``pid`` into the groups of these ``cgroup.procs`` files (0: the caller)."""
    for path in paths:
        fd = os.open(str(path), os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, str(pid).encode())
        finally:
            os.close(fd)


class _Here:
    """Commands started by this process itself (root: module docstring) and its forked children,
    each waited for through a pidfd."""

    def __init__(self, home: int, port: int) -> None:
        self.home, self.port = home, port
        self.sel = selectors.DefaultSelector()
        self.answers: dict[int, tuple[int, socket.socket | None]] = {}  # pidfd -> (pid, answer or None)

    def spawn(self, answer: socket.socket, req: dict, fds: list[int]) -> None:
        """The network, then the command; ``started`` once this process is back in its own
        network, or ``error``. Raises with nothing started (a bad request: any exception)."""
        argv = [str(a) for a in req["argv"]]
        if not argv:
            raise ValueError("no command")
        high: list[int] = []
        try:
            for fd in fds:  # out of the targets' way
                high.append(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 64))
            moves = [
                (os.POSIX_SPAWN_DUP2, fd, to)
                for fd, to in zip(high, (0, 1, 2, STATUS_FD, ENV_FD), strict=True)
            ]  # this process's own fds are close-on-exec
            _unshare(_CLONE_NEWNET, "net")
            started: tuple[int, int] | None = None
            why = ""
            try:
                listener = _listen(self.port)
                try:
                    socket.send_fds(answer, [b"ok"], [listener.fileno()])
                finally:
                    listener.close()
                try:
                    started = self._start(argv, moves, req)
                except Exception as e:  # noqa: BLE001  # this session's: the command was killed at the gate
                    why = f"error: {type(e).__name__}: {e}"
            finally:
                try:
                    _setns(self.home, _CLONE_NEWNET)
                except OSError as e:
                    if started is not None:
                        kill_group(started[0])
                    _fatal(f"cannot return to its own network: {e}")
        finally:
            for fd in high:
                os.close(fd)
        if started is None:
            answer.send(why.encode("utf-8", "replace")[:4000])
            return
        pid, pidfd = started
        self.answers[pidfd] = (pid, answer)
        self.sel.register(pidfd, selectors.EVENT_READ, "exit")
        try:
            answer.send(f"started {pid}".encode())
        except OSError:  # the launcher gave the session up meanwhile
            self.answers[pidfd] = (pid, None)
            answer.close()
            kill_group(pid)
            return
        self.sel.register(answer, selectors.EVENT_READ, pidfd)

    def _start(self, argv: list[str], moves: list[tuple[int, int, int]], req: dict) -> tuple[int, int]:
        """``argv`` started in this moment's network and in ``cwd``, held at the gate (an fd bwrap
        reads options from, ``--args``, before it starts anything) until it is in the session's
        cgroups and has its limits (else killed there); its pid and a pidfd of it."""
        gate_r, gate_w = os.pipe2(os.O_CLOEXEC)
        try:
            os.chdir(str(req["cwd"]))
            try:
                pid = os.posix_spawn(
                    argv[0],
                    argv,
                    {},
                    file_actions=[*moves, (os.POSIX_SPAWN_DUP2, gate_r, GATE_FD)],
                    setsid=True,
                    setsigdef=DEFAULT_SIGNALS,
                )
            finally:
                os.chdir("/")
            try:
                pidfd = os.pidfd_open(pid)
                try:
                    join_groups(pid, req["procs"])
                    for name, value in req["rlimits"].items():
                        resource.prlimit(pid, _RLIMITS[name], (int(value), int(value)))
                except BaseException:
                    os.close(pidfd)
                    raise
            except BaseException:
                kill_group(pid)
                os.waitpid(pid, 0)
                raise
            return pid, pidfd
        finally:
            os.close(gate_w)  # the command goes on (or reads nothing: it was killed)
            os.close(gate_r)

    def forked(self, pid: int) -> None:
        """A forked child, reaped when it ends."""
        pidfd = os.pidfd_open(pid)
        self.answers[pidfd] = (pid, None)
        self.sel.register(pidfd, selectors.EVENT_READ, "exit")

    def ready(self, key: selectors.SelectorKey) -> None:
        if key.data == "exit":  # a command or child ended
            pid, answer = self.answers.pop(key.fd)
            self.sel.unregister(key.fd)
            os.close(key.fd)
            _, status = os.waitpid(pid, 0)
            if answer is not None:
                self.sel.unregister(answer)
                try:
                    answer.send(f"exit {status}".encode())
                except OSError:
                    pass
                answer.close()
            return
        sock = key.fileobj
        assert isinstance(sock, socket.socket)
        try:
            gone = not sock.recv(1)
        except OSError:
            gone = True
        if gone:  # the launcher gave the session up: its group is killed, waited for as any
            self.sel.unregister(sock)
            sock.close()
            pid = self.answers[key.data][0]
            self.answers[key.data] = (pid, None)
            kill_group(pid)


def kill_group(pgid: int) -> None:
    """SIGKILL process group ``pgid``; one already gone (or not ours) is no error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _fatal(why: str) -> None:
    os.write(2, f"netns_helper: {why}: exiting\n".encode("utf-8", "replace"))
    os._exit(70)


def main(argv: list[str]) -> int:
    ctl = socket.socket(fileno=int(argv[0]))
    ctl.set_inheritable(False)  # never a command's
    port = int(argv[1])
    uid, gid = os.getuid(), os.getgid()
    here = _Here(_own_network(), port)
    if here.home < 0:
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # forked children only: the kernel reaps them
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher's Ctrl-C is its own: this ends at EOF
    here.sel.register(ctl, selectors.EVENT_READ, "ctl")
    while True:
        for key, _ in here.sel.select():
            if here.sel.get_map().get(key.fd) is not key:
                continue  # unregistered by an earlier event of this batch (its command ended)
            if key.data != "ctl":
                try:
                    here.ready(key)
                except Exception as e:  # noqa: BLE001  # one session's: the helper stays
                    os.write(2, f"netns_helper: {type(e).__name__}: {e}\n".encode("utf-8", "replace"))
                continue
            try:
                msg, fds = recv_fds(ctl, 1 << 20, 6)  # past the socket's buffer: never cut
            except InterruptedError:
                continue
            if not msg and not fds:
                return 0  # the launcher is gone
            kind = msg[:1]
            if not ((kind == b"n" and len(fds) == 1) or (kind == b"s" and len(fds) == 6)):
                for fd in fds:
                    os.close(fd)
                continue
            answer = socket.socket(fileno=fds[0])
            try:
                req = json.loads(msg[1:]) if kind == b"s" else {}
            except ValueError:
                req = {}  # answered by the child, as any failure
            if here.home >= 0 and isinstance(req, dict) and req.get("gate") == GATE_FD:
                try:
                    here.spawn(answer, req, fds[1:])
                except Exception as e:  # noqa: BLE001  # this session's: the helper stays
                    os.write(2, f"netns_helper: {type(e).__name__}: {e}\n".encode("utf-8", "replace"))
                    with contextlib.suppress(OSError):
                        answer.send(f"error: {type(e).__name__}: {e}".encode()[:4000])
                    answer.close()
                finally:
                    for fd in fds[1:]:
                        os.close(fd)
                continue
            try:
                child = os.fork()
            except OSError as e:  # no process to spare: this session fails, the helper stays
                with contextlib.suppress(OSError):
                    answer.send(f"error: cannot fork: {e}".encode()[:4000])
                answer.close()
                for fd in fds[1:]:
                    os.close(fd)
                continue
            if child == 0:
                code = 0
                try:
                    ctl.close()
                    if kind == b"n":
                        _make(answer, port, uid, gid)
                    else:
                        _spawn(answer, req or json.loads(msg[1:]), fds[1:], port, uid, gid)
                except BaseException as e:  # noqa: BLE001  # every failure is the answer
                    code = 1
                    try:
                        answer.send(f"error: {type(e).__name__}: {e}".encode()[:4000])
                    except OSError:
                        pass
                os._exit(code)
            if here.home >= 0:
                try:
                    here.forked(child)
                except OSError:  # it cannot be waited for: that session fails, the helper stays
                    os.kill(child, signal.SIGKILL)
                    os.waitpid(child, 0)
            answer.close()
            for fd in fds[1:]:
                os.close(fd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
