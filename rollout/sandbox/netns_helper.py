"""Makes each sandbox's network ahead of it (docs/sandbox.md, "Network"): one process per launcher,
outside any sandbox, stdlib only.

    python -I -S netns_helper.py FD PORT

On the Unix socket FD (``SOCK_SEQPACKET``) each message carries one fd: a socket to answer on. Per
message the helper forks a child that makes a user namespace (the helper's uid and gid mapped to
themselves) and a network namespace it owns, brings that namespace's loopback up, listens on
``127.0.0.1:PORT`` there, and answers ``ok`` with three fds (the listening socket, the user
namespace, the network namespace), or ``error: <why>``. The child then exits: the namespaces live
as long as someone holds them. The helper exits at EOF on FD; it ignores SIGINT (a Ctrl-C is the
launcher's to handle).
"""

import ctypes
import fcntl
import os
import signal
import socket
import struct
import sys

_LIBC = ctypes.CDLL(None, use_errno=True)
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_SIOCSIFFLAGS = 0x8914
_IFF_UP_RUNNING = 0x1 | 0x40


def _make(answer: socket.socket, port: int, uid: int, gid: int) -> None:
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
    user = os.open("/proc/self/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    net = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    socket.send_fds(answer, [b"ok"], [listener.fileno(), user, net])


def main(argv: list[str]) -> int:
    ctl = socket.socket(fileno=int(argv[0]))
    port = int(argv[1])
    uid, gid = os.getuid(), os.getgid()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the children
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher's Ctrl-C is its own: this ends at EOF
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(ctl, 64, 1)
        except InterruptedError:
            continue
        if not msg and not fds:
            return 0  # the launcher is gone
        if len(fds) != 1:
            for fd in fds:
                os.close(fd)
            continue
        answer = socket.socket(fileno=fds[0])
        if os.fork() == 0:
            code = 0
            try:
                ctl.close()
                _make(answer, port, uid, gid)
            except BaseException as e:  # noqa: BLE001  # every failure is the answer
                code = 1
                try:
                    answer.send(f"error: {type(e).__name__}: {e}".encode()[:4000])
                except OSError:
                    pass
            os._exit(code)
        answer.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
