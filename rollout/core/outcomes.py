"""How an attempt of a session ended, and what the launcher does about it.

``classify`` turns what an attempt left behind into an ``AttemptEnd``: a model/task outcome
(final, graded, never retried) or an infrastructure failure (retried by ``RetryPolicy``; never
graded). An infrastructure failure is decided only from evidence the agent cannot write: the
launcher's own view (setup, limits, timeout, the node, the gateway bridge, the session close) and
the gateway's record of the session's calls; what the runtime reports (its result line,
``error_class`` included, its exit code) never makes one. The rules are explained in
``docs/outcomes.md`` and ``docs/trust-model.md``.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger(__name__)

InfraClass = Literal[
    "setup_failed",
    "gateway_unreachable",
    "upstream_unavailable",
    "store_unavailable",
    "node_lost",
    "launcher_error",
]
TaskOutcome = Literal["succeeded", "failed", "truncated", "timeout", "limit_exceeded", "runtime_error"]

INFRA_CLASSES: frozenset[str] = frozenset(InfraClass.__args__)  # type: ignore[attr-defined]
DEFAULT_RETRY_ON: frozenset[str] = INFRA_CLASSES - {"launcher_error"}
"""Infrastructure classes retried by default: a launcher bug would repeat, so it is not."""
GATEWAY_CLASSES: frozenset[str] = frozenset(
    {"gateway_unreachable", "upstream_unavailable", "store_unavailable"}
)
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
    return (
        bool(meta.get("budget_refunded"))
        or step.status_code in _UNAVAILABLE_CODES
        or (step.status == "error" and step.status_code is None)
    )


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


def classify(
    status: str,
    *,
    setup_failed: bool = False,
    node_lost: bool = False,
    limit_exceeded: str | None = None,
    unreachable: str | None = None,
    close_error: str | None = None,
    steps: Sequence[Any] = (),
    claimed: str | None = None,
    error_text: str | None = None,
    unrecorded: int = 0,
) -> AttemptEnd:
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
        return AttemptEnd(
            "store_unavailable",
            True,
            "; ".join(
                x
                for x in (
                    f"the gateway could not record {unrecorded} model call(s) of the session (its store failed)",
                    why,
                )
                if x
            ),
        )
    if limit_exceeded:
        return AttemptEnd("limit_exceeded", False, why or f"{limit_exceeded} limit exceeded")
    if status in ("timeout", "succeeded", "truncated"):
        return AttemptEnd(status, False, why if status != "succeeded" else None)
    if close_error or unreachable:
        return AttemptEnd(
            "gateway_unreachable", True, "; ".join(x for x in (unreachable, close_error, why) if x)
        )
    last = steps[-1] if steps else None
    if last is not None and _upstream_failed(last):
        code = f"HTTP {last.status_code}" if last.status_code else "no answer"
        return AttemptEnd(
            "upstream_unavailable",
            True,
            "; ".join(x for x in (f"the gateway's last call to the upstream failed ({code})", why) if x),
        )
    if claimed:
        seen = (
            "no model call"
            if last is None
            else f"its last call: HTTP {last.status_code}"
            if last.status_code is not None
            else f"its last call: {last.status}"
        )
        denied = (
            f"the runtime claimed {claimed}, which the launcher's and the gateway's records do not show "
            f"({seen}); graded as the agent's outcome"
        )
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
        raise ValueError(
            f"{what}: not infrastructure failure classes: {bad} (valid: {sorted(INFRA_CLASSES)})"
        )
    return out
