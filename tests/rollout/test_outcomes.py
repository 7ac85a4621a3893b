"""Unit tests of ``rollout.core.outcomes``: the classification rules, the retry policy's backoff and
the circuit breaker (driven by a scripted probe; every wait is on an event, never on a clock)."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic import ValidationError

from rollout.core.outcomes import (
    DEFAULT_RETRY_ON,
    INFRA_CLASSES,
    RetryPolicy,
    budget_used,
    check_classes,
    classify,
    status_after_close,
)
from rollout.jobs.breaker import BreakerEvent, BreakerSettings, CircuitBreaker


@dataclass
class Step:
    status: str = "ok"
    status_code: int | None = 200
    meta_json: dict[str, Any] | None = field(default=None)


def test_task_outcomes_are_final() -> None:
    for status in ("succeeded", "truncated", "timeout"):
        end = classify(status, steps=[Step()])
        assert (end.outcome, end.infra) == (status, False)
    # a success stays a success even when the gateway died right after (its steps were committed)
    assert classify("succeeded", close_error="closing failed").outcome == "succeeded"
    # a timeout is final even with no call answered
    assert classify("timeout", error_text="timed out").outcome == "timeout"
    end = classify("failed", error_text="no answer file", steps=[Step()])
    assert (end.outcome, end.infra, end.reason) == ("failed", False, "no answer file")
    # no valid result (a crash, a bad line, a signal not the launcher's): the agent's run, graded,
    # never retried, whether or not the model answered a call
    end = classify("error", error_text="Traceback", steps=[Step(), Step()])
    assert (end.outcome, end.infra) == ("runtime_error", False)
    for steps in ([], [Step("error", 400)]):
        end = classify("error", steps=steps)
        assert (end.outcome, end.infra, end.reason) == (
            "runtime_error",
            False,
            "the runtime printed no result",
        )
    # a 4xx the model's request caused (e.g. context too long) is the agent's failure
    assert classify("failed", steps=[Step("error", 400)]).outcome == "failed"


def test_a_failed_session_that_used_its_budget_is_truncated() -> None:
    used = {"truncated": False, "max_steps": 3, "total_steps": 3, "refunded_steps": 0}
    assert budget_used(used) and status_after_close("failed", used) == "truncated"
    # a refunded call gave a unit back: the budget was not used up, the failure is the agent's
    left = {**used, "refunded_steps": 1}
    assert not budget_used(left) and status_after_close("failed", left) == "failed"
    # unlimited budget, or a close answer without the counts (the gateway did not answer)
    assert status_after_close("failed", {**used, "max_steps": -1}) == "failed"
    assert status_after_close("failed", {"error": "closing failed"}) == "failed"
    # an answer given on the last step is a success; after a refused call it is truncated
    assert status_after_close("succeeded", used) == "succeeded"
    assert status_after_close("succeeded", {**used, "truncated": True}) == "truncated"
    # no valid result, or killed at its timeout: kept whatever the budget
    assert status_after_close("error", used) == "error"
    assert status_after_close("timeout", used) == "timeout"


def test_infrastructure_failures() -> None:
    end = classify("error", setup_failed=True, error_text="cannot start runtime: No such file")
    assert (end.outcome, end.infra, end.reason) == (
        "setup_failed",
        True,
        "cannot start runtime: No such file",
    )
    # the launcher could not close the session, or its gateway bridge could not connect
    end = classify("failed", error_text="APIConnectionError", close_error="closing failed: ConnectError")
    assert (end.outcome, end.infra) == ("gateway_unreachable", True)
    assert end.reason == "closing failed: ConnectError; APIConnectionError"
    end = classify("error", unreachable="the gateway bridge could not reach the gateway", steps=[Step()])
    assert (end.outcome, end.infra, end.reason) == (
        "gateway_unreachable",
        True,
        "the gateway bridge could not reach the gateway",
    )
    # the gateway's own record shows the upstream was down after its retries
    for last in (
        Step("error", 503),
        Step("error", 429),
        Step("error", None),
        Step("error", 502, {"budget_refunded": True}),
    ):
        end = classify("failed", error_text="InternalServerError", steps=[Step(), last])
        assert (end.outcome, end.infra) == ("upstream_unavailable", True), last
    assert classify("error", steps=[Step("error", 503)]).reason == (
        "the gateway's last call to the upstream failed (HTTP 503)"
    )
    # a runtime that crashed because the upstream was down: the gateway's record decides
    assert classify("error", claimed="upstream_unavailable", steps=[Step("error", 503)]).infra
    # the gateway could not record calls (its store failed): whatever the runtime then reported
    for status in ("succeeded", "failed", "timeout", "truncated", "error"):
        end = classify(status, unrecorded=2, error_text="InternalServerError: 500", steps=[Step()])
        assert (end.outcome, end.infra, end.reason) == (
            "store_unavailable",
            True,
            "the gateway could not record 2 model call(s) of the session (its store "
            "failed); InternalServerError: 500",
        ), status
    assert classify("failed", limit_exceeded="memory", unrecorded=1).outcome == "store_unavailable"
    assert classify("error", setup_failed=True, unrecorded=1).outcome == "setup_failed"
    assert RetryPolicy().retries("store_unavailable")


def test_a_claimed_outage_the_records_do_not_show_is_the_agents_outcome() -> None:
    """``error_class`` is the runtime's word: without the launcher's or the gateway's evidence it
    is a task outcome, graded, with the claim kept in the reason."""
    end = classify(
        "failed",
        claimed="upstream_unavailable",
        error_text="InternalServerError: 503",
        steps=[Step(), Step()],
    )
    assert (end.outcome, end.infra) == ("failed", False)
    assert end.reason == (
        "InternalServerError: 503; the runtime claimed upstream_unavailable, which the "
        "launcher's and the gateway's records do not show (its last call: HTTP 200); graded as "
        "the agent's outcome"
    )
    end = classify("failed", claimed="gateway_unreachable")
    assert (end.outcome, end.infra) == ("failed", False) and "(no model call)" in (end.reason or "")
    assert "claimed upstream_unavailable" in (classify("error", claimed="upstream_unavailable").reason or "")
    # a 4xx last call is the agent's own request, not an outage
    assert not classify("failed", claimed="upstream_unavailable", steps=[Step("error", 400)]).infra
    assert "runtime_crashed" not in INFRA_CLASSES  # no valid result is never an outage


def test_retry_policy() -> None:
    p = RetryPolicy(max_retries=3, backoff_s=2.0, max_backoff_s=5.0)
    rng = random.Random(7)
    delays = [[p.delay_s(r, rng) for r in (1, 2, 3)] for _ in range(200)]
    for d1, d2, d3 in delays:
        assert 1.0 <= d1 <= 2.0 and 2.0 <= d2 <= 4.0 and 2.5 <= d3 <= 5.0  # doubled, capped, equal jitter
    assert len({round(d[0], 6) for d in delays}) > 100  # jittered, not a constant
    assert RetryPolicy(backoff_s=0).delay_s(3) == 0.0
    assert p.retries("gateway_unreachable") and p.retries("upstream_unavailable")
    assert not p.retries("launcher_error")  # a launcher bug would repeat
    assert not any(p.retries(o) for o in ("succeeded", "failed", "truncated", "timeout", "runtime_error"))
    q = RetryPolicy(retry_on=INFRA_CLASSES, no_retry_on=frozenset({"setup_failed"}))
    assert q.retries("launcher_error") and not q.retries("setup_failed")
    assert DEFAULT_RETRY_ON == INFRA_CLASSES - {"launcher_error"}
    with pytest.raises(ValueError, match=r"not infrastructure failure classes: \['failed', 'gateway_down'\]"):
        check_classes(["gateway_down", "failed", "setup_failed"], "retry_on")
    with pytest.raises(ValidationError):
        RetryPolicy(max_retries=-1)


class Probe:
    """A probe whose answers the test hands out one by one (None = ready, else why not)."""

    def __init__(self) -> None:
        self.answers: asyncio.Queue[str | None] = asyncio.Queue()
        self.calls = 0

    async def __call__(self) -> str | None:
        self.calls += 1
        return await self.answers.get()


FAST = BreakerSettings(
    window=4, min_failures=3, threshold=0.75, probe_s=0.001, max_probe_s=0.002, max_wait_s=60
)


async def test_breaker_opens_when_infra_dominates_and_closes_when_the_probe_answers() -> None:
    probe = Probe()
    events: list[BreakerEvent] = []
    b = CircuitBreaker(FAST, probe, events.append)
    for infra in (True, False, True):
        b.record(infra)
    assert b.state == "closed" and await b.wait_ready()  # 2 of 3: below min_failures
    b.record(True)  # 3 of 4 = 0.75
    assert b.state == "open" and events[0].state == "open"
    assert events[0].reason == "3 of the last 4 attempts were infrastructure failures"
    waiter = asyncio.create_task(b.wait_ready())
    probe.answers.put_nowait("connection refused")
    probe.answers.put_nowait("connection refused")
    await asyncio.sleep(0)
    assert not waiter.done()
    probe.answers.put_nowait(None)
    assert await asyncio.wait_for(waiter, 30) is True
    assert b.state == "closed" and [e.state for e in events] == ["open", "closed"]
    assert probe.calls == 3
    b.record(True)  # the window was reset when it closed: one failure does not reopen it
    assert b.state == "closed"
    await b.aclose()


async def test_breaker_suspect_probes_once_and_opens_on_failure() -> None:
    probe = Probe()
    events: list[BreakerEvent] = []
    b = CircuitBreaker(FAST, probe, events.append)
    b.suspect()
    waiter = asyncio.create_task(b.wait_ready())
    probe.answers.put_nowait(None)  # the gateway answers: no event, attempts go on
    assert await asyncio.wait_for(waiter, 30) is True and events == [] and b.state == "closed"
    b.suspect()
    probe.answers.put_nowait("HTTP 503")
    waiter = asyncio.create_task(b.wait_ready())
    for _ in range(10_000):  # the probe answers on the loop: yield until it did
        if b.state == "open":
            break
        await asyncio.sleep(0)
    assert b.state == "open" and events[0].reason == "the gateway probe failed: HTTP 503"
    probe.answers.put_nowait(None)
    assert await asyncio.wait_for(waiter, 30) is True
    assert [e.state for e in events] == ["open", "closed"]
    await b.aclose()


async def test_breaker_gives_up_after_max_wait(caplog: pytest.LogCaptureFixture) -> None:
    async def down() -> str:
        return "connection refused"

    events: list[BreakerEvent] = []
    b = CircuitBreaker(FAST.model_copy(update={"max_wait_s": 0.01}), down, events.append)
    b.suspect()
    assert await asyncio.wait_for(b.wait_ready(), 30) is False
    opened = [r.getMessage() for r in caplog.records if "circuit breaker open" in r.getMessage()]
    assert opened == [
        "circuit breaker open: the gateway probe failed: connection refused; new attempts wait while "
        "it probes every 0.001 to 0.002 s, and the job stops (resumable) after 0.01 s without an "
        "answer"
    ]  # what happens next is said when it opens, not only when it gives up
    assert b.state == "stopped" and [e.state for e in events] == ["open", "stopped"]
    assert b.stop_reason is not None and "(last probe: connection refused)" in b.stop_reason
    await b.aclose()


def test_readyz_error_names_why_not_ready() -> None:
    from rollout.jobs.processes import readyz_error

    body = '{"status": "unavailable", "storage_type": "sqlite", "routes": ["m"], "error": "route m: ConnectError"}'
    assert readyz_error(body) == "route m: ConnectError"
    assert readyz_error("<html>bad gateway</html>") == "<html>bad gateway</html>"
    assert readyz_error('["no"]') == '["no"]' and readyz_error("x" * 500) == "x" * 200


def test_rejected_summary_of_a_close_answer() -> None:
    from rollout.jobs.attempt import rejected_summary

    assert rejected_summary({"rejected_calls": {}}) is None
    assert rejected_summary({"error": "closing failed"}) is None  # an old gateway, or no answer
    assert rejected_summary({"rejected_calls": {"max_steps": 3}}) is None  # the session's truncated says it
    assert rejected_summary(
        {"rejected_calls": {"max_steps": 1, "model_not_found": 2, "invalid_api_key": 12}}
    ) == ("the gateway refused 14 call(s) of the session itself: invalid_api_key 12, model_not_found 2")


def test_only_a_gateway_that_cannot_be_reached_is_evidence_of_an_outage() -> None:
    """The bridge counts a failed connection to the gateway as an outage only when it says the
    gateway could not be reached, not when the launcher ran out of something a runtime can use
    up (file descriptors, memory)."""
    import errno
    import socket

    from rollout.sandbox.bridge import gateway_down

    assert gateway_down(ConnectionRefusedError(errno.ECONNREFUSED, "Connect call failed"))
    assert gateway_down(OSError(errno.EHOSTUNREACH, "No route to host"))
    assert gateway_down(TimeoutError()) and gateway_down(socket.gaierror(-2, "Name or service not known"))
    # asyncio's error when every address of a host name failed
    assert gateway_down(
        OSError(
            "Multiple exceptions: [Errno 111] Connect call failed ('::1', 8000, 0, 0), "
            "[Errno 111] Connect call failed ('127.0.0.1', 8000)"
        )
    )
    assert not gateway_down(
        OSError(
            "Multiple exceptions: [Errno 111] Connect call failed ('::1', 8000, 0, 0), "
            "[Errno 24] Too many open files"
        )
    )
    assert not gateway_down(OSError(errno.EMFILE, "Too many open files"))
    assert not gateway_down(OSError(errno.ENOMEM, "Cannot allocate memory"))
    assert not gateway_down(OSError("no errno at all"))
