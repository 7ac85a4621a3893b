"""The gateway bridge of a sandboxed session: a Unix socket served by the launcher that relays each
connection, byte for byte, to the gateway's host and port (TLS when the gateway URL is https).

The socket file is bound into the session's sandbox (which has no network of its own); the
forwarder inside (``rollout/sandbox_forwarder.py``) listens on a loopback port and relays to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from pathlib import Path
from urllib.parse import urlsplit

log = logging.getLogger(__name__)


class BridgeError(RuntimeError):
    """The bridge cannot be set up (bad gateway URL, socket path unusable)."""


def gateway_address(url: str) -> tuple[str, int, bool]:
    """(host, port, tls) of a gateway URL such as ``http://127.0.0.1:8000/v1/sessions/s1``.
    Raises BridgeError for a scheme other than http/https or a URL without a host."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BridgeError(f"cannot bridge to gateway URL {url!r}: need http(s)://HOST[:PORT]/...")
    tls = parts.scheme == "https"
    return parts.hostname, parts.port or (443 if tls else 80), tls


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass  # the other side went away; the relay ends with this connection


class GatewayBridge:
    """``async with GatewayBridge(socket_path, gateway_url):`` serves ``socket_path`` while open.
    Connections still open at exit are closed. Raises BridgeError from ``__aenter__``."""

    def __init__(self, socket_path: Path, gateway_url: str) -> None:
        self.socket_path = socket_path
        self.host, self.port, tls = gateway_address(gateway_url)
        self._ssl = ssl.create_default_context() if tls else None
        self._server: asyncio.AbstractServer | None = None
        self._conns: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> GatewayBridge:
        try:
            self._server = await asyncio.start_unix_server(self._handle, path=str(self.socket_path))
        except OSError as e:
            raise BridgeError(f"cannot serve the gateway bridge on {self.socket_path}: {e}") from e
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
        for t in list(self._conns):
            t.cancel()
        await asyncio.gather(*self._conns, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            try:
                up_r, up_w = await asyncio.open_connection(
                    self.host, self.port, ssl=self._ssl, server_hostname=self.host if self._ssl else None)
            except OSError as e:
                log.warning("gateway bridge: cannot reach %s:%s: %s", self.host, self.port, e)
                return
            try:
                await asyncio.gather(_pump(reader, up_w), _pump(up_r, writer))
            finally:
                up_w.close()
        finally:
            writer.close()
            self._conns.discard(task)
