"""The objects one gateway instance shares between requests (held on ``app.state.gw``)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from gateway.metrics import Metrics
from gateway.recorder import TelemetryWriter
from gateway.request_log import RequestLog
from gateway.sessions import SessionManager
from gateway.settings import GatewaySettings
from gateway.upstream import UpstreamClient
from store import Store


@dataclass(slots=True)
class GatewayState:
    """Settings, store, session manager, upstream client, telemetry writer, metrics and the
    request log (None when ``request_log.enabled`` is false)."""

    settings: GatewaySettings
    store: Store
    sessions: SessionManager
    upstream: UpstreamClient
    writer: TelemetryWriter
    metrics: Metrics
    request_log: RequestLog | None = None
    # background tasks of calls whose client left, kept for their retry (gateway.forward._detach)
    detached: set[asyncio.Task[None]] = field(default_factory=set)
    stopping: bool = False  # set at shutdown: detached calls stop waiting

    async def stop_detached(self, timeout_s: float = 5.0) -> None:
        """At shutdown, before the telemetry writer stops: make every detached call stop waiting
        (its step is then recorded ``client_disconnected``) and wait for them, at most
        ``timeout_s`` seconds."""
        self.stopping = True
        if self.detached:
            await asyncio.wait(set(self.detached), timeout=timeout_s)
