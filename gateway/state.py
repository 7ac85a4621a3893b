"""The objects one gateway instance shares between requests (held on ``app.state.gw``)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from gateway.admin import PolicyControl
from gateway.continuity import PrefixTracker
from gateway.metrics import Metrics
from gateway.recorder import TelemetryWriter
from gateway.rejections import RejectedCalls
from gateway.request_log import RequestLog
from gateway.sessions import SessionManager
from gateway.settings import GatewaySettings
from gateway.upstream import UpstreamClient
from store import Store
from store.stepcodec import StepEncoder


@dataclass(slots=True)
class GatewayState:
    """Settings, store, session manager, upstream client, telemetry writer, metrics and the
    request log (None when ``request_log.enabled`` is false), the counters of calls it answered
    itself (:mod:`gateway.rejections`); the background tasks of calls kept
    for their retry (``detached``) and the ``stopping`` event set at shutdown; the policy version
    and pause state (``policy``), the sessions' prefix digests (``prefixes``) and the step
    encoder that stores steps as deltas (``encoder``, used when ``telemetry.step_deltas``)."""

    settings: GatewaySettings
    store: Store
    sessions: SessionManager
    upstream: UpstreamClient
    writer: TelemetryWriter
    metrics: Metrics
    request_log: RequestLog | None = None
    rejections: RejectedCalls | None = None
    detached: set[asyncio.Task[None]] = field(default_factory=set)
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    policy: PolicyControl = field(default_factory=PolicyControl)
    prefixes: PrefixTracker = field(default_factory=PrefixTracker)
    encoder: StepEncoder = field(default_factory=StepEncoder)
    session_headers: tuple[bytes, ...] = ()  # settings.session_headers as raw ASGI names

    def __post_init__(self) -> None:
        self.session_headers = tuple(n.encode("latin-1") for n in self.settings.session_headers)

    def closing(self, sid: str) -> asyncio.Future[None]:
        """A future done once session ``sid`` starts closing or the gateway stops (no retry of
        its calls can come anymore). Cancel it when no longer needed."""
        return asyncio.ensure_future(_first(self.sessions.closing(sid), self.stopping))

    async def stop_detached(self, timeout_s: float = 5.0) -> None:
        """At shutdown, before the telemetry writer stops: make every detached call stop waiting
        (its step is then recorded ``client_disconnected``) and wait for them, at most
        ``timeout_s`` seconds."""
        self.stopping.set()
        if self.detached:
            await asyncio.wait(set(self.detached), timeout=timeout_s)


async def _first(*events: asyncio.Event) -> None:
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
