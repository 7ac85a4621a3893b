"""The objects one gateway instance shares between requests (held on ``app.state.gw``)."""

from __future__ import annotations

from dataclasses import dataclass

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
