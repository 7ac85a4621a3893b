"""The fastest reasonable fake OpenAI upstream for benchmarks: nginx answering fixed bodies.

``POST /n/v1/chat/completions``: a fixed ``chat.completion``; ``POST /s/v1/chat/completions``:
a fixed SSE stream (role, three content chunks, finish, usage, ``[DONE]``). One nginx worker
serves well over 100,000 such answers per second here, so it is never the bottleneck; without
nginx, ``kind="python"`` serves the same from aiohttp (much slower, and says so). Standalone:
``python benchmarks/fake_upstream_fast.py --port 18080 [--kind nginx|python]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _bench import HOST, free_port, wait_http

PLAIN_PREFIX = "/n/v1"  # base_url path of the non-streaming route
STREAM_PREFIX = "/s/v1"  # base_url path of the streaming route
CHAT_PATH = "/chat/completions"

_MODEL = "fake-fast"
_USAGE = {"prompt_tokens": 12, "completion_tokens": 9, "total_tokens": 21}

COMPLETION: dict[str, Any] = {
    "id": "chatcmpl-bench",
    "object": "chat.completion",
    "created": 1700000000,
    "model": _MODEL,
    "system_fingerprint": "fp_bench",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "Hello! This is a fixed benchmark answer.",
                "refusal": None,
            },
            "logprobs": None,
            "finish_reason": "stop",
        }
    ],
    "usage": _USAGE,
}


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": _MODEL,
        "system_fingerprint": "fp_bench",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }


def _sse_chunks() -> list[dict[str, Any]]:
    usage_only = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": _MODEL,
        "system_fingerprint": "fp_bench",
        "choices": [],
        "usage": _USAGE,
    }
    return [
        _chunk({"role": "assistant", "content": ""}),
        _chunk({"content": "Hello! "}),
        _chunk({"content": "This is a fixed "}),
        _chunk({"content": "benchmark answer."}),
        _chunk({}, "stop"),
        usage_only,
    ]


COMPLETION_BODY: bytes = json.dumps(COMPLETION, separators=(",", ":")).encode()
STREAM_BODY: bytes = (
    b"".join(b"data: " + json.dumps(c, separators=(",", ":")).encode() + b"\n\n" for c in _sse_chunks())
    + b"data: [DONE]\n\n"
)


def _nginx_string(body: bytes) -> str:
    """``body`` as an nginx double-quoted string literal."""
    s = body.decode()
    return (
        '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("$", "${dollar}").replace("\n", "\\n") + '"'
    )


def nginx_config(port: int, prefix: Path) -> str:
    """An nginx.conf (one worker, loopback only, no access log) answering the two fixed bodies."""
    return f"""
worker_processes 1;
daemon off;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/client_body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    client_body_buffer_size 1m;
    client_max_body_size 64m;
    keepalive_requests 10000000;
    keepalive_timeout 300s;
    server_tokens off;
    geo $dollar {{ default "$"; }}
    server {{
        listen {HOST}:{port} backlog=4096;
        location = {PLAIN_PREFIX}{CHAT_PATH} {{
            default_type application/json;
            return 200 {_nginx_string(COMPLETION_BODY)};
        }}
        location = {STREAM_PREFIX}{CHAT_PATH} {{
            default_type text/event-stream;
            add_header Cache-Control no-cache;
            return 200 {_nginx_string(STREAM_BODY)};
        }}
        location = /healthz {{
            default_type text/plain;
            return 200 "ok";
        }}
        location / {{
            return 404;
        }}
    }}
}}
"""


class FakeUpstream:
    """A running fake upstream: ``kind`` (``nginx`` or ``python``), ``base`` (``http://127.0.0.1:PORT``),
    ``proc`` (its main process). Stop it with :meth:`stop` (or use it as a context manager)."""

    def __init__(self, kind: str, port: int, proc: subprocess.Popen[Any], workdir: Path | None) -> None:
        self.kind = kind
        self.port = port
        self.proc = proc
        self.base = f"http://{HOST}:{port}"
        self._workdir = workdir

    @property
    def plain_base_url(self) -> str:
        """Route ``base_url`` whose ``/chat/completions`` answers plain JSON."""
        return self.base + PLAIN_PREFIX

    @property
    def stream_base_url(self) -> str:
        """Route ``base_url`` whose ``/chat/completions`` answers an SSE stream."""
        return self.base + STREAM_PREFIX

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 5 s) and remove its temp dir."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)

    def __enter__(self) -> FakeUpstream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def nginx_binary() -> str | None:
    """The nginx executable (PATH, then /usr/sbin), or None."""
    return shutil.which("nginx") or (p if os.access(p := "/usr/sbin/nginx", os.X_OK) else None)


def start_nginx(port: int | None = None) -> FakeUpstream:
    """Start nginx with a generated config in a temp dir; raises RuntimeError if nginx is missing
    or does not answer within 10 s."""
    binary = nginx_binary()
    if binary is None:
        raise RuntimeError("nginx not found (apt-get install nginx-light)")
    port = port or free_port()
    workdir = Path(tempfile.mkdtemp(prefix="bench-nginx-"))
    conf = workdir / "nginx.conf"
    conf.write_text(nginx_config(port, workdir))
    # -e: error log before the config is read (else nginx may try /var/log/nginx/error.log)
    proc = subprocess.Popen(
        [binary, "-p", str(workdir), "-c", str(conf), "-e", str(workdir / "error.log")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    up = FakeUpstream("nginx", port, proc, workdir)
    try:
        wait_http(up.base + "/healthz", 10, proc)
    except RuntimeError as e:
        err = proc.stderr.read().decode() if proc.poll() is not None and proc.stderr else ""
        up.stop()
        raise RuntimeError(f"nginx did not start: {e} {err}") from e
    return up


def start_python(port: int | None = None) -> FakeUpstream:
    """Start the aiohttp fallback server (this file with ``--serve-python``) in a subprocess."""
    port = port or free_port()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve-python", "--port", str(port)], stdout=subprocess.DEVNULL
    )
    up = FakeUpstream("python", port, proc, None)
    try:
        wait_http(up.base + "/healthz", 20, proc)
    except RuntimeError:
        up.stop()
        raise
    return up


def start_upstream(kind: str = "auto", port: int | None = None) -> FakeUpstream:
    """``kind``: ``nginx``, ``python``, or ``auto`` (nginx when installed, else python)."""
    if kind == "nginx" or (kind == "auto" and nginx_binary() is not None):
        return start_nginx(port)
    return start_python(port)


def serve_python(port: int) -> None:
    """The fallback fake upstream: aiohttp on uvloop, same paths and bodies as the nginx config."""
    import asyncio

    from aiohttp import web

    async def plain(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=COMPLETION_BODY, content_type="application/json")

    async def stream(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(
            body=STREAM_BODY, content_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post(PLAIN_PREFIX + CHAT_PATH, plain)
    app.router.add_post(STREAM_PREFIX + CHAT_PATH, stream)
    app.router.add_get("/healthz", health)
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    web.run_app(app, host=HOST, port=port, access_log=None, print=None, backlog=4096)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=18080)
    ap.add_argument("--kind", choices=("auto", "nginx", "python"), default="auto")
    ap.add_argument("--serve-python", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve_python:
        serve_python(args.port)
        return 0
    up = start_upstream(args.kind, args.port)

    def _term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _term)  # stop nginx too when this wrapper is terminated
    print(
        f"fake upstream ({up.kind}) on {up.base}: plain {up.plain_base_url}, stream {up.stream_base_url}",
        flush=True,
    )
    try:
        up.proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        up.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
