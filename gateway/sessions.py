"""Session state and the per-session step budget.

The gateway is the single owner of ``gateway_sessions`` rows: it keeps each touched session in
memory (loaded from the store on first use, so a restart keeps step ids and budgets) and reserves
a step under a per-session lock *before* calling upstream, so N parallel calls to a session with
budget B make at most B upstream calls.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from store import GatewaySession, Store, utcnow


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
    """The session was closed with ``POST /v1/sessions/{sid}/close``."""


class SessionManager:
    """Reserves steps and tracks session status. ``default_max_steps`` is the config's
    ``max_steps`` (-1 = unlimited); a session created by a launcher uses its own ``max_steps``."""

    def __init__(self, store: Store, default_max_steps: int) -> None:
        self._store = store
        self._default_max_steps = default_max_steps
        self._states: dict[str, GatewaySession] = {}
        self._locks: dict[str, asyncio.Lock] = {}

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

    async def get(self, sid: str) -> GatewaySession | None:
        """The session's state, or None when the gateway has never seen it."""
        async with self._lock(sid):
            st = self._states.get(sid) or await self._store.load_gateway_session(sid)
            return st

    async def reserve(self, sid: str, model: str) -> tuple[StepSlot | None, GatewaySession]:
        """Reserve the next step of ``sid`` for route ``model``.

        Returns ``(slot, snapshot)``; ``slot`` is None when the budget is used up, in which case the
        session is marked ``truncated``. ``snapshot`` is a copy of the state to persist.
        Raises SessionClosed for a closed session.
        """
        async with self._lock(sid):
            st = await self._state(sid)
            if st.status == "closed":
                raise SessionClosed(sid)
            if 0 <= st.max_steps <= st.total_steps:
                st.status = "truncated"
                st.updated_at = utcnow()
                return None, _snapshot(st)
            counts = dict(st.step_counts or {})
            counts[model] = counts.get(model, 0) + 1
            st.step_counts = counts
            st.total_steps += 1
            st.updated_at = utcnow()
            slot = StepSlot(sid, st.total_steps, counts[model], st.job_id, st.env_name, st.group_id)
            return slot, _snapshot(st)

    async def close(self, sid: str, reason: str | None, completion_mode: str | None) -> tuple[GatewaySession, bool]:
        """Mark a session closed (idempotent; the first reason is kept). Returns a snapshot and
        whether the session had been truncated by its step budget. The closed state stays in
        memory (so calls still in flight persist ``closed``, and a new call is refused) until
        :meth:`forget` is called once the snapshot is stored."""
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
            snap = _snapshot(st)
        return snap, truncated

    def forget(self, sid: str) -> None:
        """Drop a CLOSED session from memory once its closed state is stored (its state then
        lives in the store only; a later call loads it and is refused). No-op otherwise."""
        st = self._states.get(sid)
        if st is not None and st.status == "closed":
            del self._states[sid]
            lock = self._locks.get(sid)
            if lock is not None and not lock.locked():
                del self._locks[sid]
