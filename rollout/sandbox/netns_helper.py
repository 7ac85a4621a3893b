"""Makes each sandbox's network ahead of it and starts the sandbox in it (docs/sandbox.md,
"Network"): one process per launcher, outside any sandbox, stdlib only.

    python -I -S netns_helper.py FD PORT

On the Unix socket FD (``SOCK_SEQPACKET``) each message is a kind and its fds. Per message the
helper forks a child that makes a user namespace (the helper's uid and gid mapped to themselves)
and a network namespace it owns, brings that namespace's loopback up and listens on
``127.0.0.1:PORT`` there; the first fd is a socket to answer on.

- ``n`` (one fd): the child answers ``ok`` with three fds (the listening socket, the user
  namespace, the network namespace) and exits: the namespaces live as long as someone holds them.
- ``s`` + a JSON ``{"argv", "rlimits", "procs", "cwd"}`` (six fds: the answer socket, then the
  command's stdin, stdout, stderr, status pipe and environment file): the child answers ``ok`` with
  the listening socket, starts a session of its own, sets ``rlimits`` (bytes, soft and hard),
  joins the cgroups (``procs``: their ``cgroup.procs`` files), enters ``cwd`` and starts ``argv``
  (``posix_spawn``) with those fds as 0, 1, 2, 3 and ``ENV_FD``, no other, and an empty
  environment; it answers ``started <pgid>`` (the group: itself and the command), waits for the
  command and answers ``exit <wait status>``. A command that cannot start says why on its status
  pipe (``error: ...``) and ends as 127. The child dies with the helper, the command with it
  (bwrap's ``--die-with-parent``); the launcher closing the answer socket kills the group.

A failure is answered ``error: <why>``. The helper exits at EOF on FD; it ignores SIGINT (a
Ctrl-C is the launcher's to handle).
"""

import ctypes
import fcntl
import json
import os
import resource
import select
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
_RLIMITS = {"fsize": resource.RLIMIT_FSIZE, "core": resource.RLIMIT_CORE, "as": resource.RLIMIT_AS}


def _network(port: int, uid: int, gid: int) -> socket.socket:
    """This process in a new user and network namespace, its loopback up; the listening socket."""
    if _LIBC.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare(user, net): {os.strerror(err)}")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", _IFF_UP_RUNNING))
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(128)
    return listener


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
        for path in req["procs"]:
            with open(str(path), "w") as f:
                f.write(str(os.getpid()))
        os.chdir(str(req["cwd"]))
        moves = [
            (os.POSIX_SPAWN_DUP2, fd, to) for fd, to in zip(high, (0, 1, 2, STATUS_FD, ENV_FD), strict=True)
        ]
        pid = os.posix_spawn(argv[0], argv, {}, file_actions=moves)  # every other fd is close-on-exec
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
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            ready, _, _ = select.select([answer.fileno(), woken_r], [], [])
            if woken_r in ready:
                os.read(woken_r, 512)
            elif not answer.recv(1):  # the launcher gave the session up
                raise ConnectionError("the launcher closed the answer")
        answer.send(f"exit {status}".encode())
    except BaseException:
        os.killpg(0, signal.SIGKILL)  # the launcher is gone (or this failed): nothing of the session stays
        raise


def main(argv: list[str]) -> int:
    ctl = socket.socket(fileno=int(argv[0]))
    port = int(argv[1])
    uid, gid = os.getuid(), os.getgid()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the children
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher's Ctrl-C is its own: this ends at EOF
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(ctl, 65536, 6, socket.MSG_CMSG_CLOEXEC)
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
        if os.fork() == 0:
            code = 0
            try:
                ctl.close()
                if kind == b"n":
                    _make(answer, port, uid, gid)
                else:
                    _spawn(answer, json.loads(msg[1:]), fds[1:], port, uid, gid)
            except BaseException as e:  # noqa: BLE001  # every failure is the answer
                code = 1
                try:
                    answer.send(f"error: {type(e).__name__}: {e}".encode()[:4000])
                except OSError:
                    pass
            os._exit(code)
        answer.close()
        for fd in fds[1:]:
            os.close(fd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
