"""Closing sessions left idle (``session_idle_close_s``): a session without a job whose last call
is older than that is closed by the gateway, ``close_reason`` ``idle`` (docs/gateway.md, "Clients
that take one base URL"). Sessions of a launcher's job are left to the launcher."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from gateway.routes import close_and_store
from gateway.sessions import SessionManager
from gateway.state import GatewayState
from store import utcnow

log = logging.getLogger(__name__)

IDLE_REASON = "idle"
MAX_SWEEP_INTERVAL_S = 60.0


async def close_idle(g: GatewayState, now: datetime) -> list[str]:
    """Close every session without a job idle since before ``now - session_idle_close_s``; the
    ids closed (none when the setting is off)."""
    idle_s = g.settings.session_idle_close_s
    if idle_s is None:
        return []
    cutoff = now - timedelta(seconds=idle_s)
    closed: list[str] = []
    for sid in await g.store.idle_sessions(cutoff):
        st = g.sessions.live(sid)  # this gateway's state may be newer than its stored row
        if st is not None and (st.updated_at >= cutoff or st.status == "closed"):
            continue
        if isinstance(g.sessions, SessionManager) and g.sessions.in_flight(sid):
            continue
        if not await g.sessions.known(sid):
            continue
        await close_and_store(g, sid, IDLE_REASON, None)
        log.info("session %s closed: no call for %g s (session_idle_close_s)", sid, idle_s)
        closed.append(sid)
    return closed


async def idle_loop(g: GatewayState, clock: Callable[[], datetime] = utcnow) -> None:
    """Run :func:`close_idle` every quarter of ``session_idle_close_s`` (at most every minute)
    until cancelled; a failed sweep is logged and the next one runs."""
    idle_s = g.settings.session_idle_close_s
    if idle_s is None:
        return
    while True:
        await asyncio.sleep(min(MAX_SWEEP_INTERVAL_S, idle_s / 4))
        try:
            await close_idle(g, clock())
        except Exception:
            log.exception(
                "idle session sweep failed; the next one runs in %g s", min(MAX_SWEEP_INTERVAL_S, idle_s / 4)
            )
