"""Session state, the per-session step budget, and the calls in flight per session.

The gateway is the single owner of ``gateway_sessions`` rows: it keeps each touched session in
memory (loaded from the store on first use, so a restart keeps step ids and budgets) and reserves
a step under a per-session lock *before* calling upstream, so N parallel calls to a session with
budget B make at most B upstream calls.

Every reserved step is *in flight* from :meth:`SessionManager.reserve` until its step row is
queued for the telemetry writer (:meth:`SessionManager.release`); :meth:`SessionManager.close`
waits for a session to have no call in flight, so that a trajectory read after the close answer
holds every step of the session (see :meth:`SessionManager.close` for the bounded wait).

Budget: ``total_steps`` counts the reserved steps (every one gets a step row and its own
``seq``, never reused), ``refunded_steps`` those whose call failed before reaching the model
(:meth:`SessionManager.refund`: a connect failure or an upstream 429, decided by
:mod:`gateway.forward`); a session may reserve while ``total_steps - refunded_steps <
max_steps``. So N parallel calls with budget B make at most B upstream calls that reach the
model, and a refunded call frees its unit for a later call.

Each session's recent calls (:class:`gateway.idempotency.RecentCalls`, ``recent_calls``) are
dropped when the session is closed.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from gateway.idempotency import RecentCalls
from store import GatewaySession, Store, utcnow

log = logging.getLogger(__name__)


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


def _snapshot(st: GatewaySession) -> GatewaySession:
    """A detached copy of a session state (a new object, not an ORM copy)."""
    return GatewaySession(**st.model_dump())


class SessionClosed(Exception):
    """The session was closed with ``POST /v1/sessions/{sid}/close`` (or is being closed: a close
    is waiting for the session's calls in flight)."""


class SessionManager:
    """Reserves steps and tracks session status. ``default_max_steps`` is the config's
    ``max_steps`` (-1 = unlimited); a session created by a launcher uses its own ``max_steps``.
    ``recent_calls`` remembers each session's recent calls so a retry can be answered without a
    new step (:mod:`gateway.idempotency`)."""

    def __init__(self, store: Store, default_max_steps: int) -> None:
        self._store = store
        self._default_max_steps = default_max_steps
        self.recent_calls = RecentCalls()
        self._states: dict[str, GatewaySession] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        # sid -> seqs of the reserved steps not yet queued for the writer (calls in flight)
        self._in_flight: dict[str, set[int]] = {}
        # sid -> set when the session's last call in flight is released (waited on by close)
        self._idle: dict[str, asyncio.Event] = {}
        # sid -> seqs that were still in flight when the session was closed (late steps)
        self._after_close: dict[str, set[int]] = {}
        # sid -> number of close requests waiting for the session's calls in flight
        self._closing: dict[str, int] = {}
        # sid -> seqs in flight that were refunded (refund() once per step)
        self._refunded: dict[str, set[int]] = {}

    def _lock(self, sid: str) -> asyncio.Lock:
        lock = self._locks.get(sid)
        if lock is None:
            lock = self._locks[sid] = asyncio.Lock()
        return lock

    async def _state(self, sid: str) -> GatewaySession:
        st = self._states.get(sid)
        if st is not None:
            return st
        st = await self._store.load_gateway_session(sid)
        if st is None:
            ctx = await self._store.session_context(sid)
            max_steps = self._default_max_steps
            if ctx is not None and ctx.max_steps is not None:
                max_steps = ctx.max_steps
            st = GatewaySession(
                session_id=sid, max_steps=max_steps, step_counts={},
                job_id=ctx.job_id if ctx else None, env_name=ctx.env_name if ctx else None,
                group_id=ctx.group_id if ctx else None,
            )
        self._states[sid] = st
        return st

    def current(self, sid: str) -> GatewaySession | None:
        """A snapshot of the session's state as it is NOW, or None when the session is not held in
        memory (never seen, or closed and forgotten).

        This, not the snapshot returned by :meth:`reserve`, is what a finished step persists:
        calls of one session finish in any order, and a reserve-time snapshot written by a call
        that finishes late would roll the persisted ``total_steps``/``step_counts`` back (a restart
        would then reuse step ids) or reopen a session that was truncated or closed meanwhile.
        Taken synchronously, so records queued in order carry states in order."""
        st = self._states.get(sid)
        return None if st is None else _snapshot(st)

    def live(self, sid: str) -> GatewaySession | None:
        """The session's state object itself (not a copy), or None when it is not held in memory.

        For the telemetry writer, which copies it when it commits a batch (once per session per
        batch, :meth:`gateway.recorder.TelemetryWriter.submit`): the state persisted with a step
        is then the state at commit time, never older than at queue time (the same guarantee as
        :meth:`current`, with one copy per batch instead of one per call)."""
        return self._states.get(sid)

    async def get(self, sid: str) -> GatewaySession | None:
        """The session's state, or None when the gateway has never seen it."""
        async with self._lock(sid):
            st = self._states.get(sid) or await self._store.load_gateway_session(sid)
            return st

    async def reserve(self, sid: str, model: str) -> StepSlot | None:
        """Reserve the next step of ``sid`` for route ``model``.

        Returns the slot, or None when the budget is used up (``max_steps >= 0`` and
        ``max_steps <= total_steps - refunded_steps``), in which case the session is marked
        ``truncated`` (the caller persists :meth:`current`); a session so marked is ``active``
        again once a refund lets a later call reserve.
        Raises SessionClosed for a closed session, and for one being closed.

        A returned slot is *in flight* until :meth:`release` is called with it; the caller must
        call it on every path (it is idempotent). A closed session loaded from the store to be
        refused is not kept in memory, so a launcher that resets the session's stored state for a
        retry (``Store.reset_for_retry``) gets a fresh session at its next call.
        """
        async with self._lock(sid):
            if self._closing.get(sid):
                raise SessionClosed(sid)
            held = sid in self._states
            st = await self._state(sid)
            if st.status == "closed":
                if not held:  # loaded closed from the store: refusing it must not pin it in memory
                    del self._states[sid]
                raise SessionClosed(sid)
            if 0 <= st.max_steps <= st.total_steps - st.refunded_steps:
                st.status = "truncated"
                st.updated_at = utcnow()
                return None
            if st.status in ("truncated", "interrupted"):  # a refund freed a unit since / a new gateway
                st.status = "active"
            counts = dict(st.step_counts or {})
            counts[model] = counts.get(model, 0) + 1
            st.step_counts = counts
            st.total_steps += 1
            st.updated_at = utcnow()
            slot = StepSlot(sid, st.total_steps, counts[model], st.job_id, st.env_name, st.group_id)
            self._in_flight.setdefault(sid, set()).add(slot.seq)
            return slot

    def release(self, slot: StepSlot) -> None:
        """End the in-flight mark of a reserved step: its step row has been queued for the
        telemetry writer, or the call ended without a row (a bug, a server shutdown).
        Idempotent: a second call for the same slot does nothing. Wakes a close waiting for the
        session once its last call in flight is released."""
        seqs = self._in_flight.get(slot.session_id)
        if seqs is None or slot.seq not in seqs:
            return
        seqs.discard(slot.seq)
        refunded = self._refunded.get(slot.session_id)
        if refunded is not None:
            refunded.discard(slot.seq)
            if not refunded:
                del self._refunded[slot.session_id]
        late = self._after_close.get(slot.session_id)
        if late is not None:
            late.discard(slot.seq)
            if not late:
                del self._after_close[slot.session_id]
        if not seqs:
            del self._in_flight[slot.session_id]
            idle = self._idle.pop(slot.session_id, None)
            if idle is not None:
                idle.set()

    def refund(self, slot: StepSlot) -> bool:
        """Give the budget unit of a reserved step back: its call failed before reaching the model
        (the caller decides; :mod:`gateway.forward`). Its step row is still written, with its own
        ``seq``; ``refunded_steps`` grows by one. Call it while the slot is in flight, before its
        step is queued, so the persisted state carries the refund. Returns whether it was
        refunded: False once the slot was released (or refunded), or when the session is no
        longer held in memory (closed and forgotten: nothing left to spend the unit on)."""
        seqs = self._in_flight.get(slot.session_id)
        st = self._states.get(slot.session_id)
        if seqs is None or slot.seq not in seqs or st is None:
            return False
        refunded = self._refunded.setdefault(slot.session_id, set())
        if slot.seq in refunded:
            return False
        refunded.add(slot.seq)
        st.refunded_steps += 1
        st.updated_at = utcnow()
        return True

    def takes_calls(self, sid: str) -> bool:
        """False once a close of ``sid`` has started (waiting for its calls in flight, closed, or
        closed and forgotten): no new call of the session will be accepted."""
        if self._closing.get(sid):
            return False
        st = self._states.get(sid)
        return st is not None and st.status != "closed"

    def in_flight(self, sid: str) -> int:
        """The number of reserved steps of ``sid`` not yet released."""
        return len(self._in_flight.get(sid, ()))

    def is_after_close(self, slot: StepSlot) -> bool:
        """True when the session was closed while this reserved step was still in flight (its
        close gave up waiting after ``close_grace_s``): the step lands after the close answer."""
        return slot.seq in self._after_close.get(slot.session_id, ())

    async def _drain(self, sid: str, grace_s: float) -> bool:
        """Wait until ``sid`` has no call in flight, at most ``grace_s`` seconds. Returns whether
        it has none."""
        if not self._in_flight.get(sid):
            return True
        if grace_s <= 0:
            return False
        idle = self._idle.get(sid)
        if idle is None:
            idle = self._idle[sid] = asyncio.Event()
        try:
            async with asyncio.timeout(grace_s):
                await idle.wait()
        except TimeoutError:
            return False
        return True

    async def close(self, sid: str, reason: str | None, completion_mode: str | None,
                    grace_s: float = 0.0) -> tuple[GatewaySession, bool]:
        """Close a session (idempotent; the first reason is kept). Returns a snapshot of the
        closed state and whether the session had been truncated by its step budget.

        Order: from the moment this is called, the session takes no new call (``reserve`` raises
        SessionClosed); then it waits until the session has no call in flight, at most
        ``grace_s`` seconds (the config's ``close_grace_s``); only then is it marked closed. A
        call in flight is released once its step row is queued for the telemetry writer, and the
        writer commits in queue order, so when the caller has stored the returned snapshot
        (strict telemetry: waited for its commit), every step of the session is committed too.

        Calls still in flight when the grace runs out do not hold the close: the session is
        closed anyway (a warning is logged) and those calls' steps, recorded later, carry
        ``meta_json.after_close = true`` and ``is_trainable = false`` (see :meth:`is_after_close`),
        so a trainer never takes a step that landed after the graded last step.

        The closed state stays in memory (so calls still in flight persist ``closed``, and a new
        call is refused) until :meth:`forget` is called once the snapshot is stored. The
        session's recent calls are dropped: a retry arriving after the close is refused like any
        call."""
        self._closing[sid] = self._closing.get(sid, 0) + 1
        try:
            # a reserve in progress holds the session lock (a first call loads the session from
            # the store): let it finish, so its call counts as in flight before the drain looks
            async with self._lock(sid):
                pass
            await self._drain(sid, grace_s)
            async with self._lock(sid):
                st = await self._state(sid)
                truncated = st.status == "truncated" or st.completion_mode == "truncated"
                if st.status != "closed":
                    if truncated:
                        completion_mode = "truncated"
                    st.status = "closed"
                    st.close_reason = reason
                    st.completion_mode = completion_mode
                    st.closed_at = st.updated_at = utcnow()
                late = self._in_flight.get(sid)
                if late:
                    self._after_close.setdefault(sid, set()).update(late)
                    log.warning("session %s closed with %d call(s) still in flight after %.1f s; their steps "
                                "will be recorded with after_close=true, is_trainable=false", sid, len(late),
                                grace_s)
                snap = _snapshot(st)
            self.recent_calls.drop(sid)
        finally:
            n = self._closing[sid] - 1
            if n:
                self._closing[sid] = n
            else:
                del self._closing[sid]
        return snap, truncated

    def forget(self, sid: str) -> None:
        """Drop a CLOSED session from memory once its closed state is stored (its state then
        lives in the store only; a later call loads it and is refused). No-op otherwise."""
        st = self._states.get(sid)
        if st is not None and st.status == "closed":
            del self._states[sid]
            self.recent_calls.drop(sid)
            lock = self._locks.get(sid)
            if lock is not None and not lock.locked():
                del self._locks[sid]
