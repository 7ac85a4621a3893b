"""Sessions shared by several gateway processes over one store (``shared_sessions``): each reserve,
refund and close is one short transaction on the session's row, and ``in_flight`` counts every
gateway's steps not committed yet (docs/scale-out.md)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Mapping
from typing import Any

from gateway.sessions import (
    RouteMismatch,
    SessionClosed,
    SessionManager,
    StepSlot,
    _snapshot,
    route_mismatch,
    take_step,
)
from store import GatewaySession, GatewaySessionStatus, JobEnvironment, StepRow, Store, utcnow

log = logging.getLogger(__name__)

CLOSE_POLL_S = (0.005, 0.25)
"""A close polls the session's ``in_flight`` from the first to the second interval (doubling)."""
WATCH_POLL_S = 0.25
"""How often a call kept for its retry looks whether another gateway started closing its session."""

_CLOSED = (GatewaySessionStatus.CLOSED, GatewaySessionStatus.CLOSING)


class SharedSessionManager(SessionManager):
    """:class:`SessionManager` with the state in the database; memory keeps only this gateway's calls
    in flight, and :meth:`live` is always None (the writer lowers ``in_flight`` with each step)."""

    persists_itself = True

    def __init__(self, store: Store, default_max_steps: int) -> None:
        super().__init__(store, default_max_steps)
        self._tasks: set[asyncio.Task[None]] = set()

    def _spawn(self, coro: Coroutine[Any, Any, None], what: str) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and (e := t.exception()) is not None:
                log.error("%s failed: %s: %s", what, type(e).__name__, e)

        task.add_done_callback(done)

    async def reserve(self, sid: str, model: str) -> StepSlot | None:
        """As :meth:`SessionManager.reserve`, in one transaction on the session's row."""
        live = self._live(sid)
        if live.closes_waiting:
            raise SessionClosed(sid)

        def take(st: GatewaySession) -> StepSlot | None | GatewaySessionStatus | RouteMismatch:
            if st.status in _CLOSED:
                return GatewaySessionStatus(st.status)
            if (mismatch := route_mismatch(st, model)) is not None:
                return mismatch
            slot = take_step(st, model)
            if slot is not None:
                st.in_flight += 1
            return slot

        try:
            fast = await self._store.reserve_step(sid, model)  # one statement, the common case
            got = (
                StepSlot(sid, *fast)
                if fast is not None
                else await self._store.change_gateway_session(
                    sid, take, lambda ctx: self._new_state(sid, ctx)
                )
            )
        except BaseException:
            self._drop_if_idle(sid)
            raise
        if isinstance(got, GatewaySessionStatus | RouteMismatch) or got is None:
            self._drop_if_idle(sid)
            if isinstance(got, RouteMismatch):
                raise got
            if got is not None:
                raise SessionClosed(sid)
            return None
        live = self._live(sid)  # the same object unless it was dropped meanwhile
        live.in_flight.add(got.seq)
        live.idle.clear()
        return got

    def _drop_if_idle(self, sid: str) -> None:
        live = self._sessions.get(sid)
        if live is not None and not live.in_flight and not live.closes_waiting:
            del self._sessions[sid]

    def release(self, slot: StepSlot, recorded: bool = True) -> None:
        """End this gateway's in-flight mark; a step without a row leaves ``in_flight`` here."""
        live = self._sessions.get(slot.session_id)
        if live is None or slot.seq not in live.in_flight:
            return
        if not recorded:
            self._spawn(
                self._store.release_in_flight(slot.session_id), f"in_flight release of {slot.session_id}"
            )
        live.in_flight.discard(slot.seq)
        live.refunded.discard(slot.seq)
        if not live.in_flight:
            live.idle.set()
            self._drop_if_idle(slot.session_id)

    def lost(self, step: StepRow) -> None:
        """The telemetry writer lost a step record (dropped or refused): its session's
        ``in_flight`` no longer waits for it."""
        sid = step["session_id"] if isinstance(step, Mapping) else step.session_id
        self._spawn(self._store.release_in_flight(sid), f"in_flight release of {sid}")

    async def refund(self, slot: StepSlot) -> bool:
        """Give the budget unit back in the database (``refunded_steps + 1``); False once released
        or refunded."""
        live = self._sessions.get(slot.session_id)
        if live is None or slot.seq not in live.in_flight or slot.seq in live.refunded:
            return False
        live.refunded.add(slot.seq)

        def give_back(st: GatewaySession) -> None:
            st.refunded_steps += 1
            st.updated_at = utcnow()

        await self._store.change_gateway_session(
            slot.session_id, give_back, lambda ctx: self._new_state(slot.session_id, ctx)
        )
        return True

    def live(self, sid: str) -> GatewaySession | None:
        """Always None: the state is in the database, written by each change itself."""
        return None

    async def get(self, sid: str) -> GatewaySession | None:
        """The session's state as committed, or None."""
        return await self._store.load_gateway_session(sid)

    def takes_calls(self, sid: str) -> bool:
        """False while this gateway closes ``sid`` (a close on another gateway is seen by the next
        reserve, which refuses the call)."""
        live = self._sessions.get(sid)
        return live is None or not live.closes_waiting

    def closing(self, sid: str) -> asyncio.Event:
        """Set once a close of ``sid`` started on this gateway, or (checked every
        :data:`WATCH_POLL_S` while this gateway has calls of it in flight) on another."""
        live = self._sessions.get(sid)
        if live is None:
            done = asyncio.Event()
            done.set()
            return done
        if not live.closing.is_set():
            self._spawn(self._watch(sid, live.closing), f"close watch of {sid}")
        return live.closing

    async def _watch(self, sid: str, event: asyncio.Event) -> None:
        while not event.is_set():
            live = self._sessions.get(sid)
            if live is None or not live.in_flight:
                return
            st = await self._store.load_gateway_session(sid)
            if st is not None and st.status in _CLOSED:
                event.set()
                return
            await asyncio.sleep(WATCH_POLL_S)

    async def close(
        self, sid: str, reason: str | None, completion_mode: str | None, grace_s: float = 0.0
    ) -> tuple[GatewaySession, bool]:
        """As :meth:`SessionManager.close`, for calls in flight on any gateway: ``closing``, wait for
        ``in_flight`` 0 (at most ``grace_s``), then ``closed``."""
        live = self._live(sid)
        live.closes_waiting += 1
        live.closing.set()

        def new(ctx: JobEnvironment | None) -> GatewaySession:
            return self._new_state(sid, ctx)

        try:

            def begin(st: GatewaySession) -> int:
                if st.status != GatewaySessionStatus.CLOSED:
                    if st.status == GatewaySessionStatus.TRUNCATED:
                        st.completion_mode = "truncated"  # what the final step reports
                    st.status = GatewaySessionStatus.CLOSING
                    st.updated_at = utcnow()
                return st.in_flight if st.status == GatewaySessionStatus.CLOSING else 0

            in_flight = await self._store.change_gateway_session(sid, begin, new)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + grace_s
            pause = CLOSE_POLL_S[0]
            while in_flight > 0 and loop.time() < deadline:
                await asyncio.sleep(min(pause, max(0.0, deadline - loop.time())))
                pause = min(pause * 2, CLOSE_POLL_S[1])
                st = await self._store.load_gateway_session(sid)
                in_flight = (
                    st.in_flight if st is not None and st.status == GatewaySessionStatus.CLOSING else 0
                )
            if in_flight > 0:
                log.warning(
                    "session %s closed with %d call(s) still in flight after %.1f s; their steps will be "
                    "recorded with after_close=true, is_trainable=false",
                    sid,
                    in_flight,
                    grace_s,
                )

            def end(st: GatewaySession) -> tuple[GatewaySession, bool]:
                truncated = st.status == GatewaySessionStatus.TRUNCATED or st.completion_mode == "truncated"
                if st.status != GatewaySessionStatus.CLOSED:
                    st.status = GatewaySessionStatus.CLOSED
                    st.close_reason = reason
                    st.completion_mode = "truncated" if truncated else completion_mode
                    st.closed_at = st.updated_at = utcnow()
                return _snapshot(st), truncated

            snap, truncated = await self._store.change_gateway_session(sid, end, new)
            self.recent_calls.drop(sid)
        finally:
            live.closes_waiting -= 1
        return snap, truncated

    def forget(self, sid: str) -> None:
        """Drop this gateway's bookkeeping of a closed session (none is kept once its calls end)."""
        self.recent_calls.drop(sid)
        self._drop_if_idle(sid)

    async def aclose(self) -> None:
        """Wait for the background releases (at shutdown), cancel the close watches."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=5)
