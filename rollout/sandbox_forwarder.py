"""Runs inside a session's sandbox (standard library only, no project imports; started with
``python -I -S``): listens on 127.0.0.1:PORT, relays each connection to the gateway's Unix socket,
and runs the runtime as its child.

    python -I -S sandbox_forwarder.py PORT SOCKET STATUS_FD RLIMITS -- COMMAND...

RLIMITS is ``-`` or comma-separated ``NAME=BYTES`` (``fsize``, ``as``), set on the runtime.

It writes ``started`` (or ``error: <why>`` when the runtime cannot be started) to STATUS_FD and
exits with the runtime's exit code (128 + N for a runtime killed by signal N).
"""

import os
import resource
import socket
import subprocess
import sys
import threading


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass  # either side went away: the other side is shut down below
    for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
        try:
            s.shutdown(how)
        except OSError:
            pass


def _serve(listener: socket.socket, path: str) -> None:
    while True:
        client, _ = listener.accept()
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(path)
        except OSError as e:
            sys.stderr.write(f"rollout-sandbox: gateway bridge unreachable: {e}\n")
            client.close()
            upstream.close()
            continue
        threading.Thread(target=_pump, args=(client, upstream), daemon=True).start()
        threading.Thread(target=_pump, args=(upstream, client), daemon=True).start()


def main(argv: list[str]) -> int:
    port, path, status_fd, rlimits = int(argv[0]), argv[1], int(argv[2]), argv[3]
    command = argv[argv.index("--") + 1:]
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(128)
    threading.Thread(target=_serve, args=(listener, path), daemon=True).start()
    for item in rlimits.split(",") if rlimits != "-" else []:
        name, _, value = item.partition("=")
        kind = {"fsize": resource.RLIMIT_FSIZE, "as": resource.RLIMIT_AS, "core": resource.RLIMIT_CORE}[name]
        resource.setrlimit(kind, (int(value), int(value)))
    try:
        child = subprocess.Popen(command, close_fds=True)
    except OSError as e:
        os.write(status_fd, f"error: cannot start runtime {command[:3]}: {e}\n".encode())
        return 127
    os.write(status_fd, b"started\n")
    os.close(status_fd)
    for fd in (0, 1):  # the runtime holds stdin/stdout; the launcher sees EOF when it is done
        os.close(fd)
    rc = child.wait()
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    os._exit(main(sys.argv[1:]))  # _exit: no flush of the closed stdout, daemon relays just stop
