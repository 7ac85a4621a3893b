"""Each sandbox's network made before the sandbox, so that the launcher itself listens on the
session's loopback port there (docs/sandbox.md, "Network"): no relay process in the sandbox.

One helper process per launcher process (``rollout/sandbox/netns_helper.py``) makes, per session, a
user namespace and a network namespace with its loopback up and a listening socket on
``127.0.0.1:GATEWAY_PORT`` in it; the launcher gets the socket and both namespaces as fds, serves
the socket (``GatewayBridge``) and starts the sandbox in that network (``nsenter``, then bwrap with
``--share-net``).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import os
import shutil
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from rollout.errors import RolloutError

HELPER = Path(__file__).resolve().with_name("netns_helper.py")
ANSWER_TIMEOUT_S = 30.0
LOW_FDS = 10
"""The fds handed to the sandbox's first command are above this (``dup`` with ``F_DUPFD``), so that
a shell can move them to 3 to 6 without overwriting one of them."""


class NetnsError(RolloutError, RuntimeError):
    """The session's network could not be made (the helper failed or is gone)."""


@dataclass
class SessionNet:
    """One session's network: ``listener`` (listening on the loopback port, for the launcher),
    ``userns`` and ``netns`` (fds, for ``nsenter``). ``close()`` once the sandbox ended."""

    listener: socket.socket
    userns: int
    netns: int
    _closed: bool = field(default=False, repr=False)

    def close(self) -> None:
        """Close the socket and both namespace fds (the namespaces go with their last process)."""
        if self._closed:
            return
        self._closed = True
        self.listener.close()
        for fd in (self.userns, self.netns):
            with contextlib.suppress(OSError):
                os.close(fd)

    def nsenter(self) -> list[str]:
        """The ``nsenter`` command line prefix that runs the rest in this network, the namespaces
        read from fds 4 (user) and 5 (net) of that process."""
        nsenter = tool("nsenter")
        if nsenter is None:
            raise NetnsError("nsenter (util-linux) is missing")
        return [nsenter, "--user=/proc/self/fd/4", "--net=/proc/self/fd/5", "--preserve-credentials", "--"]


@functools.cache
def tool(name: str) -> str | None:
    """``name``'s path on ``PATH``, looked up once per process."""
    return shutil.which(name)


def high_dup(fd: int) -> int:
    """A close-on-exec copy of ``fd`` numbered above :data:`LOW_FDS`."""
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, LOW_FDS)


class NetnsMaker:
    """The helper process and the requests to it. Thread-safe; each request has its own answer socket."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._lock = threading.Lock()
        self._ctl: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    def _start(self) -> socket.socket:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(HELPER), str(theirs.fileno()), str(self.port)],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                start_new_session=True,  # no signal of the launcher's terminal: it ends at EOF
            )
        except OSError as e:
            mine.close()
            raise NetnsError(f"cannot start the network helper: {e}") from e
        finally:
            theirs.close()
        mine.settimeout(5.0)  # a helper that stopped reading fails the request, never blocks the loop long
        self._ctl = mine
        return mine

    def _ask(self, answer: socket.socket) -> None:
        with self._lock:
            for attempt in (1, 2):
                ctl = self._ctl or self._start()
                try:
                    socket.send_fds(ctl, [b"n"], [answer.fileno()])
                    return
                except OSError as e:
                    self._stop()
                    if attempt == 2:
                        raise NetnsError(f"the network helper is gone: {e}") from e

    async def make(self) -> SessionNet:
        """A new session network. Raises NetnsError."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            try:
                self._ask(theirs)
            finally:
                theirs.close()
            loop = asyncio.get_running_loop()
            ready: asyncio.Future[None] = loop.create_future()

            def readable() -> None:
                if not ready.done():
                    ready.set_result(None)

            loop.add_reader(mine.fileno(), readable)
            try:
                await asyncio.wait_for(ready, ANSWER_TIMEOUT_S)
            except TimeoutError as e:
                raise NetnsError(f"the network helper did not answer in {ANSWER_TIMEOUT_S:.0f} s") from e
            finally:
                loop.remove_reader(mine.fileno())
            msg, fds, _, _ = socket.recv_fds(mine, 4096, 3, socket.MSG_CMSG_CLOEXEC)
        finally:
            mine.close()
        if msg == b"ok" and len(fds) == 3:
            return SessionNet(socket.socket(fileno=fds[0]), fds[1], fds[2])
        for fd in fds:
            os.close(fd)
        why = msg.decode("utf-8", "replace").removeprefix("error: ") or "the helper ended without an answer"
        raise NetnsError(f"cannot make the session's network: {why}")

    def _stop(self) -> None:
        if self._ctl is not None:
            self._ctl.close()
            self._ctl = None
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=5)  # it exits at EOF
            if self._proc.poll() is None:
                self._proc.kill()
                self._proc.wait()
            self._proc = None

    def close(self) -> None:
        """Stop the helper (it exits at EOF); sessions made keep their networks."""
        with self._lock:
            self._stop()
