"""How an attempt of a session ended, and what the launcher does about it.

``classify`` turns what an attempt left behind into an ``AttemptEnd``: a model/task outcome
(final, graded, never retried) or an infrastructure failure (retried by ``RetryPolicy``; never
graded). An infrastructure failure is decided only from evidence the agent cannot write: the
launcher's own view (setup, limits, timeout, the node, the gateway bridge, the session close) and
the gateway's record of the session's calls; what the runtime reports (its result line,
``error_class`` included, its exit code) never makes one. ``CircuitBreaker`` stops new attempts
while infrastructure failures dominate, probes the gateway with backoff, and either lets work
resume or gives up. The rules are explained in ``docs/outcomes.md`` and ``docs/trust-model.md``.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger(__name__)

InfraClass = Literal["setup_failed", "gateway_unreachable", "upstream_unavailable", "store_unavailable", "node_lost",
                     "launcher_error"]
TaskOutcome = Literal["succeeded", "failed", "truncated", "timeout", "limit_exceeded", "runtime_error"]

INFRA_CLASSES: frozenset[str] = frozenset(InfraClass.__args__)  # type: ignore[attr-defined]
TASK_OUTCOMES: frozenset[str] = frozenset(TaskOutcome.__args__)  # type: ignore[attr-defined]
DEFAULT_RETRY_ON: frozenset[str] = INFRA_CLASSES - {"launcher_error"}
"""Infrastructure classes retried by default: a launcher bug would repeat, so it is not."""
GATEWAY_CLASSES: frozenset[str] = frozenset({"gateway_unreachable", "upstream_unavailable", "store_unavailable"})
"""Failures a gateway probe can confirm: one of them makes the breaker probe at once."""
INFRA_EVAL_STATUS = "infra_error"
"""``eval_status`` of a session whose last attempt was an infrastructure failure (reward NULL)."""
_UNAVAILABLE_CODES = frozenset({429, 500, 502, 503, 504})


@dataclass(frozen=True)
class AttemptEnd:
    """How one attempt ended: ``outcome`` (a ``TaskOutcome`` or an ``InfraClass``), whether it is
    an infrastructure failure, and why (None for a plain success)."""

    outcome: str
    infra: bool
    reason: str | None = None


def _upstream_failed(step: Any) -> bool:
    """A recorded step whose call did not reach a working model: the upstream answered 429/5xx or
    could not be connected (no status code) after the gateway's own retries."""
    if step.status == "ok":
        return False
    meta = step.meta_json or {}
    return bool(meta.get("budget_refunded")) or step.status_code in _UNAVAILABLE_CODES or (
        step.status == "error" and step.status_code is None)


def budget_used(close_info: dict[str, Any]) -> bool:
    """Whether the gateway's close answer says the session used its whole step budget: a call was
    refused (``truncated``) or ``0 <= max_steps <= total_steps - refunded_steps`` (the gateway's
    own counts, the rule it reserves by)."""
    if close_info.get("truncated"):
        return True
    budget, used = close_info.get("max_steps"), close_info.get("total_steps")
    if not isinstance(budget, int) or not isinstance(used, int) or budget < 0:
        return False
    return budget <= used - int(close_info.get("refunded_steps") or 0)


def status_after_close(status: str, close_info: dict[str, Any]) -> str:
    """The runtime's status once the gateway's close answer is known: ``succeeded`` after a
    refused call, or ``failed`` (no answer) with the budget used up (``budget_used``), is
    ``truncated``; any other status is kept."""
    if status == "succeeded" and close_info.get("truncated"):
        return "truncated"
    if status == "failed" and budget_used(close_info):
        return "truncated"
    return status


def classify(status: str, *, setup_failed: bool = False, node_lost: bool = False, limit_exceeded: str | None = None,
             unreachable: str | None = None, close_error: str | None = None, steps: Sequence[Any] = (),
             claimed: str | None = None, error_text: str | None = None, unrecorded: int = 0) -> AttemptEnd:
    """Classify one attempt (rules in order; ``status`` is the runtime status after the gateway's
    truncation: succeeded | failed | truncated | timeout | error).

    The evidence: ``node_lost``, ``setup_failed``, ``limit_exceeded``, a ``timeout`` status,
    ``unreachable`` (why the gateway bridge's last connection to the gateway failed) and
    ``close_error`` (the launcher could not close the session) are the launcher's own
    observations; ``steps`` (the attempt's recorded ``SessionStep`` rows, in order) and
    ``unrecorded`` (the close answer's count of calls the gateway's store failed to record) are the
    gateway's. ``claimed`` (the result's ``error_class``) and ``error_text`` are the runtime's
    words: they explain, they never decide.

    0. ``node_lost`` (``--mode ray``: the node running the attempt died or left): ``node_lost``.
    1. ``setup_failed`` (the runtime never started, sandbox set-up included): ``setup_failed``.
    2. the gateway could not record calls of the attempt (``unrecorded``): ``store_unavailable``.
    3. timeout, succeeded, truncated, or a sandbox limit (memory, processes, output, disk, files) the
       runtime exceeded (``limit_exceeded``): final task outcomes.
    4. the launcher could not close the session (``close_error``), or the bridge's last
       connection to the gateway failed (``unreachable``): ``gateway_unreachable``.
    5. the last recorded step is an upstream failure (429/5xx/connect error after the gateway's
       retries): ``upstream_unavailable``.
    6. error (no valid result, whether or not a model call was answered): ``runtime_error``.
    7. failed: final.
    A claimed outage that rules 4 and 5 do not confirm is named in the reason of 6 or 7."""
    why = error_text or None
    if node_lost:
        return AttemptEnd("node_lost", True, why or "the node running the session was lost")
    if setup_failed:
        return AttemptEnd("setup_failed", True, why or "the runtime could not start")
    if unrecorded:
        return AttemptEnd("store_unavailable", True, "; ".join(x for x in (
            f"the gateway could not record {unrecorded} model call(s) of the session (its store failed)", why) if x))
    if limit_exceeded:
        return AttemptEnd("limit_exceeded", False, why or f"{limit_exceeded} limit exceeded")
    if status in ("timeout", "succeeded", "truncated"):
        return AttemptEnd(status, False, why if status != "succeeded" else None)
    if close_error or unreachable:
        return AttemptEnd("gateway_unreachable", True, "; ".join(x for x in (unreachable, close_error, why) if x))
    last = steps[-1] if steps else None
    if last is not None and _upstream_failed(last):
        code = f"HTTP {last.status_code}" if last.status_code else "no answer"
        return AttemptEnd("upstream_unavailable", True,
                          "; ".join(x for x in (f"the gateway's last call to the upstream failed ({code})", why) if x))
    if claimed:
        seen = ("no model call" if last is None else f"its last call: HTTP {last.status_code}"
                if last.status_code is not None else f"its last call: {last.status}")
        denied = (f"the runtime claimed {claimed}, which the launcher's and the gateway's records do not show "
                  f"({seen}); graded as the agent's outcome")
        why = f"{why}; {denied}" if why else denied
    if status == "error":
        return AttemptEnd("runtime_error", False, why or "the runtime printed no result")
    return AttemptEnd("failed", False, why)


def verifier_setup_failed(reason: str | None) -> AttemptEnd:
    """The end of an attempt whose verifier (the task's tests) could not start: an infrastructure
    failure (``setup_failed``, retried), never the agent's 0."""
    return AttemptEnd("setup_failed", True, reason or "the verifier could not start")


class RetryPolicy(BaseModel):
    """Which infrastructure failures are retried, how often and after how long.

    ``max_retries`` attempts after the first (per launcher run; ``--resume`` starts afresh).
    The delay before retry ``r`` (1-based) is ``min(max_backoff_s, backoff_s * 2**(r-1))``
    with equal jitter: uniformly in [d/2, d] ("exponential backoff and jitter", AWS Architecture
    Blog, 2015). ``retry_on`` (default: every infrastructure class but ``launcher_error``) minus
    ``no_retry_on``. Task outcomes are never retried."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_retries: int = Field(default=2, ge=0)
    backoff_s: float = Field(default=1.0, ge=0, allow_inf_nan=False)
    max_backoff_s: float = Field(default=60.0, ge=0, allow_inf_nan=False)
    retry_on: frozenset[str] = DEFAULT_RETRY_ON
    no_retry_on: frozenset[str] = frozenset()

    def retries(self, outcome: str) -> bool:
        """Whether an attempt that ended in ``outcome`` may be retried at all."""
        return outcome in INFRA_CLASSES and outcome in self.retry_on and outcome not in self.no_retry_on

    def delay_s(self, retry: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (1-based)."""
        d = min(self.max_backoff_s, self.backoff_s * 2 ** max(0, retry - 1))
        return d / 2 + (rng or random).uniform(0, d / 2)


def check_classes(names: Iterable[str], what: str) -> frozenset[str]:
    """``names`` as a set of infrastructure classes; ValueError naming ``what`` and the valid
    classes for any other name (a task outcome is never retried, so it is refused too)."""
    out = frozenset(names)
    bad = sorted(out - INFRA_CLASSES)
    if bad:
        raise ValueError(f"{what}: not infrastructure failure classes: {bad} (valid: {sorted(INFRA_CLASSES)})")
    return out


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

    def __init__(self, settings: BreakerSettings, probe: Probe,
                 on_event: Callable[[BreakerEvent], None] | None = None) -> None:
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
        plan = (f"; new attempts wait while it probes every {s.probe_s:g} to {s.max_probe_s:g} s, and the job "
                f"stops (resumable) after {s.max_wait_s:g} s without an answer") if state == "open" else ""
        log.warning("circuit breaker %s: %s%s", state, reason, plan)
        if self._on_event:
            self._on_event(ev)

    def record(self, infra: bool) -> None:
        """Add one attempt end to the window; opens the breaker when infrastructure failures
        dominate it."""
        self._window.append(infra)
        n = sum(self._window)
        s = self.settings
        if self.state in ("closed", "checking") and n >= s.min_failures and n / len(self._window) >= s.threshold:
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
                self.stop_reason = (f"the gateway or its upstream did not answer for {waited:.0f} s "
                                    f"(last probe: {why})")
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
