"""``POST .../v1/messages/count_tokens``: never a step, never budget; counted by the route's
``count_tokens`` method (docs/gateway-protocols.md, "Token counting")."""

from __future__ import annotations

import json
import logging
import math
import time
from typing import Any

import aiohttp
from fastapi import Request
from fastapi.responses import Response

from gateway.bodies import check_session_id, parse_json_body, read_body, validate_body
from gateway.errors import GatewayError
from gateway.forward import check_route
from gateway.protocols import MESSAGES
from gateway.state import GatewayState
from wire.errors import anthropic_error, error_body, set_error_shape
from wire.jsonsafe import StrictJSONResponse
from wire.requests import WireRequest

log = logging.getLogger(__name__)

ENDPOINT = "messages.count_tokens"
METHOD_HEADER = "x-gateway-token-count"
CHARS_PER_TOKEN = 4
"""The estimate's characters per token (OpenAI's and Anthropic's rule of thumb for English)."""
TOKENS_PER_MESSAGE = 3
"""The estimate's tokens per message for its role and chat-template markers."""


class CountTokensRequest(WireRequest):
    """A count_tokens body: ``model`` and ``messages`` (no ``max_tokens``); the rest kept as sent."""

    messages: list[dict[str, Any]]


def _text_of(content: Any) -> str:
    """The text a tokenizer sees in a content value: a string, or the text of a block list (text,
    thinking, tool inputs as JSON, tool results); images and documents count as nothing."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    parts: list[str] = []
    for block in content:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            parts.append(str(block.get("text") or ""))
        elif kind == "thinking":
            parts.append(str(block.get("thinking") or ""))
        elif kind in ("tool_use", "server_tool_use"):
            parts.append(f"{block.get('name') or ''} {json.dumps(block.get('input'), ensure_ascii=False)}")
        elif kind == "tool_result":
            parts.append(_text_of(block.get("content")))
    return "\n".join(parts)


def conversation(body: dict[str, Any]) -> list[dict[str, str]]:
    """The request as plain chat messages (``role``, ``content`` text): ``system`` first, then
    every message with its content flattened by :func:`_text_of`."""
    out: list[dict[str, str]] = []
    if body.get("system") is not None:
        out.append({"role": "system", "content": _text_of(body["system"])})
    for m in body.get("messages") or []:
        if isinstance(m, dict):
            out.append({"role": str(m.get("role")), "content": _text_of(m.get("content"))})
    return out


def _tools_text(body: dict[str, Any]) -> str:
    tools = body.get("tools")
    return json.dumps(tools, ensure_ascii=False) if tools else ""


def estimate_tokens(body: dict[str, Any]) -> int:
    """``ceil(characters / CHARS_PER_TOKEN)`` over the conversation's text and the tools' JSON,
    plus :data:`TOKENS_PER_MESSAGE` per message; an estimate, not a tokenizer's count."""
    msgs = conversation(body)
    chars = sum(len(m["content"]) for m in msgs) + len(_tools_text(body))
    return math.ceil(chars / CHARS_PER_TOKEN) + TOKENS_PER_MESSAGE * len(msgs)


def _origin(base_url: str) -> str:
    """An OpenAI-style ``base_url`` without its trailing ``/v1`` (where tokenizer endpoints live)."""
    return base_url[:-3] if base_url.endswith("/v1") else base_url


async def handle(request: Request, session_id: str | None = None) -> Response:
    """Answer one count_tokens call; GatewayError (Anthropic's shape) for 400, 404, 413, 502 and 504."""
    set_error_shape(request, MESSAGES.client_error)
    gw: GatewayState = request.app.state.gw
    t0 = time.perf_counter()
    if session_id is not None:
        check_session_id(session_id)
    body = parse_json_body(await read_body(request, gw.settings.max_request_bytes))
    req = validate_body(CountTokensRequest, body)
    key = check_route(gw, None, ENDPOINT, req.model, session_id)
    route = gw.settings.llm_routes[key]
    method = route.token_counter()
    status = 200
    try:
        if method == "upstream":
            response = await _forward(gw, request, key, body, session_id)
            status = response.status_code
        else:
            n = (
                estimate_tokens(body)
                if method == "estimate"
                else await _tokenize(gw, key, method, body, session_id)
            )
            response = StrictJSONResponse({"input_tokens": n}, headers={METHOD_HEADER: method})
    except GatewayError as e:
        status = e.status
        raise
    finally:
        gw.metrics.answer(ENDPOINT, key, status, time.perf_counter() - t0)
    if gw.request_log is not None:
        gw.request_log.write(
            session_id=session_id,
            route=key,
            endpoint=ENDPOINT,
            http_status=status,
            step_status=None,
            latency_ms=(time.perf_counter() - t0) * 1000,
            request=body,
            response=_logged(response),
        )
    return response


def _logged(response: Response) -> Any:
    try:
        return json.loads(bytes(response.body))
    except ValueError:
        return None


def _upstream_model(gw: GatewayState, key: str) -> str:
    return gw.settings.llm_routes[key].upstream_model or key


async def _post(
    gw: GatewayState,
    key: str,
    path: str,
    payload: dict[str, Any],
    headers: dict[str, str],
    session_id: str | None,
    *,
    at_origin: bool,
) -> tuple[int, bytes, str | None]:
    """POST ``payload`` to the route: (status, body, content type); GatewayError 502/504 when
    the upstream cannot be reached or times out."""
    route = gw.settings.llm_routes[key]
    all_headers = {
        "Content-Type": "application/json",
        "Accept": "application/json",
        **headers,
        **route.extra_headers,
    }
    if session_id is not None:
        all_headers["X-Session-Id"] = session_id
    try:
        async with gw.upstream.post(
            key,
            path,
            json.dumps(payload).encode(),
            all_headers,
            session_id,
            base=_origin if at_origin else None,
        ) as resp:
            return resp.status, await resp.read(), resp.headers.get("Content-Type")
    except TimeoutError as e:
        raise GatewayError(
            504, f"upstream {key} timed out counting tokens: {type(e).__name__}: {e}", code="upstream_timeout"
        ) from e
    except aiohttp.ClientError as e:
        raise GatewayError(
            502,
            f"upstream {key} unreachable for counting tokens: {type(e).__name__}: {e}",
            code="upstream_unreachable",
        ) from e


async def _forward(
    gw: GatewayState, request: Request, key: str, body: dict[str, Any], session_id: str | None
) -> Response:
    """The route's own count_tokens endpoint (query string kept, e.g. ``?beta=true``): its
    answer relayed with its status; a 2xx that is not ``{"input_tokens": int}`` is a 502."""
    route = gw.settings.llm_routes[key]
    path = "/v1/messages/count_tokens" + (f"?{request.url.query}" if request.url.query else "")
    payload = {**body, "model": _upstream_model(gw, key)}
    status, content, ctype = await _post(
        gw, key, path, payload, MESSAGES.upstream_headers(route, request.headers), session_id, at_origin=False
    )
    if 200 <= status < 300:
        try:
            parsed = json.loads(content)
        except ValueError:
            parsed = None
        if not (isinstance(parsed, dict) and isinstance(parsed.get("input_tokens"), int)):
            raise GatewayError(
                502,
                f"upstream {key} answered count_tokens with HTTP {status} but no integer "
                f"input_tokens: {content[:200]!r}",
                code="upstream_invalid_response",
            )
    elif ctype is None or "json" not in ctype:
        err = error_body(
            status, f"upstream {key} answered count_tokens with HTTP {status}: {content[:200]!r}"
        )
        return StrictJSONResponse(
            anthropic_error(status, err), status_code=status, headers={METHOD_HEADER: "upstream"}
        )
    return Response(
        content,
        status_code=status,
        media_type=ctype or "application/json",
        headers={METHOD_HEADER: "upstream"},
    )


async def _tokenize(
    gw: GatewayState, key: str, method: str, body: dict[str, Any], session_id: str | None
) -> int:
    """The count of the route's tokenizer endpoint (vLLM's ``/tokenize``, llama-cpp-python's
    ``/extras/tokenize/count``); GatewayError 502 for any answer without one."""
    msgs = conversation(body)
    model = _upstream_model(gw, key)
    if method == "vllm":
        path = "/tokenize"
        payload: dict[str, Any] = {"model": model, "messages": msgs, "add_generation_prompt": True}
        if body.get("tools"):
            payload["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": t.get("name"),
                        "description": t.get("description"),
                        "parameters": t.get("input_schema"),
                    },
                }
                for t in body["tools"]
                if isinstance(t, dict)
            ]
    else:
        path = "/extras/tokenize/count"
        text = "\n".join(f"{m['role']}: {m['content']}" for m in msgs)
        tools = _tools_text(body)
        payload = {"model": model, "input": text + ("\n" + tools if tools else "")}
    route = gw.settings.llm_routes[key]
    headers = {"Authorization": f"Bearer {route.api_key}"} if route.api_key else {}
    status, content, _ = await _post(gw, key, path, payload, headers, session_id, at_origin=True)
    try:
        parsed = json.loads(content)
    except ValueError:
        parsed = None
    count = parsed.get("count") if isinstance(parsed, dict) else None
    if status != 200 or not isinstance(count, int):
        raise GatewayError(
            502,
            f"route {key} counts tokens with {method} ({path}), which answered HTTP {status}: "
            f"{content[:200]!r}; set the route's count_tokens to estimate if its server has "
            "no tokenizer endpoint",
            code="token_count_failed",
        )
    return count
