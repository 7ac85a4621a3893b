"""Shared helper for runtimes (the runtime contract).

A runtime is a process that reads one ``SimulationStartRequest`` JSON document on stdin, runs the
agent against the gateway session URL and prints one ``SimulationStartResult`` JSON line last on
stdout. Logs go to stderr, never stdout. Typical use::

    def main(req: SimulationStartRequest) -> SimulationStartResult: ...

    if __name__ == "__main__":
        run_runtime(main)
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys
from collections.abc import Callable
from typing import Any, Literal, TextIO

import openai
from openai.types.chat import ChatCompletion

from rollout.protocol import SimulationStartRequest, SimulationStartResult, model_from_json, model_json

logger = logging.getLogger(__name__)

DEFAULT_API_KEY = "sk-rollout"
# Set by the gateway on the synthetic stop answer it sends once the session's step budget is used.
STOP_REASON_HEADER = "x-gateway-stop-reason"


def read_start_request(stream: TextIO | None = None) -> SimulationStartRequest:
    """Read the whole of ``stream`` (default ``sys.stdin``) as one ``SimulationStartRequest``.

    Raises ``pydantic.ValidationError`` when the JSON is malformed or misses required fields.
    """
    text = (stream or sys.stdin).read()
    return model_from_json(SimulationStartRequest, text)


def openai_client(req: SimulationStartRequest, max_retries: int = 2, timeout_s: float = 600.0) -> openai.OpenAI:
    """An ``openai.OpenAI`` client bound to the session URL prefix ``req.gateway_base_url``
    (``http://HOST:PORT/v1/sessions/<sid>``; the SDK appends ``/chat/completions``).

    The API key comes from ``OPENAI_API_KEY`` (default ``sk-rollout``: the gateway holds the real
    upstream keys). ``timeout_s`` is the per-request timeout in seconds.
    """
    return openai.OpenAI(
        base_url=req.gateway_base_url,
        api_key=os.environ.get("OPENAI_API_KEY", DEFAULT_API_KEY),
        max_retries=max_retries,
        timeout=timeout_s,
    )


def chat_completion(client: openai.OpenAI, **kwargs: Any) -> tuple[ChatCompletion, str | None]:
    """Call ``client.chat.completions.create(**kwargs)`` (non-streaming) and return
    ``(completion, gateway_stop_reason)``; the stop reason is the ``x-gateway-stop-reason`` header
    (``"max_steps"`` when the gateway answered with its synthetic stop instead of the model), else
    None. Raises the SDK's ``openai.APIError`` subclasses like ``create`` does.
    """
    raw = client.chat.completions.with_raw_response.create(**kwargs)
    return raw.parse(), raw.headers.get(STOP_REASON_HEADER)


def emit_result(result: SimulationStartResult, stream: TextIO | None = None) -> None:
    """Print ``result`` as ONE JSON line on ``stream`` (default ``sys.stdout``) and flush.

    Call it last: the launcher reads the last stdout line.
    """
    out = stream or sys.stdout
    out.write(model_json(result) + "\n")
    out.flush()


def _session_id_from(raw: str) -> str:
    """Best-effort ``session_id`` of a start request that did not validate ("" when unknown)."""
    try:
        value = json.loads(raw).get("session_id", "")
    except (ValueError, AttributeError):
        return ""
    return value if isinstance(value, str) else ""


InfraErrorClass = Literal["gateway_unreachable", "upstream_unavailable"]


def infra_error_class(exc: BaseException) -> InfraErrorClass | None:
    """``gateway_unreachable`` for an SDK connection error or timeout (the gateway did not
    answer), ``upstream_unavailable`` for an HTTP 429/5xx answer (the model was unavailable after
    the gateway's own retries), None for anything else (the agent's own failure). The class is a
    claim in the result; the launcher decides from its own and the gateway's records."""
    if isinstance(exc, openai.APIConnectionError):
        return "gateway_unreachable"
    if isinstance(exc, openai.APIStatusError) and (exc.status_code == 429 or exc.status_code >= 500):
        return "upstream_unavailable"
    return None


def run_runtime(main: Callable[[SimulationStartRequest], SimulationStartResult]) -> None:
    """Read the start request from stdin, call ``main(req)`` and emit its result.

    Any exception (including an unreadable request) becomes a ``failed`` result whose
    ``error_text`` is ``"ExcType: message"`` and whose ``error_class`` says when the failure was
    the gateway's or the model server's (:func:`infra_error_class`; the launcher retries only
    what its own records confirm);
    the process still exits 0, because the launcher reads ``status``. While ``main`` runs, ``sys.stdout`` is redirected to stderr so stray prints cannot
    corrupt the result line. Configures logging to stderr (level from ``ROLLOUT_LOG_LEVEL``, default
    INFO; an unknown level name means INFO) when nothing configured it yet.
    """
    level = os.environ.get("ROLLOUT_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(
        stream=sys.stderr,
        level=level if level in logging.getLevelNamesMapping() else "INFO",
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    raw = sys.stdin.read()
    session_id = _session_id_from(raw)
    try:
        req = read_start_request(io.StringIO(raw))
        session_id = req.session_id
        with contextlib.redirect_stdout(sys.stderr):
            result = main(req)
    except Exception as exc:  # the runtime contract: every failure is reported as a result
        logger.exception("runtime failed")
        result = SimulationStartResult(
            session_id=session_id,
            status="failed",
            terminated=False,
            error_text=f"{type(exc).__name__}: {exc}",
            error_class=infra_error_class(exc),
        )
    emit_result(result)
