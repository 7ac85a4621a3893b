"""Each sandbox's network made before the sandbox, so that the launcher itself listens on the
session's loopback port there (docs/sandbox.md, "Network"): no relay process in the sandbox.

One helper process per launcher process (``rollout/sandbox/netns_helper.py``) makes, per session, a
user namespace and a network namespace with its loopback up and a listening socket on
``127.0.0.1:GATEWAY_PORT`` in it, and starts the sandbox's command there (``spawn``): the launcher
gets the socket, serves it (``GatewayBridge``) and the command's pipes, its process group and its
end. ``make`` makes a network alone (the first one checks that this works here).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from rollout.errors import RolloutError
from rollout.sandbox.netns_helper import ENV_FD, GATE_FD, STATUS_FD, recv_fds

__all__ = ["ENV_FD", "GATE_FD", "STATUS_FD", "NetnsError", "NetnsMaker", "SessionNet", "Spawned"]

HELPER = Path(__file__).resolve().with_name("netns_helper.py")
ANSWER_TIMEOUT_S = 30.0


class NetnsError(RolloutError, RuntimeError):
    """The session's network could not be made (the helper failed or is gone)."""


@dataclass
class SessionNet:
    """One session's network: ``listener`` (listening on the loopback port, for the launcher),
    ``userns`` and ``netns`` (fds). ``close()`` once done."""

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


@dataclass
class Spawned:
    """A command the helper started in a session network: ``listener`` (the launcher serves it),
    ``pgid`` (its process group, the helper's waiting process leading it) and ``ended()`` (its
    wait status). ``close()`` once it ended: a group still running is killed."""

    listener: socket.socket
    pgid: int
    answer: socket.socket

    async def ended(self) -> int:
        """The command's wait status; SIGKILL's when its waiting process was killed."""
        loop = asyncio.get_running_loop()
        while True:
            msg = await loop.sock_recv(self.answer, 4096)
            if not msg:
                return signal.SIGKILL  # the group was killed (its waiter with it)
            if msg.startswith(b"exit "):
                return int(msg[5:])

    def close(self) -> None:
        """Close the socket and the answer (the helper kills the group if it still runs)."""
        self.listener.close()
        self.answer.close()


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

    def _ask(self, message: bytes, fds: list[int]) -> None:
        with self._lock:
            for attempt in (1, 2):
                ctl = self._ctl or self._start()
                try:
                    socket.send_fds(ctl, [message], fds)
                    return
                except OSError as e:
                    if e.errno == errno.EMSGSIZE:  # this request's: the helper is fine
                        raise NetnsError(f"the request is too large for the network helper: {e}") from e
                    self._stop()
                    if attempt == 2:
                        raise NetnsError(f"the network helper is gone: {e}") from e

    async def make(self) -> SessionNet:
        """A new session network. Raises NetnsError."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            try:
                self._ask(b"n", [theirs.fileno()])
            finally:
                theirs.close()
            msg, fds = await _answer(mine, 3)
        finally:
            mine.close()
        if msg == b"ok" and len(fds) == 3:
            return SessionNet(socket.socket(fileno=fds[0]), fds[1], fds[2])
        raise _failed(msg, fds)

    async def spawn(
        self,
        argv: list[str],
        fds: list[int],
        rlimits: dict[str, int],
        procs: list[str],
        cwd: str,
        *,
        gated: bool = False,
    ) -> Spawned:
        """``argv`` started in a new session network (``netns_helper``, kind ``s``): ``fds`` its
        stdin, stdout, stderr, status pipe and environment file (this process keeps its own
        copies), ``rlimits`` in bytes, ``procs`` the ``cgroup.procs`` files it joins, ``cwd``;
        ``gated``: ``argv`` is bwrap reading ``--args GATE_FD`` first (the helper may then start it
        itself). Raises NetnsError (nothing of it left running); cancelled, it first waits for the
        helper's answer (whether the command started)."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        request = json.dumps(
            {
                "argv": argv,
                "rlimits": rlimits,
                "procs": procs,
                "cwd": cwd,
                **({"gate": GATE_FD} if gated else {}),
            }
        ).encode()
        try:
            try:
                self._ask(b"s" + request, [theirs.fileno(), *fds])
            finally:
                theirs.close()
            try:
                msg, got = await _answer(mine, 1)
            except asyncio.CancelledError:
                await asyncio.shield(_settled(mine))
                raise
            if msg != b"ok" or len(got) != 1:
                raise _failed(msg, got)
            listener = socket.socket(fileno=got[0])
            try:
                try:
                    msg, _ = await _answer(mine, 0)
                except asyncio.CancelledError:
                    await asyncio.shield(_settled(mine))
                    raise
                if not msg.startswith(b"started "):
                    raise _failed(msg, [], "cannot start the sandbox")
                mine.setblocking(False)  # its next answer is read by the event loop
                return Spawned(listener, int(msg[8:]), mine)
            except BaseException:
                listener.close()
                raise
        except BaseException:
            mine.close()  # the helper kills what it started
            raise

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


async def _answer(sock: socket.socket, max_fds: int) -> tuple[bytes, list[int]]:
    """The helper's next answer on ``sock`` and its fds (close-on-exec). Raises NetnsError."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(sock.fileno(), readable)
    try:
        await asyncio.wait_for(ready, ANSWER_TIMEOUT_S)
    except TimeoutError as e:
        raise NetnsError(f"the network helper did not answer in {ANSWER_TIMEOUT_S:.0f} s") from e
    finally:
        loop.remove_reader(sock.fileno())
    return recv_fds(sock, 4096, max(max_fds, 1))


async def _settled(sock: socket.socket) -> None:
    """Read the helper's answers on ``sock`` until it says whether the command started (or ends)."""
    with contextlib.suppress(NetnsError, OSError):
        while True:
            msg, fds = await _answer(sock, 1)
            for fd in fds:
                os.close(fd)
            if msg != b"ok":
                return


def _failed(msg: bytes, fds: list[int], what: str = "cannot make the session's network") -> NetnsError:
    for fd in fds:
        os.close(fd)
    why = msg.decode("utf-8", "replace").removeprefix("error: ") or "the helper ended without an answer"
    return NetnsError(f"{what}: {why}")
