"""The policy server: an OpenAI-compatible chat completions upstream that samples from a trainer's
in-memory ``transformers`` model (the very module being optimized, never a copy), answering in
vLLM's shape so a gateway route with ``capture: tokens`` records the exact token ids and logprobs
of every step. Served by uvicorn in a background thread of the trainer's process; generations run
one at a time under a lock the trainer also takes around its optimizer step. Request fields,
answer shape and limits: docs/training.md, "The policy server"."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import uvicorn
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gateway.http_edge import HostAllowList, server_config, with_host_check
from rollout.errors import RolloutError
from rollout.servers.listener import json_refusal, listen, url_of
from rollout.train.continuation import Continuity, SessionPrompts
from rollout.train.sampling import Engine, Generation, SamplingParams, generate
from wire.errors import error_body

__all__ = ["ChatPolicy", "PolicyServer", "RequestError"]

log = logging.getLogger(__name__)

MAX_TOP_LOGPROBS = 20
NEG_INF_LOGPROB = -9999.0  # what vLLM writes for a -inf logprob (JSON has no infinity)


class RequestError(RolloutError):
    """A request the server cannot honour: answered as a 400 in OpenAI's error shape."""

    def __init__(
        self, message: str, *, param: str | None = None, code: str = "invalid_request", status: int = 400
    ) -> None:
        super().__init__(message)
        self.message, self.param, self.code, self.status = message, param, code, status


class _StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = None


class ChatRequest(BaseModel):
    """The request fields the server reads; others are ignored (as vLLM does), except those that
    would change the answer and are not supported, which are refused (:meth:`ChatPolicy.check`)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    messages: list[dict[str, Any]] = Field(min_length=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int | None = None
    stream: bool | None = None
    stream_options: _StreamOptions | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    return_token_ids: bool | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    response_format: dict[str, Any] | None = None


_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass
class _Prepared:
    prompt_ids: list[int]
    params: SamplingParams
    tools_rendered: bool
    session_id: str | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    continuity: Continuity | None = None
    reply: tuple[dict[str, Any], str] | None = None


class ChatPolicy:
    """An :class:`~rollout.train.sampling.Engine` as a chat completions engine: the chat template
    renders the prompt, :func:`rollout.train.sampling.generate` samples under ``lock``. No HTTP."""

    def __init__(
        self,
        engine: Engine,
        *,
        lock: threading.Lock | None = None,
        default_max_tokens: int | None = None,
        defaults: SamplingParams | None = None,
        seed: int | None = None,
        max_tokens_cap: int | None = None,
        continue_sessions: bool = True,
    ) -> None:
        self.engine, self.model_name = engine, engine.name
        # token in, token out: a session's next prompt continues its ids (None: every prompt rendered whole)
        self.sessions = SessionPrompts(engine) if continue_sessions else None
        self.max_tokens_cap = max_tokens_cap  # no completion longer, whatever the request asks
        # requests without a seed draw one from this stream (in arrival order): a run repeats
        self._seeds = None if seed is None else np.random.default_rng(seed)
        self.defaults = defaults or SamplingParams(
            max_new_tokens=0
        )  # temperature, top_p, top_k a request omits
        self.lock = lock or threading.Lock()
        self.default_max_tokens = default_max_tokens
        self.context_length = engine.context_length
        self._warned_tools = False

    # --- request -> prompt ---------------------------------------------------------------------

    def check(self, req: ChatRequest) -> None:
        """Refuse what the server would otherwise silently not do."""
        if req.n not in (None, 1):
            raise RequestError(
                f"n={req.n}: the policy server returns one choice per request (n=1); send n requests instead",
                param="n",
            )
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(req, name) not in (None, 0, 0.0):
                raise RequestError(f"{name} is not supported by the policy server", param=name)
        if req.repetition_penalty not in (None, 1, 1.0):
            raise RequestError(
                "repetition_penalty is not supported by the policy server", param="repetition_penalty"
            )
        if req.response_format is not None and req.response_format.get("type", "text") != "text":
            raise RequestError(
                "response_format other than text is not supported by the policy server",
                param="response_format",
            )
        if req.tools and req.tool_choice not in (None, "auto", "none"):
            raise RequestError(
                f"tool_choice {req.tool_choice!r} cannot be enforced by the policy server "
                "(only auto and none)",
                param="tool_choice",
            )

    def messages(self, req: ChatRequest) -> list[dict[str, Any]]:
        out = []
        for i, m in enumerate(req.messages):
            content = m.get("content")
            if isinstance(content, list):
                texts = []
                for part in content:
                    if not isinstance(part, dict) or part.get("type") not in ("text", "input_text"):
                        raise RequestError(
                            f"messages[{i}].content: only text parts are supported",
                            param=f"messages[{i}].content",
                        )
                    texts.append(str(part.get("text", "")))
                content = "".join(texts)
            elif content is None:
                content = ""
            elif not isinstance(content, str):
                raise RequestError(
                    f"messages[{i}].content must be a string or a list of parts",
                    param=f"messages[{i}].content",
                )
            out.append({**m, "content": content})
        return out

    def prepare(self, req: ChatRequest, session_id: str | None = None) -> _Prepared:
        """Check ``req`` and make its prompt (continuing ``session_id``'s ids when its messages
        extend them); raises :class:`RequestError`."""
        self.check(req)
        tools = req.tools if req.tools and req.tool_choice != "none" else None
        if tools and not self.engine.takes_tools:
            if not self._warned_tools:
                log.warning(
                    "the chat template of %s renders no tools: tools in requests are ignored", self.model_name
                )
                self._warned_tools = True
            tools = None
        messages = self.messages(req)
        continuity = None
        try:
            if self.sessions is None:
                prompt_ids = self.engine.prompt_ids(messages, tools)
            else:
                prompt_ids, continuity = self.sessions.prompt(session_id, messages, tools)
        except Exception as e:  # a template's own refusal (roles, missing fields) is the client's error
            raise RequestError(
                f"the chat template cannot render these messages: {e}", param="messages"
            ) from e
        room = None if self.context_length is None else self.context_length - len(prompt_ids)
        if room is not None and room < 1:
            raise RequestError(
                f"the prompt has {len(prompt_ids)} tokens; this model's context is "
                f"{self.context_length} tokens",
                param="messages",
                code="context_length_exceeded",
            )
        asked = req.max_completion_tokens or req.max_tokens or self.default_max_tokens
        max_new = asked if room is None else min(asked or room, room)
        if self.max_tokens_cap is not None:
            max_new = min(max_new or self.max_tokens_cap, self.max_tokens_cap)
        if max_new is None:
            raise RequestError(
                "max_tokens is required: the model reports no context length", param="max_tokens"
            )
        stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
        d = self.defaults
        top_k = d.top_k if req.top_k is None else max(req.top_k, 0)
        params = SamplingParams(
            max_new_tokens=max_new,
            temperature=d.temperature if req.temperature is None else req.temperature,
            top_p=d.top_p if req.top_p is None else req.top_p,
            top_k=top_k,
            stop=stop,
            seed=req.seed
            if req.seed is not None or self._seeds is None
            else int(self._seeds.integers(2**63)),
            top_logprobs=(req.top_logprobs or 0) if req.logprobs else 0,
        )
        return _Prepared(prompt_ids, params, tools is not None, session_id, messages, tools, continuity)

    def run(self, prepared: _Prepared) -> Generation:
        """Sample under the weights lock (a generation never sees an optimizer step midway)."""
        with self.lock:
            return generate(self.engine, prepared.prompt_ids, prepared.params)

    def finish(self, prepared: _Prepared, gen: Generation) -> tuple[dict[str, Any], str]:
        """The assistant message and finish reason of ``gen`` (made once per request); keeps the
        session's ids and messages for its next prompt."""
        if prepared.reply is None:
            prepared.reply = self.message(gen, prepared.tools_rendered)
            if self.sessions is not None:
                msg = prepared.reply[0]
                self.sessions.keep(
                    prepared.session_id,
                    prepared.messages,
                    prepared.tools,
                    prepared.prompt_ids,
                    gen.token_ids,
                    {**msg, "content": msg.get("content") or ""},
                )
        return prepared.reply

    # --- generation -> answer ------------------------------------------------------------------

    def _logprob_entry(self, token_id: int, logprob: float, top: list[tuple[int, float]]) -> dict[str, Any]:
        text = self.engine.token_text(token_id)
        return {
            "token": text,
            "logprob": _finite(logprob),
            "bytes": list(text.encode("utf-8")),
            "top_logprobs": [
                {
                    "token": (t := self.engine.token_text(i)),
                    "logprob": _finite(v),
                    "bytes": list(t.encode("utf-8")),
                }
                for i, v in top
            ],
        }

    def message(self, gen: Generation, tools_rendered: bool) -> tuple[dict[str, Any], str]:
        """The assistant message and finish reason of ``gen``; with tools rendered, Hermes-style
        ``<tool_call>{"name", "arguments"}</tool_call>`` blocks become ``tool_calls``."""
        msg: dict[str, Any] = {"role": "assistant", "content": gen.text}
        finish: str = gen.finish_reason
        if tools_rendered:
            calls = []
            for raw in _TOOL_CALL.findall(gen.text):
                try:
                    obj = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(obj, dict) and isinstance(obj.get("name"), str):
                    args = obj.get("arguments", {})
                    calls.append(
                        {
                            "id": f"call_{uuid.uuid4().hex[:24]}",
                            "type": "function",
                            "function": {
                                "name": obj["name"],
                                "arguments": args if isinstance(args, str) else json.dumps(args),
                            },
                        }
                    )
            if calls:
                rest = _TOOL_CALL.sub("", gen.text).strip()
                msg = {"role": "assistant", "content": rest or None, "tool_calls": calls}
                finish = "tool_calls" if gen.finish_reason == "stop" else finish
        return msg, finish

    def completion(self, req: ChatRequest, prepared: _Prepared, gen: Generation) -> dict[str, Any]:
        """The ``chat.completion`` object (vLLM's extra fields only when asked)."""
        msg, finish = self.finish(prepared, gen)
        choice: dict[str, Any] = {"index": 0, "message": msg, "logprobs": None, "finish_reason": finish}
        if req.logprobs:
            choice["logprobs"] = {"content": self._logprob_content(gen)}
        if req.return_token_ids:
            choice["token_ids"] = list(gen.token_ids)
        out: dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": req.model or self.model_name,
            "choices": [choice],
            "usage": _usage(prepared, gen),
        }
        if req.return_token_ids:
            out["prompt_token_ids"] = list(prepared.prompt_ids)
            if prepared.continuity is not None:
                out["prompt_continuity"] = prepared.continuity.as_json()
        return out

    def _logprob_content(self, gen: Generation) -> list[dict[str, Any]]:
        tops = gen.top or [[] for _ in gen.token_ids]
        return [
            self._logprob_entry(t, lp, top)
            for t, lp, top in zip(gen.token_ids, gen.logprobs, tops, strict=True)
        ]

    def chunks(self, req: ChatRequest, prepared: _Prepared, gen: Generation) -> Iterator[dict[str, Any]]:
        """The same answer as ``chat.completion.chunk`` objects: the role (and, asked, the prompt
        ids) first, then one chunk per token (its text delta, id and logprob), then the finish
        reason, then the usage when ``stream_options.include_usage``. The whole completion is
        sampled before the first chunk (not incremental)."""
        msg, finish = self.finish(prepared, gen)
        base = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": req.model or self.model_name,
        }
        first: dict[str, Any] = {
            **base,
            "choices": [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
        }
        if req.return_token_ids:
            first["prompt_token_ids"] = list(prepared.prompt_ids)
            if prepared.continuity is not None:
                first["prompt_continuity"] = prepared.continuity.as_json()
        yield first
        text = msg.get("content") or ""
        sent = 0
        content = self._logprob_content(gen) if req.logprobs else None
        for i, token in enumerate(gen.token_ids):
            upto = _common_prefix(self.engine.decode(gen.token_ids[: i + 1]), text)
            if i == len(gen.token_ids) - 1:
                upto = len(text)
            delta: dict[str, Any] = {"content": text[sent:upto]} if upto > sent else {}
            sent = max(sent, upto)
            choice: dict[str, Any] = {
                "index": 0,
                "delta": delta,
                "logprobs": {"content": [content[i]]} if content is not None else None,
                "finish_reason": None,
            }
            if req.return_token_ids:
                choice["token_ids"] = [token]
            yield {**base, "choices": [choice]}
        last: dict[str, Any] = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish}
        if "tool_calls" in msg:
            last["delta"] = {"tool_calls": [{"index": k, **c} for k, c in enumerate(msg["tool_calls"])]}
        yield {**base, "choices": [last]}
        if req.stream_options is not None and req.stream_options.include_usage:
            yield {**base, "choices": [], "usage": _usage(prepared, gen)}


def _finite(v: float) -> float:
    return v if v > float("-inf") else NEG_INF_LOGPROB


def _usage(prepared: _Prepared, gen: Generation) -> dict[str, int]:
    p, c = len(prepared.prompt_ids), len(gen.token_ids)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _error(e: RequestError) -> JSONResponse:
    return JSONResponse(error_body(e.status, e.message, code=e.code, param=e.param), status_code=e.status)


def create_app(policy: ChatPolicy) -> Starlette:
    """The ASGI app: ``POST /v1/chat/completions``, ``GET /v1/models``, ``POST /tokenize`` (vLLM's,
    chat messages), ``GET /health``, ``GET /stats`` (prompts continued, rendered, fallen back).
    Generations run on one worker thread, one at a time (requests queue)."""
    worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="policy-generate")

    async def chat(request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except ValueError:
            return _error(RequestError("the request body is not JSON"))
        if not isinstance(body, dict):
            return _error(RequestError("the request body must be a JSON object"))
        try:
            req = ChatRequest.model_validate(body)
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            return _error(RequestError(f"field {where!r}: {err['msg']}", param=where))
        try:
            prepared = policy.prepare(req, request.headers.get("x-session-id"))
        except RequestError as e:
            return _error(e)
        gen = await asyncio.get_running_loop().run_in_executor(worker, policy.run, prepared)
        if req.stream:
            events = [
                b"data: " + json.dumps(c, separators=(",", ":")).encode() + b"\n\n"
                for c in policy.chunks(req, prepared, gen)
            ]
            events.append(b"data: [DONE]\n\n")
            return StreamingResponse(iter(events), media_type="text/event-stream")
        return JSONResponse(policy.completion(req, prepared, gen))

    async def tokenize(request: Request) -> Response:
        # vLLM's POST /tokenize for chat messages (what the gateway's count_tokens: vllm sends)
        try:
            body = json.loads(await request.body())
            req = ChatRequest.model_validate({"messages": body.get("messages"), "tools": body.get("tools")})
            ids = policy.engine.prompt_ids(
                policy.messages(req), req.tools if policy.engine.takes_tools else None
            )
        except (ValueError, AttributeError, RequestError) as e:
            return _error(e if isinstance(e, RequestError) else RequestError(f"not a tokenize request: {e}"))
        return JSONResponse({"count": len(ids), "max_model_len": policy.context_length, "tokens": ids})

    async def models(request: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {"id": policy.model_name, "object": "model", "created": 0, "owned_by": "rollout-factory"}
                ],
            }
        )

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def stats(request: Request) -> Response:
        return JSONResponse(
            {
                "continue_sessions": policy.sessions is not None,
                **(policy.sessions.stats() if policy.sessions is not None else {}),
            }
        )

    async def not_found(request: Request, exc: Exception) -> Response:
        return _error(
            RequestError(f"no route {request.method} {request.url.path}", code="not_found", status=404)
        )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            worker.shutdown(wait=False, cancel_futures=True)

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/tokenize", tokenize, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
            Route("/stats", stats, methods=["GET"]),
        ],
        exception_handlers={404: not_found, 405: not_found},
        lifespan=lifespan,
    )


class PolicyServer:
    """Serves ``model`` (the trainer's module itself) and ``tokenizer`` on ``host:port`` (0: a free
    port) from a background thread::

        with PolicyServer(model, tokenizer) as server:   # server.base_url: http://127.0.0.1:PORT/v1
            ...                                          # route capture: tokens at it
            with server.lock:                            # around each optimizer step
                optimizer.step()

    ``lock`` (shared with the trainer) is held for each whole generation."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        model_name: str = "policy",
        host: str = "127.0.0.1",
        port: int = 0,
        lock: threading.Lock | None = None,
        default_max_tokens: int | None = None,
        seed: int | None = None,
        max_tokens_cap: int | None = None,
        continue_sessions: bool = True,
    ) -> None:
        # torch is imported only here: the llama.cpp token server (rollout.cli.token_server) has none
        from rollout.train.hf_engine import TransformersEngine

        self.policy = ChatPolicy(
            TransformersEngine(model, tokenizer, name=model_name),
            lock=lock,
            default_max_tokens=default_max_tokens,
            seed=seed,
            max_tokens_cap=max_tokens_cap,
            continue_sessions=continue_sessions,
        )
        self.host, self.port = host, port
        self.base_url = ""
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def lock(self) -> threading.Lock:
        """The weights lock: take it around every change of the weights."""
        return self.policy.lock

    def start(self, timeout_s: float = 30.0) -> str:
        """Start serving; returns the OpenAI base URL (``http://HOST:PORT/v1``)."""
        sock = listen(self.host, self.port, exposes="the policy model")
        try:
            app = with_host_check(
                create_app(self.policy),
                HostAllowList.for_server([self.host, sock.getsockname()[0]]),
                json_refusal,
            )
            server = uvicorn.Server(
                server_config(
                    app, log_level="warning", access_log=False, lifespan="on", timeout_graceful_shutdown=3
                )
            )
        except BaseException:
            sock.close()
            raise
        self._server = server
        self._thread = threading.Thread(
            target=lambda: server.run(sockets=[sock]), name="policy-server", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                sock.close()
                raise RuntimeError("the policy server did not start")
            time.sleep(0.01)
        self.base_url = url_of(sock).rstrip("/") + "/v1"
        return self.base_url

    def stop(self) -> None:
        """Stop serving (waits for the server thread)."""
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
        self._server = self._thread = None

    def __enter__(self) -> PolicyServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
