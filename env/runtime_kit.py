"""Shared helper for runtimes: read one ``SimulationStartRequest`` on stdin, run the agent against the
gateway session URL, print one ``SimulationStartResult`` JSON line last on stdout (logs to stderr).
Use: ``run_runtime(main)`` with ``def main(req) -> SimulationStartResult`` (docs/envs.md)."""

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
    """Read the whole of ``stream`` (default stdin) as one ``SimulationStartRequest``
    (``pydantic.ValidationError`` when malformed)."""
    text = (stream or sys.stdin).read()
    return model_from_json(SimulationStartRequest, text)


def openai_client(
    req: SimulationStartRequest, max_retries: int = 2, timeout_s: float = 600.0
) -> openai.OpenAI:
    """An ``openai.OpenAI`` client on the session URL ``req.gateway_base_url``, its key from
    ``OPENAI_API_KEY`` (default ``sk-rollout``: the gateway holds the real keys)."""
    return openai.OpenAI(
        base_url=req.gateway_base_url,
        api_key=os.environ.get("OPENAI_API_KEY", DEFAULT_API_KEY),
        max_retries=max_retries,
        timeout=timeout_s,
    )


def chat_completion(client: openai.OpenAI, **kwargs: Any) -> tuple[ChatCompletion, str | None]:
    """``client.chat.completions.create(**kwargs)`` (non-streaming) and the gateway's stop reason
    (the ``x-gateway-stop-reason`` header: ``"max_steps"`` for its synthetic stop, else None)."""
    raw = client.chat.completions.with_raw_response.create(**kwargs)
    return raw.parse(), raw.headers.get(STOP_REASON_HEADER)


def emit_result(result: SimulationStartResult, stream: TextIO | None = None) -> None:
    """Print ``result`` as ONE JSON line on ``stream`` (default stdout) and flush; call it last."""
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
    """The class an exception claims: ``gateway_unreachable`` (connection error or timeout),
    ``upstream_unavailable`` (HTTP 429/5xx), else None. A claim only: the launcher decides from its
    own and the gateway's records."""
    if isinstance(exc, openai.APIConnectionError):
        return "gateway_unreachable"
    if isinstance(exc, openai.APIStatusError) and (exc.status_code == 429 or exc.status_code >= 500):
        return "upstream_unavailable"
    return None


def run_runtime(main: Callable[[SimulationStartRequest], SimulationStartResult]) -> None:
    """Read the start request, call ``main(req)``, emit its result. Any exception becomes a ``failed``
    result (``error_text`` ``"ExcType: message"``, ``error_class`` from :func:`infra_error_class`)
    and the process exits 0; stdout goes to stderr while ``main`` runs so stray prints cannot
    corrupt the result line; logging to stderr at ``ROLLOUT_LOG_LEVEL`` (default INFO)."""
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
