"""Runs inside a session's sandbox (built-in modules only, no project imports; started with
``python -I -S``): listens on 127.0.0.1:PORT, relays each connection to the gateway's Unix socket,
and runs the runtime as its child.

    python -I -S sandbox_forwarder.py [--undumpable] PORT SOCKET STATUS_FD RLIMITS -- COMMAND...

RLIMITS is ``-`` or comma-separated ``NAME=VALUE`` (``fsize``, ``as``, ``core``: bytes; ``cpu``:
seconds), set on the runtime. It writes ``started`` (or ``error: <why>`` when the runtime cannot be started) to
STATUS_FD and exits with the runtime's exit code (128 + N for a runtime killed by signal N). Only
C modules are imported (``_socket``, ``_thread``): a session start pays for no module imports.
``--undumpable`` (the verifier's) first makes the forwarder non-dumpable (``prctl(PR_SET_DUMPABLE,
0)``, through ``ctypes``): what it runs can then neither trace it nor open its ``/proc/<pid>/mem``
or fds, so its exit code stays the runtime's.
"""

import _socket
import _thread
import os
import resource
import sys


def _pump(src: _socket.socket, dst: _socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass  # either side went away: the other side is shut down below
    for s, how in ((dst, _socket.SHUT_WR), (src, _socket.SHUT_RD)):
        try:
            s.shutdown(how)
        except OSError:
            pass


def _serve(listener: _socket.socket, path: str) -> None:
    while True:
        try:
            fd, _ = listener._accept()  # type: ignore[attr-defined]  # the C socket accepts to a bare fd
        except OSError as e:  # e.g. out of file descriptors: report it, keep serving
            os.write(2, f"rollout-sandbox: accept failed: {e}\n".encode())
            continue
        client = _socket.socket(fileno=fd)
        upstream = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            upstream.connect(path)
        except OSError as e:
            os.write(2, f"rollout-sandbox: gateway bridge unreachable: {e}\n".encode())
            client.close()
            upstream.close()
            continue
        _thread.start_new_thread(_pump, (client, upstream))
        _thread.start_new_thread(_pump, (upstream, client))


def _undumpable() -> None:
    import ctypes  # only for --undumpable: a session start imports nothing  # noqa: PLC0415

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_DUMPABLE, 0): {os.strerror(err)}")


def main(argv: list[str]) -> int:
    if argv[0] == "--undumpable":
        _undumpable()
        argv = argv[1:]
    port, path, status_fd, rlimits = int(argv[0]), argv[1], int(argv[2]), argv[3]
    command = argv[argv.index("--") + 1 :]
    os.set_inheritable(status_fd, False)  # the runtime never gets it
    listener = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    listener.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(128)
    _thread.start_new_thread(_serve, (listener, path))
    for item in rlimits.split(",") if rlimits != "-" else []:
        name, _, value = item.partition("=")
        kind = {
            "fsize": resource.RLIMIT_FSIZE,
            "as": resource.RLIMIT_AS,
            "core": resource.RLIMIT_CORE,
            "cpu": resource.RLIMIT_CPU,
        }[name]
        resource.setrlimit(kind, (int(value), int(value)))
    try:
        pid = os.posix_spawnp(command[0], command, os.environ)
    except OSError as e:
        os.write(status_fd, f"error: cannot start runtime {command[:3]}: {e}\n".encode())
        return 127
    os.write(status_fd, b"started\n")
    os.close(status_fd)
    for fd in (0, 1):  # the runtime holds stdin/stdout; the launcher sees EOF when it is done
        os.close(fd)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    rc = os.waitstatus_to_exitcode(status)
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    os._exit(main(sys.argv[1:]))  # _exit: no flush of the closed stdout, relay threads just stop
