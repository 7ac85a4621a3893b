"""The upstream half of one model call: POST, headers, the body unless it is a stream to relay, and
retries while nothing was sent to the client (docs/gateway-semantics.md, "Retries")."""

from __future__ import annotations

import asyncio
import email.utils
import logging
import math
import random
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from typing import Any

import aiohttp

from gateway.call import Call
from gateway.call_end import Attempt, Phase
from store import hide_secrets
from wire.errors import error_body
from wire.status import StepStatus

log = logging.getLogger(__name__)


class UpstreamFailed(Exception):
    """No usable answer: the client gets ``status`` with ``error``; the step is ``step_status`` with
    ``meta_json.phase``. ``retry_reason`` is set when the connection could not be made."""

    def __init__(
        self,
        status: int,
        step_status: StepStatus,
        error: dict[str, Any],
        phase: Phase,
        retry_reason: str | None = None,
    ) -> None:
        super().__init__(error["error"]["message"])
        self.status = status
        self.step_status = step_status
        self.error = error
        self.phase = phase
        self.retry_reason = retry_reason


class Exchange:
    """The upstream half of one call. :meth:`run` is what the client's disconnect cancels; the
    response stays open on ``stack`` (holding the route's slot) until :meth:`close` or a relay."""

    def __init__(self, call: Call, payload: bytes, headers: dict[str, str], relay_sse: bool) -> None:
        self.call = call
        self.payload = payload
        self.headers = headers
        self.relay_sse = relay_sse
        self.retry = call.gw.settings.llm_routes[call.route_key].retry
        self.stack = AsyncExitStack()
        self.resp: aiohttp.ClientResponse | None = None
        self.backing_off = False

    async def run(self) -> bytes | None:
        """The body of the last attempt, or None for a 200 SSE stream to relay; UpstreamFailed for connect
        and read failures. Every attempt is appended to ``call.attempts``."""
        call, policy = self.call, self.retry
        while True:
            n = len(call.attempts) + 1
            last = n >= policy.max_attempts
            try:
                content = await self._attempt()
            except UpstreamFailed as f:
                call.attempts.append(Attempt(None, error=str(f)))
                if f.retry_reason is None or last:
                    raise
                await self._backoff(n, None, f.retry_reason, now=self._moves_on())
                continue
            resp = self.resp
            assert resp is not None
            retry_after = retry_after_s(resp.headers.get("Retry-After"))
            call.attempts.append(Attempt(resp.status, retry_after_s=retry_after))
            if (
                content is None
                or last
                or resp.status not in policy.retry_on_status
                or resp.headers.get("x-should-retry", "").lower() == "false"
            ):
                return content
            await self.stack.aclose()  # the body was read: the connection goes back to the pool
            self.stack, self.resp = AsyncExitStack(), None
            await self._backoff(n, retry_after, f"status_{resp.status}")

    def _moves_on(self) -> bool:
        """True when the next attempt goes to another worker of the route's pool (the one that
        just refused the connection was taken out): no reason to wait before it."""
        call = self.call
        if call.worker is None:
            return False
        sid = None if call.slot is None else call.slot.session_id
        return call.gw.upstream.pick(call.route_key, sid).base_url != call.worker

    async def _backoff(self, n: int, retry_after: float | None, reason: str, *, now: bool = False) -> None:
        """Wait before retry ``n`` (1-based; no wait when ``now``), noting the wait in the last
        attempt and counting the retry in ``/metrics``."""
        call, policy = self.call, self.retry
        if now:
            wait = 0.0
        elif policy.respect_retry_after and retry_after is not None:
            wait = min(retry_after, policy.max_retry_after_s)
        else:
            base = min(policy.max_backoff_s, policy.backoff_s * 2 ** (n - 1))
            wait = base / 2 + random.uniform(0, base / 2)
        call.attempts[-1].wait_s = round(wait, 3)
        call.gw.metrics.upstream_retries.labels(call.route_key, reason).inc()
        log.info(
            "route %s: retrying upstream call (%s, attempt %d of %d) in %.3f s",
            call.route_key,
            reason,
            n + 1,
            policy.max_attempts,
            wait,
        )
        self.backing_off = True  # stays set when the client's departure cancels the wait
        await asyncio.sleep(wait)
        self.backing_off = False

    async def _attempt(self) -> bytes | None:
        """One attempt (see :meth:`run`)."""
        call = self.call
        call.upstream_status = None
        upstream = call.gw.upstream
        sid = None if call.slot is None else call.slot.session_id
        worker = upstream.pick(call.route_key, sid)  # per attempt: a retry avoids a worker just taken out
        call.worker = worker.base_url if upstream.pooled(call.route_key) else None
        try:
            self.resp = resp = await self.stack.enter_async_context(
                upstream.post(
                    call.route_key, call.proto.upstream_path, self.payload, self.headers, sid, worker=worker
                )
            )
        except TimeoutError as e:  # before aiohttp.ClientError: its timeouts are both
            if isinstance(e, aiohttp.ConnectionTimeoutError):
                raise UpstreamFailed(
                    504,
                    StepStatus.TIMEOUT,
                    call.timeout_error("connect", e),
                    Phase.CONNECT,
                    retry_reason="connect_timeout",
                ) from e
            raise UpstreamFailed(
                504, StepStatus.TIMEOUT, call.timeout_error("first-byte", e), Phase.FIRST_BYTE
            ) from e
        except aiohttp.ClientError as e:
            why = hide_secrets(
                f"{type(e).__name__}: {e}",
                worker.base_url,
                *call.gw.settings.llm_routes[call.route_key].workers,
            )
            err = error_body(
                502, f"upstream {call.route_key} unreachable: {why}", code="upstream_unreachable"
            )
            retryable = isinstance(e, aiohttp.ClientConnectorError) and not isinstance(
                e, aiohttp.ClientConnectorCertificateError
            )
            raise UpstreamFailed(
                502, StepStatus.ERROR, err, Phase.CONNECT, retry_reason="connect_error" if retryable else None
            ) from e
        call.upstream_status = resp.status
        if self.relay_sse and resp.status == 200 and resp.content_type == "text/event-stream":
            return None
        try:
            return await resp.read()
        except TimeoutError as e:
            raise UpstreamFailed(504, StepStatus.TIMEOUT, call.timeout_error("body", e), Phase.BODY) from e
        except aiohttp.ClientError as e:
            err = error_body(
                502,
                f"upstream {call.route_key} failed while sending its answer: {type(e).__name__}: {e}",
                code="upstream_broken",
            )
            raise UpstreamFailed(502, StepStatus.ERROR, err, Phase.BODY) from e

    async def close(self, *, abort: bool) -> None:
        """Release the upstream connection and the route slot; ``abort`` closes the connection
        (so the upstream sees the client's departure) instead of returning it to the pool."""
        if abort and self.resp is not None:
            self.resp.close()
        await self.stack.aclose()


def retry_after_s(value: str | None) -> float | None:
    """A ``Retry-After`` header value in seconds (delay-seconds or an HTTP date, RFC 9110
    section 10.2.3; a fractional number is accepted), None when absent or unreadable."""
    if not value:
        return None
    text = value.strip()
    try:
        secs = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        secs = (when - datetime.now(UTC)).total_seconds()
    if not math.isfinite(secs):
        return None
    return max(0.0, secs)


def before_model(f: UpstreamFailed) -> bool:
    """True when the last attempt could not connect (TLS errors and connect timeouts included): nothing
    reached the model, so the call uses no budget."""
    return f.phase == Phase.CONNECT and isinstance(
        f.__cause__, aiohttp.ClientConnectorError | aiohttp.ConnectionTimeoutError
    )
