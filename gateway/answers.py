"""What a finished non-streamed exchange becomes: for each ending, the :class:`CallEnd` its call
records and the response its client gets (relayed answer, synthesized stream, upstream failure,
client gone, synthetic stop). Pure builders: :meth:`gateway.call.Call.finish` records.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from fastapi.responses import Response, StreamingResponse

from gateway.call import Call
from gateway.call_end import CallEnd, Phase
from gateway.capture import strip_answer
from gateway.exchange import UpstreamFailed, before_model
from gateway.idempotency import Replay
from gateway.protocols import WireProtocol
from gateway.streaming import SSE_HEADERS
from wire.errors import error_body
from wire.jsonsafe import StrictJSONResponse, compact, loads_strict
from wire.status import StepStatus

STOP_HEADER = {"x-gateway-stop-reason": "max_steps"}
NOT_PROCESSED_STATUS = frozenset({429, 503})
"""Upstream statuses that say the request was not taken (429 Too Many Requests, RFC 6585 section
4; 503 Service Unavailable, RFC 9110 section 15.6.4): such a call uses no budget."""
RELAYED_HEADERS = ("retry-after", "x-request-id", "openai-processing-ms", "request-id", "x-should-retry")
RAW_BODY_LIMIT = 65536  # bytes of a body that is not JSON kept in the step


def gone_body(proto: WireProtocol, message: str) -> dict[str, Any]:
    """The 499 error body of a client that left, in the protocol's error shape."""
    return proto.client_error(
        499, error_body(499, message, code="client_disconnected", type_="client_disconnected")
    )


def gone(proto: WireProtocol, message: str) -> StrictJSONResponse:
    """The 499 answer of a client that left (nobody reads it: the server drops it)."""
    return StrictJSONResponse(gone_body(proto, message), status_code=499)


def relayed_headers(up_headers: Mapping[str, str]) -> dict[str, str]:
    """The upstream headers passed on to the client (:data:`RELAYED_HEADERS`)."""
    return {k: v for k in RELAYED_HEADERS if (v := up_headers.get(k)) is not None}


def parse_answer(proto: WireProtocol, content: bytes) -> tuple[dict[str, Any] | None, int]:
    """``content`` parsed (strict JSON: non-finite numbers as None, :mod:`wire.jsonsafe`) as
    a valid answer of ``proto`` (:meth:`WireProtocol.is_answer`), or None; and the number of
    non-finite numbers replaced."""
    try:
        parsed, replaced = loads_strict(content)
    except (ValueError, UnicodeDecodeError):
        return None, 0
    return (parsed, replaced) if proto.is_answer(parsed) else (None, 0)


def _non_finite(replaced: int) -> dict[str, Any]:
    return {"non_finite_numbers": replaced} if replaced else {}


def client_left(call: Call, *, backing_off: bool) -> tuple[CallEnd, Response]:
    """A client that left before any answer (the upstream request was cancelled). Left during
    the wait before a retry whose last attempt never reached the model (a connect failure, an
    upstream 429/503), the call uses no budget."""
    refund = False
    if backing_off:
        phase = Phase.BACKOFF
        last = call.attempts[-1].status if call.attempts else None
        refund = last is None or last in NOT_PROCESSED_STATUS
    else:
        phase = Phase.FIRST_BYTE if call.upstream_status is None else Phase.BODY
    body = gone_body(
        call.proto,
        f"the client closed the connection after {time.perf_counter() - call.t0:.3f} s, "
        f"before the upstream {call.route_key} answered; the upstream request was cancelled",
    )
    end = CallEnd(
        StepStatus.CLIENT_DISCONNECTED,
        call.upstream_status,
        body,
        answered=499,
        meta={"phase": phase.value},
        refund=refund,
        wait=False,
    )
    return end, StrictJSONResponse(body, status_code=499)


def failed(call: Call, f: UpstreamFailed) -> tuple[CallEnd, Response]:
    """No usable upstream answer (unreachable, broken, timed out): the gateway's 502/504."""
    body = call.proto.client_error(f.status, f.error)
    end = CallEnd(
        f.step_status,
        f.status,
        body,
        answered=f.status,
        meta={"phase": f.phase.value, "error": f.error["error"]},
        refund=before_model(f),
    )
    return end, StrictJSONResponse(body, status_code=f.status)


def unclaimed(call: Call, status: int, content: bytes) -> CallEnd:
    """A detached call's answer that no retry came for: kept, as ``client_disconnected``."""
    answer, replaced = parse_answer(call.proto, content)
    response = answer if answer is not None else {"raw_body": _raw_text(content)}
    return CallEnd(
        StepStatus.CLIENT_DISCONNECTED,
        status,
        response,
        answered=499,
        meta={"phase": Phase.DETACHED.value, **_non_finite(replaced)},
        wait=False,
    )


def plain(call: Call, status: int, up_headers: Mapping[str, str], content: bytes) -> tuple[CallEnd, Response]:
    """A non-streamed upstream answer relayed with its status: an answer (2xx) or an error
    (4xx/5xx, whatever its body). A 2xx body that is not an answer of the protocol becomes a 502
    ``upstream_invalid_response`` (the raw body kept in the step). A body with non-finite
    numbers is re-encoded as strict JSON (:mod:`wire.jsonsafe`): the client gets what is
    recorded."""
    replaced = 0
    parsed: Any
    try:
        parsed, replaced = loads_strict(content) if content else (None, 0)
    except (ValueError, UnicodeDecodeError):
        parsed = None
    if replaced:
        content = compact(parsed).encode("utf-8")
    if call.capture_added and 200 <= status < 300:
        stripped = strip_answer(parsed, call.capture_added)
        if stripped is not None:  # what the client did not ask for (the step keeps it)
            content = compact(stripped).encode("utf-8")
    recorded: Any
    if parsed is None:
        recorded = {"raw_body": _raw_text(content), "content_type": up_headers.get("Content-Type")}
    else:
        recorded = parsed
    ok = 200 <= status < 300
    if ok and not call.proto.is_answer(parsed):
        return _invalid(call, status, up_headers, content, recorded)
    step_status = call.proto.answer_status(parsed) if ok else StepStatus.ERROR
    meta = (
        _non_finite(replaced)
        if step_status == StepStatus.OK
        else {"error": _error_text(parsed, content), **_non_finite(replaced)}
    )
    headers = relayed_headers(up_headers)
    media = up_headers.get("Content-Type", "application/json")
    replay = Replay(status, headers, content, media) if step_status == StepStatus.OK else None
    end = CallEnd(
        step_status,
        status,
        recorded,
        answered=status,
        meta=meta,
        refund=status in NOT_PROCESSED_STATUS,
        replay=replay,
    )
    return end, Response(content=content, status_code=status, headers=headers, media_type=media)


def synthesized(
    call: Call, up_headers: Mapping[str, str], answer: dict[str, Any], replaced: int = 0
) -> tuple[CallEnd, Response]:
    """A streaming client answered from a finished answer (a route that cannot stream, or an
    upstream that answered JSON): the answer re-told as a short stream of the protocol."""
    step_status = call.proto.answer_status(answer)
    headers = {**SSE_HEADERS, **relayed_headers(up_headers)}
    shown = strip_answer(answer, call.capture_added) if call.capture_added else None
    chunks = call.proto.to_stream(answer if shown is None else shown, call.req)
    replay = (
        Replay(200, headers, b"".join(chunks), "text/event-stream") if step_status == StepStatus.OK else None
    )
    end = CallEnd(
        step_status,
        200,
        answer,
        answered=200,
        meta={"stream_synthesized": True, **_non_finite(replaced)},
        replay=replay,
    )
    return end, StreamingResponse(_iter(chunks), media_type="text/event-stream", headers=headers)


def synthetic_stop(call: Call) -> tuple[CallEnd, Response]:
    """The protocol's stop answer for a session whose budget is used: no upstream call, no
    step; the session's state (now truncated) is persisted."""
    call.gw.metrics.synthetic_stops.inc()
    if call.gw.rejections is not None:
        call.gw.rejections.note(
            method="POST",
            path=call.proto.endpoint,
            status=200,
            reason="max_steps",
            message="the session's step budget is used: synthetic stop",
            session_id=call.session_id,
            route=call.route_key,
        )
    answer = call.proto.stop_answer(call.route_key, call.req)
    end = CallEnd(None, 200, None, answered=200)
    if call.stream:
        return end, StreamingResponse(
            _iter(call.proto.to_stream(answer, call.req)), media_type="text/event-stream", headers=STOP_HEADER
        )
    return end, StrictJSONResponse(answer, headers=STOP_HEADER)


def _invalid(
    call: Call, status: int, up_headers: Mapping[str, str], content: bytes, recorded: Any
) -> tuple[CallEnd, Response]:
    ctype = up_headers.get("Content-Type") or "no content type"
    head = content[:200].decode("utf-8", "replace")
    err = error_body(
        502,
        f"upstream {call.route_key} answered HTTP {status} with a body that is not a JSON "
        f"{call.proto.answer_name} ({ctype}, {len(content)} bytes): {head!r}",
        code="upstream_invalid_response",
    )
    end = CallEnd(
        StepStatus.ERROR, 502, recorded, answered=502, meta={"error": err["error"], "upstream_status": status}
    )
    return end, StrictJSONResponse(call.proto.client_error(502, err), status_code=502)


def _raw_text(content: bytes) -> str:
    return content[:RAW_BODY_LIMIT].decode("utf-8", "replace")


def _error_text(parsed: Any, content: bytes) -> str:
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        return str(parsed["error"].get("message"))
    if isinstance(parsed, dict) and "error" in parsed:
        return str(parsed["error"])
    return content[:500].decode("utf-8", "replace")


async def _iter(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for c in chunks:
        yield c
