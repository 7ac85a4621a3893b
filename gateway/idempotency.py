"""Recognising a retry of a session's model call, so that it gets the first call's answer instead
of a new step: the same ``Idempotency-Key``, or ``x-stainless-retry-count`` > 0 with a
byte-identical body (docs/gateway-semantics.md, "SDK retries")."""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

PER_SESSION = 16  # calls remembered per session
MAX_ENTRIES = 4096  # calls remembered in all
MAX_ENTRY_BYTES = 8 * 1024 * 1024  # a bigger answer is not replayable
MAX_TOTAL_BYTES = 256 * 1024 * 1024  # answer bytes kept in all

IDEMPOTENCY_HEADER = "idempotency-key"
RETRY_COUNT_HEADER = "x-stainless-retry-count"

CallKey = tuple[str, str, str]  # (kind "key" | "body", endpoint, BLAKE2b hex digest)


def may_retry(headers: Mapping[str, str]) -> bool:
    """True when the client can retry a call so that :func:`call_key` recognises it (it sends an
    ``Idempotency-Key`` or ``x-stainless-retry-count``)."""
    return IDEMPOTENCY_HEADER in headers or RETRY_COUNT_HEADER in headers


def call_key(headers: Mapping[str, str], endpoint: str, raw: bytes) -> tuple[CallKey, bool]:
    """The key of a call and whether to look it up: ``("key", endpoint, blake2b(Idempotency-Key))``,
    always looked up, else ``("body", endpoint, blake2b(raw))``, looked up when
    ``x-stainless-retry-count`` is an integer > 0 (an unreadable value counts as 0)."""
    idem = headers.get(IDEMPOTENCY_HEADER)
    if idem:
        return (
            "key",
            endpoint,
            hashlib.blake2b(idem.encode("utf-8", "replace"), digest_size=16).hexdigest(),
        ), True
    try:
        retry = int(headers.get(RETRY_COUNT_HEADER) or 0)
    except ValueError:
        retry = 0
    return ("body", endpoint, hashlib.blake2b(raw, digest_size=16).hexdigest()), retry > 0


@dataclass(frozen=True, slots=True)
class Replay:
    """What the client of a call was answered: 2xx status, the headers relayed or added, the body
    bytes (a stream: every SSE byte sent) and the media type."""

    status_code: int
    headers: dict[str, str]
    body: bytes
    media_type: str


class PendingCall:
    """One remembered call: in flight until :meth:`done` or :meth:`fail` settles it (once)."""

    __slots__ = ("_future", "_table", "_waiters", "_wanted", "client_left", "key", "replay", "session_id")

    def __init__(self, table: RecentCalls, session_id: str, key: CallKey) -> None:
        self._table = table
        self.session_id = session_id
        self.key = key
        self.replay: Replay | None = None
        self._future: asyncio.Future[Replay | None] = asyncio.get_running_loop().create_future()
        self._wanted = asyncio.Event()  # set when a retry starts waiting for this call
        self._waiters = 0  # retries waiting for this call now
        self.client_left = False  # the first client left; the call goes on for its retry

    @property
    def max_bytes(self) -> int:
        """The largest answer body (bytes) that can be kept as a replay."""
        return self._table.max_entry_bytes

    @property
    def waiters(self) -> int:
        """How many retries are waiting for this call now."""
        return self._waiters

    @property
    def settled(self) -> bool:
        """True once :meth:`done` or :meth:`fail` was called."""
        return self._future.done()

    def done(self, replay: Replay) -> None:
        """Answered with ``replay``: kept for duplicates (forgotten if over the per-call cap); wakes them."""
        if self.settled:
            return
        if len(replay.body) > self._table.max_entry_bytes:
            self.fail()
            return
        self.replay = replay
        self._future.set_result(replay)
        self._table._kept(self)

    def fail(self) -> None:
        """The call got no replayable answer: forget it; duplicates waiting become new calls."""
        if self.settled:
            return
        self._table._remove(self)
        self._future.set_result(None)

    async def wanted(self, timeout_s: float, stop: asyncio.Future[None]) -> bool:
        """Wait until a retry of this call waits for it (True; one that waited and left does not count),
        at most ``timeout_s`` or until ``stop``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._waiters <= 0:
            left = deadline - loop.time()
            if left <= 0 or stop.done():
                return False
            self._wanted.clear()
            woken: asyncio.Future[Any] = asyncio.ensure_future(self._wanted.wait())
            try:
                await asyncio.wait([woken, stop], timeout=left, return_when=asyncio.FIRST_COMPLETED)
            finally:
                woken.cancel()
        return True

    async def wait(self) -> Replay | None:
        """The call's replay once it is settled, or None when it failed (not cancelled when the
        waiter is). Counts as a retry waiting for it (:meth:`wanted`) while it waits."""
        self._waiters += 1
        self._wanted.set()
        try:
            return await asyncio.shield(self._future)
        finally:
            self._waiters -= 1


class RecentCalls:
    """The bounded in-memory table of recent calls per session (LRU, capped per session, per answer
    and in all). No locking: :meth:`find` and :meth:`begin` run without an await in between, so one
    of several duplicates claims a call and the others join it."""

    def __init__(
        self,
        *,
        per_session: int = PER_SESSION,
        max_entries: int = MAX_ENTRIES,
        max_entry_bytes: int = MAX_ENTRY_BYTES,
        max_total_bytes: int = MAX_TOTAL_BYTES,
    ) -> None:
        self.per_session = per_session
        self.max_entries = max_entries
        self.max_entry_bytes = max_entry_bytes
        self.max_total_bytes = max_total_bytes
        self._sessions: dict[str, OrderedDict[CallKey, PendingCall]] = {}
        self._lru: OrderedDict[tuple[str, CallKey], PendingCall] = OrderedDict()  # oldest first
        self._bytes = 0  # body bytes of the replays held

    def __len__(self) -> int:
        return len(self._lru)

    @property
    def bytes_held(self) -> int:
        """Body bytes of the replays held, in all."""
        return self._bytes

    def calls(self, sid: str) -> list[PendingCall]:
        """The remembered calls of ``sid``, oldest first (without touching their LRU order)."""
        calls = self._sessions.get(sid)
        return list(calls.values()) if calls is not None else []

    def find(self, sid: str, key: CallKey) -> PendingCall | None:
        """The remembered call of ``sid`` under ``key`` (in flight, or done with a replay), made
        the most recently used; None when there is none."""
        calls = self._sessions.get(sid)
        entry = calls.get(key) if calls is not None else None
        if entry is not None:
            calls.move_to_end(key)  # type: ignore[union-attr]
            self._lru.move_to_end((sid, key))
        return entry

    def begin(self, sid: str, key: CallKey) -> PendingCall:
        """Remember a new call of ``sid`` under ``key``, in flight (an earlier call under the key still
        settles for its own waiters); the caller settles it on every path."""
        entry = PendingCall(self, sid, key)
        old = self._lru.get((sid, key))
        if old is not None:
            self._remove(old)
        calls = self._sessions.setdefault(sid, OrderedDict())
        calls[key] = entry
        self._lru[(sid, key)] = entry
        while len(calls) > self.per_session:
            self._remove(next(iter(calls.values())))
        self._evict()
        return entry

    def drop(self, sid: str) -> None:
        """Forget every call of ``sid`` (its session was closed). Calls still in flight settle
        for their own waiters only."""
        calls = self._sessions.get(sid)
        for entry in list(calls.values()) if calls is not None else []:
            self._remove(entry)

    def _kept(self, entry: PendingCall) -> None:
        """Account for a call that is now done with a replay (when it is still in the table)."""
        if self._lru.get((entry.session_id, entry.key)) is entry and entry.replay is not None:
            self._bytes += len(entry.replay.body)
            self._evict()

    def _remove(self, entry: PendingCall) -> None:
        """Take ``entry`` out of the table, when it is there."""
        sid, key = entry.session_id, entry.key
        if self._lru.get((sid, key)) is not entry:
            return
        del self._lru[(sid, key)]
        calls = self._sessions[sid]
        del calls[key]
        if not calls:
            del self._sessions[sid]
        if entry.replay is not None:
            self._bytes -= len(entry.replay.body)

    def _evict(self) -> None:
        """Drop the least recently used calls until the global caps hold."""
        while self._lru and (len(self._lru) > self.max_entries or self._bytes > self.max_total_bytes):
            self._remove(next(iter(self._lru.values())))
