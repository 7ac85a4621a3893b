"""The circuit breaker of a job's pool: stops new attempts while infrastructure failures dominate,
probes the gateway with backoff, and either lets work resume or gives up (docs/outcomes.md)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger(__name__)


class BreakerSettings(BaseModel):
    """When the circuit breaker opens and how it probes. Over the last ``window`` attempt ends, it
    opens when at least ``min_failures`` were infrastructure failures and they are at least
    ``threshold`` (0..1] of the window's entries. Open, it probes every ``probe_s`` seconds at
    first, doubling up to ``max_probe_s``, and gives up (the job stops, resumable) after
    ``max_wait_s`` seconds without an answer."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    window: int = Field(default=20, ge=1)
    min_failures: int = Field(default=5, ge=1)
    threshold: float = Field(default=0.5, gt=0, le=1)
    probe_s: float = Field(default=0.5, gt=0, allow_inf_nan=False)
    max_probe_s: float = Field(default=15.0, gt=0, allow_inf_nan=False)
    max_wait_s: float = Field(default=300.0, gt=0, allow_inf_nan=False)


class BreakerEvent(BaseModel):
    """One change of the breaker: ``state`` open | closed | stopped, why, and how many
    infrastructure failures were in the window (open) or how long it was open (closed/stopped)."""

    state: Literal["open", "closed", "stopped"]
    reason: str
    at: float = Field(default_factory=time.time)


Probe = Callable[[], Awaitable[str | None]]
"""A readiness check: None when the gateway (and upstream) answer, else why not."""


class CircuitBreaker:
    """Gates the start of attempts. ``record(infra)`` feeds the sliding window; ``suspect()``
    (after a gateway/upstream failure) probes once at once and opens on a failed probe.
    ``wait_ready()`` returns True when attempts may start, False once the breaker gave up.
    ``events`` lists every change; ``on_event`` is called with each."""

    def __init__(
        self, settings: BreakerSettings, probe: Probe, on_event: Callable[[BreakerEvent], None] | None = None
    ) -> None:
        self.settings = settings
        self._probe = probe
        self._on_event = on_event
        self._window: deque[bool] = deque(maxlen=settings.window)
        self._ready = asyncio.Event()
        self._ready.set()
        self.state: Literal["closed", "checking", "open", "stopped"] = "closed"
        self.events: list[BreakerEvent] = []
        self.stop_reason: str | None = None
        self._task: asyncio.Task[None] | None = None

    def _emit(self, state: Literal["open", "closed", "stopped"], reason: str) -> None:
        ev = BreakerEvent(state=state, reason=reason)
        self.events.append(ev)
        s = self.settings
        plan = (
            (
                f"; new attempts wait while it probes every {s.probe_s:g} to {s.max_probe_s:g} s, and the job "
                f"stops (resumable) after {s.max_wait_s:g} s without an answer"
            )
            if state == "open"
            else ""
        )
        log.warning("circuit breaker %s: %s%s", state, reason, plan)
        if self._on_event:
            self._on_event(ev)

    def record(self, infra: bool) -> None:
        """Add one attempt end to the window; opens the breaker when infrastructure failures
        dominate it."""
        self._window.append(infra)
        n = sum(self._window)
        s = self.settings
        if (
            self.state in ("closed", "checking")
            and n >= s.min_failures
            and n / len(self._window) >= s.threshold
        ):
            self._open(f"{n} of the last {len(self._window)} attempts were infrastructure failures")

    def suspect(self) -> None:
        """Probe at once (attempts wait for the answer); a failed probe opens the breaker."""
        if self.state != "closed":
            return
        self.state = "checking"
        self._ready.clear()
        self._start(self._check())

    def _start(self, coro: Any) -> None:
        if self._task is not None and self._task is not asyncio.current_task() and not self._task.done():
            self._task.cancel()
        self._task = asyncio.create_task(coro, name="circuit-breaker")

    async def _check(self) -> None:
        why = await self._probe()
        if self.state != "checking":
            return
        if why is None:
            self.state = "closed"
            self._ready.set()
        else:
            self._open(f"the gateway probe failed: {why}", probed=True)

    def _open(self, reason: str, probed: bool = False) -> None:
        self.state = "open"
        self._ready.clear()
        self._emit("open", reason)
        self._start(self._probe_loop(first_delay=probed))

    async def _probe_loop(self, first_delay: bool) -> None:
        s = self.settings
        t0 = time.monotonic()
        delay = s.probe_s
        why = "not probed yet"
        if first_delay:
            await asyncio.sleep(delay)
            delay = min(s.max_probe_s, delay * 2)
        while True:
            why = await self._probe() or ""
            if not why:
                self._window.clear()
                self.state = "closed"
                self._emit("closed", f"the gateway answers again after {time.monotonic() - t0:.1f} s")
                self._ready.set()
                return
            waited = time.monotonic() - t0
            if waited >= s.max_wait_s:
                self.stop_reason = (
                    f"the gateway or its upstream did not answer for {waited:.0f} s (last probe: {why})"
                )
                self.state = "stopped"
                self._emit("stopped", self.stop_reason)
                self._ready.set()
                return
            await asyncio.sleep(min(delay, max(0.0, s.max_wait_s - waited)))
            delay = min(s.max_probe_s, delay * 2)

    async def wait_ready(self) -> bool:
        """Wait until attempts may start (True) or the breaker gave up (False)."""
        await self._ready.wait()
        return self.state != "stopped"

    async def aclose(self) -> None:
        """Stop probing."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
