"""The upstream workers of a route (``base_urls``) and which one serves a session.

A session sticks to one worker by rendezvous hashing (highest random weight): each healthy worker
scores ``blake2b(base_url + "\\0" + session_id)`` and the highest wins, so a session keeps its
worker (and the worker's prefix cache) while the pool is unchanged, and adding or removing a worker
moves only the sessions that it wins or held. A worker that refuses a connection or fails a
health check is taken out until a health check passes again. Sessionless calls go round-robin.
Details: docs/gateway-semantics.md, "Upstream workers".
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import time
from dataclasses import dataclass, field

from store import redact_url

log = logging.getLogger(__name__)


def score(base_url: str, session_id: str) -> int:
    """The rendezvous weight of a worker for a session (64 bits of BLAKE2b)."""
    return _weight(base_url.encode() + b"\0", session_id.encode())


def _weight(key: bytes, sid: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(key + sid, digest_size=8).digest(), "big")


@dataclass(slots=True)
class Worker:
    """One upstream base URL of a route: whether it takes calls (``healthy``), why not
    (``last_error``), since when (``changed_at``, wall-clock seconds) and the calls open on it.
    ``shown``: the URL with its credentials hidden (:func:`store.redact_url`), what answers,
    metrics and logs name it by."""

    base_url: str
    healthy: bool = True
    last_error: str | None = None
    changed_at: float = 0.0
    in_flight: int = 0

    key: bytes = field(init=False, repr=False)  # hashed before the session id: the URL and a NUL
    shown: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.key = self.base_url.encode() + b"\0"
        self.shown = redact_url(self.base_url)

    def as_json(self) -> dict[str, object]:
        return {
            "base_url": self.shown,
            "healthy": self.healthy,
            "last_error": self.last_error,
            "changed_at": self.changed_at,
            "in_flight": self.in_flight,
        }


class WorkerPool:
    """The workers of one route (in the order given; see the module docstring)."""

    def __init__(self, route_key: str, base_urls: list[str]) -> None:
        if not base_urls:
            raise ValueError(f"route {route_key}: a worker pool needs at least one base_url")
        self.route_key = route_key
        self.workers: dict[str, Worker] = {u: Worker(u, changed_at=time.time()) for u in base_urls}
        self._round = itertools.count()

    def pick(self, session_id: str | None) -> Worker:
        """The worker for a call of ``session_id`` (None: sessionless, round-robin): the healthy
        worker of highest weight; when none is healthy, the highest of all (its failure is then
        the call's usual connect error)."""
        if len(self.workers) == 1:
            return next(iter(self.workers.values()))
        live = [w for w in self.workers.values() if w.healthy] or list(self.workers.values())
        if session_id is None:
            return live[next(self._round) % len(live)]
        sid = session_id.encode()
        return max(live, key=lambda w: _weight(w.key, sid))

    def set_health(self, base_url: str, healthy: bool, why: str | None = None) -> None:
        """Take a worker out (``healthy`` False, ``why``) or bring it back; logged on change."""
        w = self.workers.get(base_url)
        if w is None or (w.healthy == healthy and (healthy or w.last_error == why)):
            return
        changed = w.healthy != healthy
        w.healthy, w.last_error = healthy, None if healthy else why
        if changed:
            w.changed_at = time.time()
            if healthy:
                log.info("route %s: worker %s is back", self.route_key, w.shown)
            else:
                log.warning(
                    "route %s: worker %s taken out (%s); its sessions move", self.route_key, w.shown, why
                )

    def add(self, base_url: str) -> bool:
        """Add a worker (healthy until a check says otherwise); False when it is already there."""
        if base_url in self.workers:
            return False
        w = self.workers[base_url] = Worker(base_url, changed_at=time.time())
        log.info("route %s: worker %s added", self.route_key, w.shown)
        return True

    def remove(self, base_url: str) -> Worker:
        """Remove a worker: no new call goes to it, calls open on it finish. Raises KeyError
        when it is not in the pool, ValueError for the last worker."""
        if base_url not in self.workers:
            raise KeyError(base_url)
        if len(self.workers) == 1:
            raise ValueError(f"route {self.route_key}: {redact_url(base_url)} is its last worker")
        w = self.workers.pop(base_url)
        log.info(
            "route %s: worker %s removed (%d call(s) still open on it finish there)",
            self.route_key,
            w.shown,
            w.in_flight,
        )
        return w
