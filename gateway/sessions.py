"""Session state, the per-session step budget and the calls in flight: one :class:`LiveSession` per
touched session, loaded from the store on first use; a step is reserved under the session's lock
before the upstream is called (rules: docs/gateway-semantics.md, "Budget and close")."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass, field

from gateway.idempotency import RecentCalls
from store import GatewaySession, GatewaySessionStatus, JobEnvironment, SessionContext, Store, utcnow

log = logging.getLogger(__name__)

MAX_UNRECORDED_SESSIONS = 100_000
"""Sessions whose unrecorded calls are counted; the least recently counted are dropped past it."""


@dataclass(frozen=True, slots=True)
class StepSlot:
    """A reserved step: ``seq`` (per session, all models) and ``step_id`` (per session and model),
    both counting from 1, plus the session's launcher metadata for the step row."""

    session_id: str
    seq: int
    step_id: int
    job_id: str | None
    env_name: str | None
    group_id: str | None


_FIELDS = tuple(c.name for c in GatewaySession.__table__.columns)  # type: ignore[attr-defined]


def _snapshot(st: GatewaySession) -> GatewaySession:
    """A detached copy of a session state (a new object, not an ORM copy; ``step_counts``
    copied too)."""
    values = {n: getattr(st, n) for n in _FIELDS}
    values["step_counts"] = dict(st.step_counts) if st.step_counts is not None else None
    return GatewaySession(**values)


class RouteMismatch(Exception):
    """A call of a session named a route other than the one the session is bound to
    (``GatewaySession.route``: its launcher's route, else the route of its first call)."""

    def __init__(self, session_id: str, bound: str, called: str) -> None:
        super().__init__(f"session {session_id} is bound to route {bound!r}, not {called!r}")
        self.session_id, self.bound, self.called = session_id, bound, called


def route_mismatch(st: GatewaySession, model: str) -> RouteMismatch | None:
    """The refusal of a call of route ``model`` by a session bound to another route, else None."""
    if st.route is not None and st.route != model:
        return RouteMismatch(st.session_id, st.route, model)
    return None


def take_step(st: GatewaySession, model: str) -> StepSlot | None:
    """The budget rule on an open session state (changed in place): the next step for route
    ``model``, or None when the budget is used up (the state is then ``truncated``). Binds an
    unbound session to ``model``; the caller checked :func:`route_mismatch` first."""
    if 0 <= st.max_steps <= st.total_steps - st.refunded_steps:
        st.status = GatewaySessionStatus.TRUNCATED
        st.updated_at = utcnow()
        return None
    if st.status in (
        GatewaySessionStatus.TRUNCATED,
        GatewaySessionStatus.INTERRUPTED,
    ):  # a refund freed a unit / a restart
        st.status = GatewaySessionStatus.ACTIVE
    if st.route is None:
        st.route = model
    counts = dict(st.step_counts or {})
    counts[model] = counts.get(model, 0) + 1
    st.step_counts = counts
    st.total_steps += 1
    st.updated_at = utcnow()
    return StepSlot(st.session_id, st.total_steps, counts[model], st.job_id, st.env_name, st.group_id)


class SessionClosed(Exception):
    """The session was closed with ``POST /v1/sessions/{sid}/close`` (or is being closed: a close
    is waiting for the session's calls in flight)."""


@dataclass(slots=True, eq=False)
class LiveSession:
    """One session in memory: its ``state`` (None until loaded), the lock ordering reserves and
    closes, its steps in flight (refunded ones, those left after a close), waiting closes,
    ``forgotten``, and the events ``idle`` and ``closing``."""

    state: GatewaySession | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    in_flight: set[int] = field(default_factory=set)
    refunded: set[int] = field(default_factory=set)
    after_close: set[int] = field(default_factory=set)
    closes_waiting: int = 0
    forgotten: bool = False  # closed and stored: kept only until its last call in flight ends
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    closing: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.idle.set()


class SessionManager:
    """Reserves steps and tracks session status; ``default_max_steps`` is the config's ``max_steps``."""

    def __init__(self, store: Store, default_max_steps: int) -> None:
        self._store = store
        self._default_max_steps = default_max_steps
        self.recent_calls = RecentCalls()
        self._sessions: dict[str, LiveSession] = {}
        self._unrecorded: OrderedDict[str, int] = OrderedDict()

    def _live(self, sid: str) -> LiveSession:
        live = self._sessions.get(sid)
        if live is None:
            live = self._sessions[sid] = LiveSession()
        return live

    async def _state(self, live: LiveSession, sid: str) -> GatewaySession:
        """The session's state, loaded (or created from the launcher's row) on first use; call
        with ``live.lock`` held."""
        if live.state is not None:
            return live.state
        st, ctx = await self._store.gateway_session_or_context(sid)
        if st is None:
            st = self._new_state(sid, ctx)
        live.state = st
        return st

    def _new_state(self, sid: str, ctx: SessionContext | JobEnvironment | None) -> GatewaySession:
        """A new session's state: the launcher's row's budget, metadata and route (the session is
        bound to it), else the config's budget and no route yet. A new state starts a new count of
        unrecorded calls (a retry under the same session id)."""
        self._unrecorded.pop(sid, None)
        max_steps = self._default_max_steps
        if ctx is not None and ctx.max_steps is not None:
            max_steps = ctx.max_steps
        return GatewaySession(
            session_id=sid,
            max_steps=max_steps,
            step_counts={},
            job_id=ctx.job_id if ctx else None,
            env_name=ctx.env_name if ctx else None,
            group_id=ctx.group_id if ctx else None,
            route=ctx.llm_model if ctx else None,
        )

    def note_unrecorded(self, sid: str) -> None:
        """Count one call of ``sid`` whose step the store failed to record (kept in memory only:
        the store may be full)."""
        n = self._unrecorded.pop(sid, 0) + 1
        self._unrecorded[sid] = n
        if len(self._unrecorded) > MAX_UNRECORDED_SESSIONS:
            self._unrecorded.popitem(last=False)

    def unrecorded(self, sid: str) -> int:
        """How many calls of ``sid`` the store failed to record since its state was created."""
        return self._unrecorded.get(sid, 0)

    def live(self, sid: str) -> GatewaySession | None:
        """The session's state object itself (not a copy), or None when not in memory: the writer
        copies it at commit, so a state persisted is never older than at queue time."""
        live = self._sessions.get(sid)
        return live.state if live is not None and not live.forgotten else None

    async def get(self, sid: str) -> GatewaySession | None:
        """The session's state, or None when the gateway has never seen it."""
        live = self._sessions.get(sid)
        if live is not None and live.state is not None and not live.forgotten:
            return live.state
        return await self._store.load_gateway_session(sid)

    async def known(self, sid: str) -> bool:
        """Whether ``sid`` is a session: in memory, stored by a gateway, or registered by a launcher."""
        live = self._sessions.get(sid)
        if live is not None and (live.state is not None or live.in_flight):
            return True
        st, ctx = await self._store.gateway_session_or_context(sid)
        if st is None:
            if ctx is None:
                return False
            st = self._new_state(sid, ctx)
        live = self._live(sid)
        async with live.lock:
            if live.state is None:
                live.state = st  # what the close goes on with: the store is read once
        return True

    def closing(self, sid: str) -> asyncio.Event:
        """Set once a close of ``sid`` started (already set for a session not held in memory:
        closed and forgotten). What a call kept for its retry waits on."""
        live = self._sessions.get(sid)
        if live is not None:
            return live.closing
        done = asyncio.Event()
        done.set()
        return done

    async def reserve(self, sid: str, model: str) -> StepSlot | None:
        """Reserve the next step of ``sid`` for route ``model``: the slot, or None when the budget is used
        up. Raises SessionClosed (closed or closing) or RouteMismatch. A slot is in flight until
        :meth:`release`, called on every path."""
        live = self._live(sid)
        async with live.lock:
            if live.closes_waiting:
                raise SessionClosed(sid)
            held = live.state is not None
            st = await self._state(live, sid)
            if st.status == GatewaySessionStatus.CLOSED:
                if not held and not live.in_flight and self._sessions.get(sid) is live:
                    # loaded closed from the store only to be refused: not pinned in memory, so a
                    # session reset for a retry (Store.reset_for_retry) is fresh at its next call
                    del self._sessions[sid]
                raise SessionClosed(sid)
            if (mismatch := route_mismatch(st, model)) is not None:
                raise mismatch
            slot = take_step(st, model)
            if slot is None:
                return None
            live.in_flight.add(slot.seq)
            live.idle.clear()
            return slot

    persists_itself = False
    """True when the manager writes session states to the store itself (shared sessions); False:
    the telemetry writer commits the live state with each step and the close's snapshot."""

    def release(self, slot: StepSlot, recorded: bool = True) -> None:
        """End the in-flight mark of a reserved step (idempotent); wakes a close waiting for the last one."""
        live = self._sessions.get(slot.session_id)
        if live is None or slot.seq not in live.in_flight:
            return
        live.in_flight.discard(slot.seq)
        live.refunded.discard(slot.seq)
        live.after_close.discard(slot.seq)
        if not live.in_flight:
            live.idle.set()
            if live.forgotten:
                del self._sessions[slot.session_id]

    async def refund(self, slot: StepSlot) -> bool:
        """Give the budget unit of a slot in flight back (its call never reached the model); its row is
        still written. False once the slot was released or refunded, or the session is forgotten."""
        live = self._sessions.get(slot.session_id)
        if (
            live is None
            or live.forgotten
            or live.state is None
            or slot.seq not in live.in_flight
            or slot.seq in live.refunded
        ):
            return False
        live.refunded.add(slot.seq)
        live.state.refunded_steps += 1
        live.state.updated_at = utcnow()
        return True

    def takes_calls(self, sid: str) -> bool:
        """False once a close of ``sid`` has started (waiting for its calls in flight, closed, or
        closed and forgotten): no new call of the session will be accepted."""
        live = self._sessions.get(sid)
        if live is None or live.forgotten or live.closes_waiting or live.state is None:
            return False
        return live.state.status != GatewaySessionStatus.CLOSED

    def holds(self, sid: str) -> bool:
        """True while ``sid`` has any bookkeeping in memory (state, calls in flight)."""
        return sid in self._sessions

    def in_flight(self, sid: str) -> int:
        """The number of reserved steps of ``sid`` not yet released."""
        live = self._sessions.get(sid)
        return len(live.in_flight) if live is not None else 0

    def is_after_close(self, slot: StepSlot) -> bool:
        """True when the session was closed while this reserved step was still in flight (its
        close gave up waiting after ``close_grace_s``): the step lands after the close answer."""
        live = self._sessions.get(slot.session_id)
        return live is not None and slot.seq in live.after_close

    async def close(
        self, sid: str, reason: str | None, completion_mode: str | None, grace_s: float = 0.0
    ) -> tuple[GatewaySession, bool]:
        """Close a session (idempotent; the first reason kept): no new call from now, then wait for its
        calls in flight (at most ``grace_s``) and mark it closed. Returns the closed state and whether
        the budget truncated it."""
        live = self._live(sid)
        live.closes_waiting += 1
        live.closing.set()
        try:
            # a reserve in progress holds the lock (a first call loads the session from the
            # store): let it finish, so its call counts as in flight before the drain looks
            async with live.lock:
                pass
            if live.in_flight and grace_s > 0:
                try:
                    async with asyncio.timeout(grace_s):
                        await live.idle.wait()
                except TimeoutError:
                    pass
            async with live.lock:
                st = await self._state(live, sid)
                truncated = st.status == GatewaySessionStatus.TRUNCATED or st.completion_mode == "truncated"
                if st.status != GatewaySessionStatus.CLOSED:
                    if truncated:
                        completion_mode = "truncated"
                    st.status = GatewaySessionStatus.CLOSED
                    st.close_reason = reason
                    st.completion_mode = completion_mode
                    st.closed_at = st.updated_at = utcnow()
                if live.in_flight:
                    live.after_close.update(live.in_flight)
                    log.warning(
                        "session %s closed with %d call(s) still in flight after %.1f s; their steps "
                        "will be recorded with after_close=true, is_trainable=false",
                        sid,
                        len(live.in_flight),
                        grace_s,
                    )
                snap = _snapshot(st)
            self.recent_calls.drop(sid)
        finally:
            live.closes_waiting -= 1
        return snap, truncated

    def forget(self, sid: str) -> None:
        """Drop a CLOSED session from memory once its closed state is stored (its state then
        lives in the store only; a later call loads it and is refused). No-op otherwise."""
        live = self._sessions.get(sid)
        if live is not None and live.state is not None and live.state.status == GatewaySessionStatus.CLOSED:
            self.recent_calls.drop(sid)
            if live.in_flight:
                live.forgotten = True  # dropped when its last call in flight ends
            else:
                del self._sessions[sid]
