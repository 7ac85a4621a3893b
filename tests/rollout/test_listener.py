"""The exit codes and messages of the launcher's server commands (viewer, feed, serve), the Host names
they answer and their request-head timeout (real processes, raw sockets)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rollout.cli.verbs import run_command
from rollout.servers.listener import listen
from store import Store

REPO = Path(__file__).resolve().parents[2]
GENEROUS_S = 30.0  # bound for "the server closed it": far above the 1 s timeouts configured


class Broken(Exception):
    pass


def test_run_command_exit_codes_and_messages(capsys: pytest.CaptureFixture[str]) -> None:
    busy = listen("127.0.0.1", 0, exposes="nothing")
    port = busy.getsockname()[1]
    try:

        async def serve_on_busy_port() -> None:
            listen("127.0.0.1", port, exposes="nothing")

        assert run_command(serve_on_busy_port, "127.0.0.1", port, (Broken,)) == 1
        assert f"error: cannot listen on 127.0.0.1:{port}: " in capsys.readouterr().err
    finally:
        busy.close()

    def bad_setup() -> None:
        raise Broken("no such env 'x'")  # raised while the command's coroutine is being built

    assert run_command(bad_setup, "h", 1, (Broken,)) == 1  # type: ignore[arg-type]
    assert capsys.readouterr().err == "error: no such env 'x'\n"

    async def interrupted() -> None:
        raise KeyboardInterrupt

    async def stopped() -> None:
        return None

    assert run_command(interrupted, "h", 1, (Broken,)) == 0
    assert run_command(stopped, "h", 1, (Broken,)) == 0
    assert capsys.readouterr().err == ""
    with pytest.raises(ValueError, match="not a setup error"):  # anything else is not swallowed

        async def other() -> None:
            raise ValueError("not a setup error")

        run_command(other, "h", 1, (Broken,))


def _serve(*args: str) -> tuple[subprocess.Popen[str], int]:
    """``launcher.py ARGS --port 0`` started; (process, port) once it printed its address."""
    p = subprocess.Popen(
        [sys.executable, str(REPO / "launcher.py"), *args, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert p.stdout is not None
    first = p.stdout.readline()
    assert " on http://127.0.0.1:" in first, first
    return p, int(first.split("http://127.0.0.1:", 1)[1].split("/", 1)[0])


def _stop(p: subprocess.Popen[str]) -> None:
    p.kill()
    p.wait()
    if p.stdout is not None:
        p.stdout.close()


def _get(port: int, path: str, host: str | None) -> tuple[int, str]:
    head = (
        f"GET {path} HTTP/1.1\r\n"
        + (f"Host: {host}\r\n" if host is not None else "")
        + "Connection: close\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=GENEROUS_S) as s:
        s.sendall(head.encode())
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    status = int(raw.split(b" ", 2)[1])
    return status, raw.partition(b"\r\n\r\n")[2].decode("utf-8", "replace")


def _closed_within(port: int, sent: bytes) -> bool:
    """Whether the server closes a connection that sent only ``sent``, within GENEROUS_S."""
    with socket.create_connection(("127.0.0.1", port), timeout=GENEROUS_S) as s:
        s.sendall(sent)
        try:
            while s.recv(4096):
                pass
        except TimeoutError:
            return False
        except ConnectionResetError:
            pass
    return True


@pytest.fixture
def store_file(tmp_path: Path) -> Path:
    db = tmp_path / "t.db"

    async def make() -> None:
        store = Store(f"sqlite://{db}")
        await store.init()
        await store.close()

    asyncio.run(make())
    return db


def test_feed_answers_only_its_own_host_names_and_closes_idle_connections(store_file: Path) -> None:
    p, port = _serve(
        "feed",
        "--db-path",
        f"sqlite://{store_file}",
        "--allowed-host",
        "trainer.internal",
        "--request-head-timeout-s",
        "1",
        "--keep-alive-timeout-s",
        "1",
    )
    try:
        for host in (
            "127.0.0.1",
            f"127.0.0.1:{port}",
            f"localhost:{port}",
            f"[::1]:{port}",
            "trainer.internal:1",
        ):
            assert _get(port, "/healthz", host)[0] == 200, host
        status, body = _get(port, "/healthz", f"rebound.example:{port}")
        assert status == 400
        err = json.loads(body)["error"]
        assert err["code"] == "host_not_allowed" and "'rebound.example:" in err["message"]
        assert _get(port, "/healthz", None)[0] == 400
        # a proxy's request (absolute form), even with a good Host: 400
        assert _get(port, "http://evil.example/healthz", f"127.0.0.1:{port}") == (
            400,
            "request target 'http://evil.example/healthz' is not a path: this server is not a proxy",
        )
        assert _closed_within(port, b"")  # nothing sent
        assert _closed_within(port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # half a head
    finally:
        _stop(p)


def test_viewer_refuses_another_host_with_its_error_page(store_file: Path) -> None:
    p, port = _serve("view", "--db-path", f"sqlite://{store_file}")
    try:
        assert _get(port, "/", f"localhost:{port}")[0] == 200
        status, page = _get(port, "/", f"rebound.example:{port}")
        assert status == 400 and "does not answer Host &#39;rebound.example:" in page and "<html" in page
        status, body = _get(port, "/api/jobs", "rebound.example")
        assert status == 400 and "does not answer Host 'rebound.example'" in json.loads(body)["error"]
        assert _get(port, f"http://localhost:{port}/", f"localhost:{port}")[0] == 400  # absolute form
    finally:
        _stop(p)


def test_allowed_host_flags_are_checked() -> None:
    p = subprocess.run(
        [sys.executable, str(REPO / "launcher.py"), "feed", "--allowed-host", "http://x/"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert p.returncode == 2 and "--allowed-host: 'http://x/' is not a host name" in p.stderr
