"""The one scripted fake upstream (an OpenAI-compatible model server) for the project's tests.

A real HTTP/1.1 server on ``127.0.0.1`` written on asyncio streams, so that every scripted
``bytes`` element goes out as ONE ``write()`` + ``drain()``: SSE framing quirks
(:mod:`tests.faults`) are reproducible byte for byte. ``up.script(path, [Reply | callable])``
queues replies (a callable may await, e.g. an event, before answering); unscripted calls get a
default chat / Responses / Messages answer. ``up.requests`` records what arrived. Framing,
delays, defaults and observation helpers: docs/testing.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import shlex
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Literal

__all__ = [
    "ANSWER_FILE",
    "DEFAULT_ANTHROPIC_USAGE",
    "DEFAULT_RESPONSES_USAGE",
    "DEFAULT_TEXT",
    "DEFAULT_USAGE",
    "DONE",
    "FakeRequest",
    "FakeUpstream",
    "Plan",
    "PolicyError",
    "PolicyTurn",
    "Reply",
    "SUBMIT_COMMAND",
    "ScriptedPolicy",
    "ShellTool",
    "anthropic_message",
    "chat_chunk",
    "chat_completion",
    "chat_stream",
    "default_messages_stream",
    "default_responses_stream",
    "find_shell_tool",
    "messages_stream",
    "response_object",
    "responses_stream",
    "sse_data",
    "sse_event",
    "usage_chunk",
]

log = logging.getLogger(__name__)

DONE = b"data: [DONE]\n\n"
DEFAULT_TEXT = "hello from fake"
DEFAULT_USAGE = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
DEFAULT_RESPONSES_USAGE = {"input_tokens": 5, "output_tokens": 3, "total_tokens": 8}
DEFAULT_ANTHROPIC_USAGE = {"input_tokens": 5, "output_tokens": 3}
_DEFAULT_PIECES = ("hello", " from", " fake")

Framing = Literal["chunked", "length", "close"]


def _dumps(obj: Any) -> str:
    """Compact JSON, UTF-8 kept; a string no UTF-8 can carry (a lone surrogate) makes the whole
    text ``\\uXXXX`` escapes, as a Python server sends it."""
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(obj, separators=(",", ":"))
    return text


def sse_data(obj: Any) -> bytes:
    """``b"data: <compact JSON>\\n\\n"`` for any JSON-able object (one SSE event)."""
    return b"data: " + _dumps(obj).encode("utf-8") + b"\n\n"


def chat_chunk(
    content: str | None = None,
    *,
    reasoning: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    finish_reason: str | None = None,
    role: str | None = None,
    usage: dict[str, Any] | None = None,
    id: str = "c1",
    model: str = "m",
    index: int = 0,
    created: int = 0,
    logprobs: dict[str, Any] | None = None,
) -> bytes:
    """One ``chat.completion.chunk`` SSE event (OpenAI chat streaming format) as bytes::

        data: {"id":id,"object":"chat.completion.chunk","created":created,"model":model,
               "choices":[{"index":index,"delta":{...},"finish_reason":finish_reason}]
               [,"usage":usage]}\\n\\n

    The delta holds only the given fields (``role``, ``content``, ``reasoning``,
    ``tool_calls``), so ``chat_chunk(finish_reason="stop")`` has ``"delta":{}``; ``logprobs``
    goes into the choice. Non-finite floats are written as ``NaN``/``Infinity`` (not JSON, as
    some servers send them).
    """
    delta: dict[str, Any] = {}
    if role is not None:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    if reasoning is not None:
        delta["reasoning"] = reasoning
    if tool_calls is not None:
        delta["tool_calls"] = tool_calls
    obj: dict[str, Any] = {
        "id": id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": index, "delta": delta, "finish_reason": finish_reason}],
    }
    if logprobs is not None:
        obj["choices"][0]["logprobs"] = logprobs
    if usage is not None:
        obj["usage"] = usage
    return sse_data(obj)


def usage_chunk(usage: dict[str, Any], *, id: str = "c1", model: str = "m", created: int = 0) -> bytes:
    """The usage-only final chunk of an OpenAI stream with ``stream_options.include_usage``:
    ``"choices": []`` plus ``usage``."""
    return sse_data(
        {
            "id": id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [],
            "usage": usage,
        }
    )


def chat_completion(
    content: str | None = DEFAULT_TEXT,
    *,
    tool_calls: list[dict[str, Any]] | None = None,
    reasoning: str | None = None,
    finish_reason: str = "stop",
    usage: dict[str, Any] | None = None,
    id: str = "c1",
    model: str = "m",
    created: int = 0,
) -> dict[str, Any]:
    """A non-streaming ``chat.completion`` object (OpenAI chat API) with one choice; ``usage``
    defaults to :data:`DEFAULT_USAGE`; ``reasoning`` goes to ``message.reasoning_content``."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    return {
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}],
        "usage": dict(DEFAULT_USAGE) if usage is None else usage,
    }


def sse_event(obj: dict[str, Any]) -> bytes:
    """``b"event: <obj["type"]>\ndata: <compact JSON>\n\n"``: one event of an OpenAI Responses
    or Anthropic Messages stream (both repeat the payload's ``type`` in the ``event:`` line)."""
    return b"event: " + str(obj["type"]).encode("utf-8") + b"\n" + sse_data(obj)


def response_object(
    content: str | None = DEFAULT_TEXT,
    *,
    output: list[dict[str, Any]] | None = None,
    usage: dict[str, Any] | None = None,
    status: str = "completed",
    id: str = "resp_1",
    model: str = "m",
) -> dict[str, Any]:
    """A non-streaming OpenAI Responses ``response`` object (API reference, "The response
    object"). ``output`` defaults to one assistant ``message`` item holding ``content`` as an
    ``output_text`` part; ``usage`` defaults to :data:`DEFAULT_RESPONSES_USAGE`."""
    if output is None:
        output = [
            {
                "type": "message",
                "id": "msg_1",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": content, "annotations": []}],
            }
        ]
    return {
        "id": id,
        "object": "response",
        "created_at": 0,
        "status": status,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "max_output_tokens": None,
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": None,
        "temperature": None,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": None,
        "truncation": "disabled",
        "metadata": {},
        "usage": dict(DEFAULT_RESPONSES_USAGE) if usage is None else usage,
    }


def default_responses_stream(model: str = "m") -> list[bytes]:
    """The Responses stream of :func:`response_object` (one element per event, with
    ``sequence_number``): ``response.created``, ``response.in_progress``,
    ``response.output_item.added``, ``response.content_part.added``, one
    ``response.output_text.delta`` per piece of ``DEFAULT_TEXT``, ``response.output_text.done``,
    ``response.content_part.done``, ``response.output_item.done``, ``response.completed``."""
    final = response_object(model=model)
    item = final["output"][0]
    pending = {**final, "status": "in_progress", "output": [], "usage": None}
    ids = {"item_id": item["id"], "output_index": 0}
    part = {"type": "output_text", "text": "", "annotations": []}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": pending},
        {"type": "response.in_progress", "response": pending},
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {**item, "status": "in_progress", "content": []},
        },
        {"type": "response.content_part.added", **ids, "content_index": 0, "part": part},
    ]
    events += [
        {"type": "response.output_text.delta", **ids, "content_index": 0, "delta": p} for p in _DEFAULT_PIECES
    ]
    events += [
        {"type": "response.output_text.done", **ids, "content_index": 0, "text": DEFAULT_TEXT},
        {
            "type": "response.content_part.done",
            **ids,
            "content_index": 0,
            "part": {**part, "text": DEFAULT_TEXT},
        },
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": "response.completed", "response": final},
    ]
    return [sse_event({**ev, "sequence_number": n}) for n, ev in enumerate(events)]


def anthropic_message(
    content: str | None = DEFAULT_TEXT,
    *,
    blocks: list[dict[str, Any]] | None = None,
    usage: dict[str, Any] | None = None,
    stop_reason: str = "end_turn",
    id: str = "msg_1",
    model: str = "m",
) -> dict[str, Any]:
    """A non-streaming Anthropic ``message`` (API reference, "Messages"). ``blocks`` default to
    one ``text`` block holding ``content``; ``usage`` defaults to :data:`DEFAULT_ANTHROPIC_USAGE`."""
    if blocks is None:
        blocks = [{"type": "text", "text": content}]
    return {
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": blocks,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": dict(DEFAULT_ANTHROPIC_USAGE) if usage is None else usage,
    }


def default_messages_stream(model: str = "m") -> list[bytes]:
    """The Anthropic stream of :func:`anthropic_message` (one element per event):
    ``message_start`` (usage with ``output_tokens: 1``), ``content_block_start``, ``ping``, one
    ``text_delta`` per piece of ``DEFAULT_TEXT``, ``content_block_stop``, ``message_delta``
    (``stop_reason: end_turn``, ``output_tokens: 3``), ``message_stop``."""
    start = {
        **anthropic_message(model=model),
        "content": [],
        "stop_reason": None,
        "usage": {**DEFAULT_ANTHROPIC_USAGE, "output_tokens": 1},
    }
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": start},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "ping"},
    ]
    events += [
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}}
        for p in _DEFAULT_PIECES
    ]
    events += [
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": DEFAULT_ANTHROPIC_USAGE["output_tokens"]},
        },
        {"type": "message_stop"},
    ]
    return [sse_event(ev) for ev in events]


@dataclass
class Reply:
    """One scripted HTTP response (see the module docstring for framing and timing)."""

    status: int = 200
    headers: dict[str, str] | None = None
    chunks: list[bytes] = field(default_factory=list)
    delay_s: float | Sequence[float] = 0.0
    delay_headers_s: float = 0.0
    close_abruptly: bool = False
    never_respond: bool = False
    framing: Framing = "chunked"

    @classmethod
    def json(cls, obj: Any, status: int = 200, headers: dict[str, str] | None = None, **kw: Any) -> Reply:
        """A JSON body (``application/json``, ``Content-Length``) in one write."""
        hdrs = {"content-type": "application/json"}
        hdrs.update({k.lower(): v for k, v in (headers or {}).items()})
        kw.setdefault("framing", "length")
        return cls(status=status, headers=hdrs, chunks=[_dumps(obj).encode("utf-8")], **kw)

    @classmethod
    def sse(
        cls, chunks: Sequence[bytes], status: int = 200, headers: dict[str, str] | None = None, **kw: Any
    ) -> Reply:
        """A ``text/event-stream`` body, chunked, one HTTP chunk per element of ``chunks``."""
        hdrs = {"content-type": "text/event-stream", "cache-control": "no-cache"}
        hdrs.update({k.lower(): v for k, v in (headers or {}).items()})
        return cls(status=status, headers=hdrs, chunks=list(chunks), **kw)

    @classmethod
    def raw(
        cls,
        body: bytes | Sequence[bytes],
        status: int = 200,
        content_type: str = "text/plain",
        headers: dict[str, str] | None = None,
        **kw: Any,
    ) -> Reply:
        """Any body (e.g. an HTML 502 page); ``Content-Length`` framing unless ``framing`` given."""
        hdrs = {"content-type": content_type}
        hdrs.update({k.lower(): v for k, v in (headers or {}).items()})
        kw.setdefault("framing", "length")
        parts = [body] if isinstance(body, bytes | bytearray) else list(body)
        return cls(status=status, headers=hdrs, chunks=[bytes(p) for p in parts], **kw)


@dataclass
class FakeRequest:
    """One request the fake upstream received. ``headers`` names are lowercased (repeated
    headers joined with ``", "``); ``json`` is the parsed body or None when it is not JSON."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    json: Any = None
    disconnected: bool = False


ReplySource = Reply | Callable[[FakeRequest], "Reply | Awaitable[Reply]"]


class _ClientGone(Exception):
    """The client closed the connection."""


class _Conn:
    """Buffered reader over one connection with at most one outstanding ``read()`` task, so the
    same read can serve as a disconnect watcher while a reply is being written."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader = reader
        self.buf = bytearray()
        self._read: asyncio.Task[bytes] | None = None
        self.eof = False

    def read_task(self) -> asyncio.Task[bytes]:
        if self._read is None:
            self._read = asyncio.ensure_future(self.reader.read(1 << 20))
        return self._read

    def consume_read(self) -> None:
        """Move the finished read's bytes into the buffer (or mark EOF)."""
        task = self._read
        assert task is not None and task.done()
        self._read = None
        try:
            data = task.result()
        except (ConnectionError, OSError):
            data = b""
        if data:
            self.buf += data
        else:
            self.eof = True

    async def fill(self) -> None:
        if self.eof:
            raise _ClientGone
        await asyncio.wait({self.read_task()})
        self.consume_read()
        if self.eof:
            raise _ClientGone

    async def read_until(self, sep: bytes) -> bytes:
        start = 0
        while True:
            i = self.buf.find(sep, start)
            if i >= 0:
                out = bytes(self.buf[: i + len(sep)])
                del self.buf[: i + len(sep)]
                return out
            start = max(0, len(self.buf) - len(sep) + 1)
            await self.fill()

    async def read_exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            await self.fill()
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def cancel(self) -> None:
        if self._read is not None and not self._read.done():
            self._read.cancel()


class FakeUpstream:
    """Scripted OpenAI-compatible HTTP/1.1 server for tests (async context manager).

    ``base_url`` is ``"http://127.0.0.1:PORT/v1"``. See the module docstring for routing,
    framing, timing and what is recorded.
    """

    def __init__(self, *, models: Sequence[str] = ("m",), host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self.port: int = port  # 0: an ephemeral port; a given one (e.g. of a stopped fake) to come back on
        self.models = list(models)
        self.requests: list[FakeRequest] = []
        self.connections_opened = 0
        self.connections_closed = 0
        self.disconnects = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self._queues: dict[str | None, deque[ReplySource]] = {}
        self._rules: list[Callable[[FakeRequest], Reply | None]] = []
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Event()
        self._gate: asyncio.Event | None = None

    # ------------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> FakeUpstream:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Listen on ``port`` (an ephemeral loopback port when 0)."""
        self._server = await asyncio.start_server(self._handle, self.host, self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening and close every open connection."""
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1`` (what an OpenAI client takes as ``base_url``)."""
        return f"http://{self.host}:{self.port}/v1"

    @property
    def origin(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://{self.host}:{self.port}"

    # ------------------------------------------------------------------ scripting
    def script(self, path: str | None, replies: Sequence[ReplySource]) -> None:
        """Queue replies for ``path`` (exact request path, e.g. ``"/v1/chat/completions"``), or
        for any POST when ``path`` is None. Served in order; appended to earlier queued ones."""
        self._queues.setdefault(path, deque()).extend(replies)

    def add_rule(self, rule: Callable[[FakeRequest], Reply | None]) -> None:
        """Answer every request for which ``rule(request)`` returns a Reply (when nothing is
        queued for it); checked in the order added."""
        self._rules.append(rule)

    def hold(self) -> asyncio.Event:
        """From now on every request waits (after it was read and recorded in ``requests``)
        until the returned event is set, then gets its reply as usual; ``release()`` sets it."""
        self._gate = asyncio.Event()
        return self._gate

    def release(self) -> None:
        """Let the requests held by :meth:`hold` go on, and stop holding new ones."""
        if self._gate is not None:
            self._gate.set()
            self._gate = None

    def pending(self, path: str | None = None) -> int:
        """Number of queued replies not yet served for ``path``."""
        return len(self._queues.get(path, ()))

    # ------------------------------------------------------------------ observation
    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _wait(self, pred: Callable[[], bool], timeout: float) -> None:
        async with asyncio.timeout(timeout):
            while not pred():
                await self._changed.wait()

    async def wait_for_disconnect(self, n: int = 1, timeout: float = 5.0) -> None:
        """Wait until clients closed ``n`` connections in the middle of a reply (TimeoutError)."""
        await self._wait(lambda: self.disconnects >= n, timeout)

    async def wait_for_connections_closed(self, n: int = 1, timeout: float = 5.0) -> None:
        """Wait until ``n`` connections have ended for any reason (TimeoutError)."""
        await self._wait(lambda: self.connections_closed >= n, timeout)

    async def wait_for_requests(self, n: int = 1, timeout: float = 5.0) -> None:
        """Wait until ``n`` requests have been received (TimeoutError)."""
        await self._wait(lambda: len(self.requests) >= n, timeout)

    # ------------------------------------------------------------------ serving
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)  # type: ignore[arg-type]
        self.connections_opened += 1
        self._notify()
        conn = _Conn(reader)
        try:
            while True:
                try:
                    req, keep_alive = await self._read_request(conn, writer)
                except _ClientGone:
                    break
                self.requests.append(req)
                finished = self._count_in_flight()
                self._notify()
                try:
                    reply = await self._pick(req)
                except BaseException:
                    finished()
                    raise
                served = asyncio.ensure_future(self._write_counted(req, reply, writer, finished))
                served.add_done_callback(lambda _f, done=finished: done())
                if not await self._serve_watching(conn, served):
                    req.disconnected = True
                    self.disconnects += 1
                    break
                if not served.result() or not keep_alive:
                    break
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("fake upstream: connection handler failed")
        finally:
            conn.cancel()
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            self.connections_closed += 1
            self._tasks.discard(task)  # type: ignore[arg-type]
            self._notify()

    def _count_in_flight(self) -> Callable[[], None]:
        """Count one more request in flight; returns the (idempotent) callable that ends it."""
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        ended = False

        def finished() -> None:
            nonlocal ended
            if not ended:
                ended = True
                self.in_flight -= 1

        return finished

    async def _write_counted(
        self, req: FakeRequest, reply: Reply, writer: asyncio.StreamWriter, finished: Callable[[], None]
    ) -> bool:
        """``_write_reply`` that stops counting the request the moment its last byte is written."""
        try:
            return await self._write_reply(req, reply, writer)
        finally:
            finished()

    async def _serve_watching(self, conn: _Conn, served: asyncio.Future[bool]) -> bool:
        """Run the reply while watching the socket; False when the client closed it first."""
        try:
            while not served.done():
                if conn.eof:
                    served.cancel()
                    return False
                read = conn.read_task()
                waiters: set[asyncio.Future[Any]] = {served, read}
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                if read.done():
                    conn.consume_read()
            exc = served.exception()
            if isinstance(exc, ConnectionError | OSError):
                return False
            if exc is not None:
                raise exc
            return True
        finally:
            if not served.done():
                served.cancel()
                with contextlib.suppress(BaseException):
                    await served

    async def _read_request(self, conn: _Conn, writer: asyncio.StreamWriter) -> tuple[FakeRequest, bool]:
        head = await conn.read_until(b"\r\n\r\n")
        lines = head[:-4].decode("latin-1").split("\r\n")
        while lines and not lines[0]:  # tolerate stray CRLF between requests
            lines.pop(0)
        method, target, version = lines[0].split(" ", 2)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            key = name.strip().lower()
            value = value.strip()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        if headers.get("expect", "").lower() == "100-continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await writer.drain()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            parts = []
            while True:
                size_line = await conn.read_until(b"\r\n")
                size = int(size_line.split(b";")[0].strip(), 16)
                if size == 0:
                    while (await conn.read_until(b"\r\n")) != b"\r\n":  # trailers
                        pass
                    break
                parts.append(await conn.read_exactly(size))
                await conn.read_exactly(2)
            body = b"".join(parts)
        else:
            body = await conn.read_exactly(int(headers.get("content-length", "0") or 0))
        path, _, query = target.partition("?")
        parsed: Any = None
        if body:
            try:
                parsed = json.loads(body)
            except ValueError:
                parsed = None
        conn_hdr = headers.get("connection", "").lower()
        keep_alive = "close" not in conn_hdr and (version.upper() != "HTTP/1.0" or "keep-alive" in conn_hdr)
        return FakeRequest(method.upper(), path, query, headers, body, parsed), keep_alive

    async def _pick(self, req: FakeRequest) -> Reply:
        if self._gate is not None:
            await self._gate.wait()
        source: ReplySource | None = None
        queue = self._queues.get(req.path)
        if queue:
            source = queue.popleft()
        elif req.method == "POST" and self._queues.get(None):
            source = self._queues[None].popleft()
        if source is None:
            for rule in self._rules:
                reply = rule(req)
                if reply is not None:
                    return reply
            return self.default_reply(req)
        if isinstance(source, Reply):
            return source
        result = source(req)
        if inspect.isawaitable(result):
            result = await result
        return result

    def default_reply(self, req: FakeRequest) -> Reply:
        """The reply used when nothing is queued (see the module docstring)."""
        if req.method == "GET" and req.path.endswith("/models"):
            data = [{"id": m, "object": "model", "created": 0, "owned_by": "fake"} for m in self.models]
            return Reply.json({"object": "list", "data": data})
        if req.method == "POST" and req.path.endswith("/chat/completions"):
            body = req.json if isinstance(req.json, dict) else {}
            requested = body.get("model")
            model = requested if isinstance(requested, str) else "m"
            if not body.get("stream"):
                return Reply.json(chat_completion(DEFAULT_TEXT, model=model))
            opts = body.get("stream_options")
            with_usage = isinstance(opts, dict) and bool(opts.get("include_usage"))
            u: dict[str, Any] = {"usage": None} if with_usage else {}
            chunks = [
                sse_data(_chunk_obj(model, {"role": "assistant", "content": _DEFAULT_PIECES[0]}, None, u))
            ]
            chunks += [sse_data(_chunk_obj(model, {"content": p}, None, u)) for p in _DEFAULT_PIECES[1:]]
            chunks.append(sse_data(_chunk_obj(model, {}, "stop", u)))
            if with_usage:
                chunks.append(usage_chunk(dict(DEFAULT_USAGE), model=model))
            chunks.append(DONE)
            return Reply.sse(chunks)
        if req.method == "POST" and req.path.endswith(("/responses", "/v1/messages")):
            body = req.json if isinstance(req.json, dict) else {}
            requested = body.get("model")
            model = requested if isinstance(requested, str) else "m"
            responses = req.path.endswith("/responses")
            if body.get("stream"):
                return Reply.sse(
                    default_responses_stream(model) if responses else default_messages_stream(model)
                )
            return Reply.json(response_object(model=model) if responses else anthropic_message(model=model))
        err = {
            "error": {
                "message": f"no route for {req.method} {req.path}",
                "type": "not_found_error",
                "param": None,
                "code": 404,
            }
        }
        return Reply.json(err, status=404)

    async def _write_reply(self, req: FakeRequest, reply: Reply, writer: asyncio.StreamWriter) -> bool:
        """Write ``reply``; True when the connection can be reused afterwards."""
        if reply.never_respond:
            await asyncio.Event().wait()  # until cancelled (client gone or server stopping)
        if reply.delay_headers_s:
            await asyncio.sleep(reply.delay_headers_s)
        chunks = [bytes(c) for c in reply.chunks]
        total = sum(len(c) for c in chunks)
        headers = {k.lower(): v for k, v in (reply.headers or {}).items()}
        headers.setdefault(
            "content-type", "text/event-stream" if reply.framing == "chunked" else "application/json"
        )
        if reply.framing == "chunked":
            headers.setdefault("transfer-encoding", "chunked")
        elif reply.framing == "length":
            headers.setdefault("content-length", str(total + (1 if reply.close_abruptly else 0)))
        reusable = reply.framing != "close" and not reply.close_abruptly
        headers.setdefault("connection", "keep-alive" if reusable else "close")
        try:
            phrase = HTTPStatus(reply.status).phrase
        except ValueError:
            phrase = "Status"
        head = f"HTTP/1.1 {reply.status} {phrase}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        writer.write(head.encode("latin-1") + b"\r\n")
        await writer.drain()
        delays = reply.delay_s
        for i, chunk in enumerate(chunks):
            delay = delays[i] if isinstance(delays, Sequence) else delays
            if delay:
                await asyncio.sleep(delay)
            if reply.framing == "chunked":
                if not chunk:
                    continue
                writer.write(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
            else:
                writer.write(chunk)
            await writer.drain()
        if reply.framing == "chunked" and not reply.close_abruptly:
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        return reusable


def _chunk_obj(
    model: str, delta: dict[str, Any], finish: str | None, extra: dict[str, Any]
) -> dict[str, Any]:
    return {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        **extra,
    }


# ---------------------------------------------------------------------- vLLM/SGLang-style token answers
# A chat upstream that returns token ids and logprobs when asked, as vLLM (``return_token_ids``,
# ``logprobs``, ``prompt_logprobs``) and SGLang (``return_token_ids``, ``return_prompt_token_ids``)
# do, over a fake byte-level tokenizer: every UTF-8 byte is one token, plus two special tokens.
# Enable it with ``up.add_rule(token_rule())`` (``token_rule("sglang")`` for SGLang's shape).

IM_START = 1001
IM_END = 1000
"""Special token ids of the fake tokenizer (``<|im_start|>``, ``<|im_end|>``, also the EOS)."""


def fake_encode(text: str) -> list[int]:
    """The fake tokenizer: one token per UTF-8 byte."""
    return list(text.encode("utf-8"))


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def fake_prompt_ids(messages: Sequence[Any]) -> list[int]:
    """The prompt token ids of a chat (a ChatML-like template over :func:`fake_encode`): per
    message ``<|im_start|>role\\ncontent<|im_end|>\\n`` (an assistant message's tool calls
    appended to its content as JSON), then ``<|im_start|>assistant\\n``."""
    ids: list[int] = []
    for m in messages:
        if not isinstance(m, dict):
            continue
        text = _content_text(m.get("content"))
        if m.get("tool_calls"):
            text += _dumps(m["tool_calls"])
        ids += [IM_START, *fake_encode(f"{m.get('role')}\n"), *fake_encode(text), IM_END, *fake_encode("\n")]
    return [*ids, IM_START, *fake_encode("assistant\n")]


def fake_completion_ids(text: str) -> list[int]:
    """The completion token ids of an answer ``text``: its bytes, then ``<|im_end|>``."""
    return [*fake_encode(text), IM_END]


def fake_logprob(token_id: int) -> float:
    """The logprob the fake gives token ``token_id`` (exact in binary: -1/8 ... -7/8)."""
    return -((token_id % 7) + 1) / 8


def _token_text(token_id: int) -> str:
    if token_id == IM_END:
        return "<|im_end|>"
    if token_id == IM_START:
        return "<|im_start|>"
    return bytes([token_id]).decode("latin-1")


def _logprobs_content(ids: Sequence[int]) -> dict[str, Any]:
    return {
        "content": [
            {
                "token": _token_text(t),
                "logprob": fake_logprob(t),
                "bytes": [t] if t < 256 else list(_token_text(t).encode("utf-8")),
                "top_logprobs": [],
            }
            for t in ids
        ]
    }


def token_rule(
    server: Literal["vllm", "sglang"] = "vllm",
    *,
    text: str = DEFAULT_TEXT,
    pieces: Sequence[str] = _DEFAULT_PIECES,
) -> Callable[[FakeRequest], Reply | None]:
    """A rule (``up.add_rule``) answering every chat completion with ``text`` (streamed as
    ``pieces``, which must join to ``text``) the way ``server`` answers: token ids and logprobs
    only when the request asks for them, ``"logprobs": null`` in each choice otherwise, usage
    counted in fake tokens. vLLM: top-level ``prompt_token_ids`` (first chunk of a stream) and
    per-choice ``token_ids`` (per chunk), ``prompt_logprobs`` (non-streamed) as
    ``[null, {"<id>": {"logprob", "rank", "decoded_token"}}, ...]``. SGLang: per-choice
    ``prompt_token_ids`` (with ``return_prompt_token_ids``) and ``token_ids``, non-streamed only
    (SGLang's stream chunks carry no token ids)."""
    assert "".join(pieces) == text

    def rule(req: FakeRequest) -> Reply | None:
        if (
            req.method != "POST"
            or not req.path.endswith("/chat/completions")
            or not isinstance(req.json, dict)
        ):
            return None
        body = req.json
        model = body.get("model") if isinstance(body.get("model"), str) else "m"
        prompt = fake_prompt_ids(body.get("messages") or [])
        completion = fake_completion_ids(text)
        want_ids = bool(body.get("return_token_ids"))
        want_prompt_ids = want_ids if server == "vllm" else bool(body.get("return_prompt_token_ids"))
        want_lp = bool(body.get("logprobs"))
        usage = {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(completion),
            "total_tokens": len(prompt) + len(completion),
        }
        if not body.get("stream"):
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": _logprobs_content(completion) if want_lp else None,
                "finish_reason": "stop",
            }
            if server == "sglang" and want_prompt_ids:
                choice["prompt_token_ids"] = prompt
            if want_ids:
                choice["token_ids"] = completion
            answer: dict[str, Any] = {
                "id": "c1",
                "object": "chat.completion",
                "created": 0,
                "model": model,
                "choices": [choice],
                "usage": usage,
            }
            if server == "vllm" and want_prompt_ids:
                answer["prompt_token_ids"] = prompt
            if server == "vllm" and body.get("prompt_logprobs") is not None:
                answer["prompt_logprobs"] = [None] + [
                    {str(t): {"logprob": fake_logprob(t), "rank": 1, "decoded_token": _token_text(t)}}
                    for t in prompt[1:]
                ]
            return Reply.json(answer)
        chunks: list[bytes] = []
        parts: list[tuple[dict[str, Any], list[int], str | None]] = [
            ({"role": "assistant", "content": p} if i == 0 else {"content": p}, fake_encode(p), None)
            for i, p in enumerate(pieces)
        ]
        parts.append(({}, [IM_END], "stop"))
        for i, (delta, ids, finish) in enumerate(parts):
            ch: dict[str, Any] = {
                "index": 0,
                "delta": delta,
                "logprobs": _logprobs_content(ids) if want_lp else None,
                "finish_reason": finish,
            }
            if server == "vllm" and want_ids:
                ch["token_ids"] = ids
            obj: dict[str, Any] = {
                "id": "c1",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": model,
                "choices": [ch],
            }
            if i == 0 and server == "vllm" and want_prompt_ids:
                obj["prompt_token_ids"] = prompt
            chunks.append(sse_data(obj))
        opts = body.get("stream_options")
        if isinstance(opts, dict) and opts.get("include_usage"):
            chunks.append(usage_chunk(usage, model=model))
        chunks.append(DONE)
        return Reply.sse(chunks)

    return rule


# ====================================================================== the scripted policy
# A fixed plan played against a real agent client (Claude Code, Codex, mini-swe-agent, ...):
# docs/testing.md "The scripted policy".

ANSWER_FILE = "outputs/answer.json"
SUBMIT_COMMAND = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
_SHELL_NAME_HINTS = ("bash", "shell", "exec", "command", "terminal", "run")
_COMMAND_KEYS = ("command", "cmd")
PolicyProtocol = Literal["chat_completions", "responses", "anthropic_messages"]


@dataclass(frozen=True)
class Plan:
    """What the scripted policy does in a session: one shell command per model turn (in order),
    then the ``final`` text answer with no tool call. In the text protocol (no tools offered)
    each command goes out as one fenced block and there is no final text: the last command
    should end the client's loop (e.g. :data:`SUBMIT_COMMAND`)."""

    commands: tuple[str, ...]
    final: str = "Done: the answer is in outputs/answer.json."

    @classmethod
    def write_answer(
        cls, answer: Any, *, path: str = ANSWER_FILE, submit: bool = False, final: str | None = None
    ) -> Plan:
        """The plan that writes ``answer`` as JSON to ``path`` (relative to the client's cwd) and
        prints it back, then finishes; ``submit`` adds :data:`SUBMIT_COMMAND` as the last command
        (mini-swe-agent's way to finish). A wrong ``answer`` makes a plan that must score 0."""
        folder = path.rpartition("/")[0]
        text = json.dumps(answer, sort_keys=True)
        write = (
            f"mkdir -p {shlex.quote(folder)} && " if folder else ""
        ) + f"printf '%s\\n' {shlex.quote(text)} > {shlex.quote(path)} && cat {shlex.quote(path)}"
        commands = (write, SUBMIT_COMMAND) if submit else (write,)
        return cls(commands=commands, final=final or cls.final)


@dataclass(frozen=True)
class ShellTool:
    """The client's shell tool as the policy found it among the offered tools: its ``name``,
    the argument key holding the command (``command`` | ``cmd``), whether that argument is an
    argv list (then the policy sends ``["bash", "-lc", script]``), and the tool's kind in the
    request (``function`` for chat/Responses function tools, ``anthropic`` for Messages tools)."""

    name: str
    key: str
    argv: bool = False
    kind: str = "function"

    def arguments(self, script: str) -> dict[str, Any]:
        return {self.key: ["bash", "-lc", script] if self.argv else script}


@dataclass
class PolicyTurn:
    """One request the policy answered: its ``protocol``, ``stream``, ``kind`` (``command`` |
    ``final`` | ``side``: a call without the shell tool, answered with plain text), the plan
    ``index`` it played, the ``tool`` used, the latest tool result (or text-protocol
    observation) the request carried (``observation``), the ``reply`` object as a non-streaming
    answer of that protocol (a stream carries exactly this, see docs/testing.md), and the
    request's ``path``, ``tools`` names and ``session_id`` (the gateway's ``X-Session-Id``)."""

    protocol: PolicyProtocol
    stream: bool
    kind: Literal["command", "final", "side"]
    index: int
    path: str
    tools: list[str]
    tool: str | None
    observation: str | None
    reply: dict[str, Any]
    session_id: str | None = None


class PolicyError(Exception):
    """The request cannot be played (e.g. tools offered but none is a shell tool)."""


def _tool_names(protocol: PolicyProtocol, tools: Any) -> list[str]:
    names = []
    for t in tools if isinstance(tools, list) else []:
        if not isinstance(t, dict):
            continue
        fn = t.get("function") if protocol == "chat_completions" else None
        name = (fn or t).get("name") if isinstance(fn or t, dict) else None
        names.append(str(name if name is not None else t.get("type")))
    return names


def _schema_command_key(schema: Any) -> tuple[str, bool] | None:
    """(key, is_argv) of the command argument of a JSON schema, or None."""
    if not isinstance(schema, dict) or not isinstance(schema.get("properties"), dict):
        return None
    props = schema["properties"]
    for key in _COMMAND_KEYS:
        spec = props.get(key)
        if isinstance(spec, dict):
            kind = spec.get("type")
            if kind == "string":
                return key, False
            if kind == "array":
                return key, True
    return None


def find_shell_tool(protocol: PolicyProtocol, tools: Any) -> ShellTool | None:
    """The shell tool among a request's ``tools``, found by its schema whatever its name: a
    function (chat: ``function.parameters``, Responses: ``parameters``, Messages:
    ``input_schema``) with a string (or argv list) ``command``/``cmd`` argument; when several
    match, the one whose name looks like a shell (bash, shell, exec...) wins."""
    found: list[tuple[int, ShellTool]] = []
    for t in tools if isinstance(tools, list) else []:
        if not isinstance(t, dict):
            continue
        if protocol == "chat_completions":
            fn = t.get("function")
            name, schema = (fn.get("name"), fn.get("parameters")) if isinstance(fn, dict) else (None, None)
        elif protocol == "responses":
            name, schema = (
                (t.get("name"), t.get("parameters")) if t.get("type") == "function" else (None, None)
            )
        else:
            name, schema = t.get("name"), t.get("input_schema")
        keyed = _schema_command_key(schema)
        if not isinstance(name, str) or keyed is None:
            continue
        hint = sum(h in name.lower() for h in _SHELL_NAME_HINTS)
        kind = "anthropic" if protocol == "anthropic_messages" else "function"
        found.append((hint, ShellTool(name=name, key=keyed[0], argv=keyed[1], kind=kind)))
    if not found:
        return None
    return max(found, key=lambda f: f[0])[1]


def _text_of(content: Any) -> str:
    """Text of a message content: a string, or the texts of a list of parts/blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if isinstance(p, str):
                parts.append(p)
            elif isinstance(p, dict):
                inner = p.get("text", p.get("content", p.get("output")))
                parts.append(_text_of(inner) if inner is not None else "")
        return "".join(parts)
    return "" if content is None else str(content)


def _conversation(protocol: PolicyProtocol, body: dict[str, Any]) -> tuple[list[str], int, str | None]:
    """(tool results in order, assistant turns, text of the last user turn) of a request."""
    results: list[str] = []
    assistant = 0
    last_user: str | None = None
    if protocol == "responses":
        items = body.get("input")
        items = [{"type": "message", "role": "user", "content": items}] if isinstance(items, str) else items
        for it in items if isinstance(items, list) else []:
            if not isinstance(it, dict):
                continue
            kind = it.get("type", "message")
            if kind.endswith("_call_output"):
                results.append(_text_of(it.get("output")))
            elif kind == "message" and it.get("role") == "assistant":
                assistant += 1
            elif kind == "message" and it.get("role") == "user":
                last_user = _text_of(it.get("content"))
        return results, assistant, last_user
    for m in body.get("messages") or []:
        if not isinstance(m, dict):
            continue
        role, content = m.get("role"), m.get("content")
        if role == "tool":
            results.append(_text_of(content))
        elif role == "assistant":
            assistant += 1
        elif role == "user":
            blocks = content if isinstance(content, list) else []
            tool_results = [b for b in blocks if isinstance(b, dict) and b.get("type") == "tool_result"]
            results += [_text_of(b.get("content")) for b in tool_results]
            if not tool_results:
                last_user = _text_of(content)
    return results, assistant, last_user


def _fence_of(body: dict[str, Any]) -> str:
    """The fence language the client's prompt asks for (mini-swe-agent's text protocol uses
    ``mswea_bash_command``), else ``bash``."""
    return "mswea_bash_command" if "```mswea_bash_command" in json.dumps(body) else "bash"


class ScriptedPolicy:
    """A rule for :meth:`FakeUpstream.add_rule` that plays a :class:`Plan` over chat
    completions, Responses and Anthropic Messages (streamed and not), statelessly: the plan index
    is the number of tool results in the request's conversation (text protocol: the number of
    assistant turns), so a retried call gets the same answer. Several plans: each new session
    (the gateway's ``X-Session-Id`` header) gets the next one, in order of its first request
    (``session_plans``), the last one repeating. ``turns`` records each request it answered
    (:class:`PolicyTurn`). Usage is ``input_tokens = 100 + 10 * index``, 20 output tokens.
    ``text_protocol``: True = always answer with fenced blocks, False = always use the shell tool
    (a call offering none is a ``side`` call answered with plain text), None = fenced blocks
    exactly when the request offers no tools at all."""

    def __init__(self, plan: Plan | Sequence[Plan], *, text_protocol: bool | None = None) -> None:
        self.plans = [plan] if isinstance(plan, Plan) else list(plan)
        if not self.plans:
            raise ValueError("ScriptedPolicy needs at least one plan")
        self.text_protocol = text_protocol
        self.turns: list[PolicyTurn] = []
        self.errors: list[str] = []
        self.session_plans: dict[str | None, Plan] = {}

    def plan_of(self, session_id: str | None) -> Plan:
        """The plan of a session (assigned at its first request)."""
        if session_id not in self.session_plans:
            self.session_plans[session_id] = self.plans[min(len(self.session_plans), len(self.plans) - 1)]
        return self.session_plans[session_id]

    def __call__(self, req: FakeRequest) -> Reply | None:
        protocol = _protocol_of(req)
        if protocol is None:
            if req.method == "POST" and req.path.endswith("/count_tokens"):
                return Reply.json({"input_tokens": max(1, len(req.body) // 4)})
            return None
        body = req.json if isinstance(req.json, dict) else {}
        try:
            turn = self._play(protocol, req.path, body, req.headers.get("x-session-id"))
        except PolicyError as exc:
            self.errors.append(str(exc))
            err = {"type": "error", "error": {"type": "invalid_request_error", "message": str(exc)}}
            return Reply.json(err, status=400)
        self.turns.append(turn)
        stream = turn.stream
        if not stream:
            return Reply.json(turn.reply)
        if protocol == "chat_completions":
            opts = body.get("stream_options")
            return Reply.sse(
                chat_stream(
                    turn.reply, include_usage=isinstance(opts, dict) and bool(opts.get("include_usage"))
                )
            )
        return Reply.sse(
            responses_stream(turn.reply) if protocol == "responses" else messages_stream(turn.reply)
        )

    def _play(self, protocol: PolicyProtocol, path: str, body: dict[str, Any], sid: str | None) -> PolicyTurn:
        plan = self.plan_of(sid)
        tools = body.get("tools")
        names = _tool_names(protocol, tools)
        results, assistant, last_user = _conversation(protocol, body)
        text = self.text_protocol if self.text_protocol is not None else not names
        model = body.get("model") if isinstance(body.get("model"), str) else "m"
        stream = bool(body.get("stream"))
        commands = plan.commands
        if text:
            index = assistant
            observation = last_user if assistant else None
            script = commands[min(index, len(commands) - 1)]
            content = f"THOUGHT: step {index + 1} of the plan.\n\n```{_fence_of(body)}\n{script}\n```"
            reply = _policy_reply(protocol, model, index, content, None, None)
            return PolicyTurn(protocol, stream, "command", index, path, names, None, observation, reply, sid)
        shell = find_shell_tool(protocol, tools)
        if shell is None:
            if names:
                raise PolicyError(f"scripted policy: no shell tool among the offered tools {names}")
            reply = _policy_reply(protocol, model, 0, "OK", None, None)
            return PolicyTurn(protocol, stream, "side", 0, path, names, None, None, reply, sid)
        index = len(results)
        observation = results[-1] if results else None
        if index >= len(commands):
            reply = _policy_reply(protocol, model, index, plan.final, None, None)
            return PolicyTurn(
                protocol, stream, "final", index, path, names, shell.name, observation, reply, sid
            )
        reply = _policy_reply(
            protocol, model, index, f"Running step {index + 1} of the plan.", shell, commands[index]
        )
        return PolicyTurn(
            protocol, stream, "command", index, path, names, shell.name, observation, reply, sid
        )


def _protocol_of(req: FakeRequest) -> PolicyProtocol | None:
    if req.method != "POST":
        return None
    if req.path.endswith("/chat/completions"):
        return "chat_completions"
    if req.path.endswith("/responses"):
        return "responses"
    if req.path.endswith("/v1/messages"):
        return "anthropic_messages"
    return None


def _policy_reply(
    protocol: PolicyProtocol, model: str, index: int, text: str, shell: ShellTool | None, script: str | None
) -> dict[str, Any]:
    """The non-streaming answer of ``protocol``: ``text``, plus one shell call when given."""
    n = index + 1
    tokens_in, tokens_out = 100 + 10 * index, 20
    args = None if shell is None or script is None else _dumps(shell.arguments(script))
    if protocol == "chat_completions":
        calls = (
            None
            if args is None or shell is None
            else [
                {"id": f"call_{n}", "type": "function", "function": {"name": shell.name, "arguments": args}}
            ]
        )
        usage = {
            "prompt_tokens": tokens_in,
            "completion_tokens": tokens_out,
            "total_tokens": tokens_in + tokens_out,
        }
        return chat_completion(
            text,
            tool_calls=calls,
            finish_reason="tool_calls" if calls else "stop",
            usage=usage,
            id=f"chatcmpl-{n}",
            model=model,
        )
    if protocol == "responses":
        output: list[dict[str, Any]] = [
            {
                "type": "message",
                "id": f"msg_{n}",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ]
        if args is not None and shell is not None:
            output.append(
                {
                    "type": "function_call",
                    "id": f"fc_{n}",
                    "call_id": f"call_{n}",
                    "name": shell.name,
                    "arguments": args,
                    "status": "completed",
                }
            )
        usage = {
            "input_tokens": tokens_in,
            "output_tokens": tokens_out,
            "total_tokens": tokens_in + tokens_out,
        }
        return response_object(output=output, usage=usage, id=f"resp_{n}", model=model)
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}]
    if args is not None and shell is not None:
        blocks.append({"type": "tool_use", "id": f"toolu_{n}", "name": shell.name, "input": json.loads(args)})
    return anthropic_message(
        blocks=blocks,
        usage={"input_tokens": tokens_in, "output_tokens": tokens_out},
        stop_reason="tool_use" if len(blocks) > 1 else "end_turn",
        id=f"msg_{n}",
        model=model,
    )


def _halves(s: str) -> list[str]:
    """``s`` in two pieces (one when shorter than 2), so clients assemble deltas."""
    mid = len(s) // 2
    return [s[:mid], s[mid:]] if mid else [s]


def chat_stream(completion: dict[str, Any], *, include_usage: bool) -> list[bytes]:
    """The chat stream of a non-streaming ``completion`` (one choice): the role and the text in
    two content deltas, each tool call as a head delta (id, name, empty arguments) plus its
    arguments in two pieces, the finish chunk, the usage-only chunk when ``include_usage``, then
    ``[DONE]``."""
    cid, model, created = completion["id"], completion["model"], completion["created"]
    choice = completion["choices"][0]
    message = choice["message"]
    extra: dict[str, Any] = {"usage": None} if include_usage else {}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return sse_data(
            {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                **extra,
            }
        )

    out = [chunk({"role": "assistant", "content": ""})]
    out += [chunk({"content": p}) for p in _halves(message.get("content") or "")]
    for i, call in enumerate(message.get("tool_calls") or []):
        fn = call["function"]
        out.append(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": i,
                            "id": call["id"],
                            "type": "function",
                            "function": {"name": fn["name"], "arguments": ""},
                        }
                    ]
                }
            )
        )
        out += [
            chunk({"tool_calls": [{"index": i, "function": {"arguments": p}}]})
            for p in _halves(fn["arguments"])
        ]
    out.append(chunk({}, choice["finish_reason"]))
    if include_usage:
        out.append(usage_chunk(completion["usage"], id=cid, model=model, created=created))
    out.append(DONE)
    return out


def responses_stream(response: dict[str, Any]) -> list[bytes]:
    """The Responses stream of a ``response`` object whose output holds ``message`` (one
    ``output_text`` part) and ``function_call`` items: ``response.created``,
    ``response.in_progress``, per item its added / delta (two pieces) / done events, then
    ``response.completed`` with the object itself (``sequence_number`` on each event)."""
    pending = {**response, "status": "in_progress", "output": [], "usage": None}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": pending},
        {"type": "response.in_progress", "response": pending},
    ]
    for i, item in enumerate(response["output"]):
        ids = {"item_id": item["id"], "output_index": i}
        if item["type"] == "message":
            text = item["content"][0]["text"]
            part = {"type": "output_text", "text": "", "annotations": []}
            events += [
                {
                    "type": "response.output_item.added",
                    "output_index": i,
                    "item": {**item, "status": "in_progress", "content": []},
                },
                {"type": "response.content_part.added", **ids, "content_index": 0, "part": part},
            ]
            events += [
                {"type": "response.output_text.delta", **ids, "content_index": 0, "delta": p}
                for p in _halves(text)
            ]
            events += [
                {"type": "response.output_text.done", **ids, "content_index": 0, "text": text},
                {
                    "type": "response.content_part.done",
                    **ids,
                    "content_index": 0,
                    "part": {**part, "text": text},
                },
            ]
        elif item["type"] == "function_call":
            events.append(
                {
                    "type": "response.output_item.added",
                    "output_index": i,
                    "item": {**item, "status": "in_progress", "arguments": ""},
                }
            )
            events += [
                {"type": "response.function_call_arguments.delta", **ids, "delta": p}
                for p in _halves(item["arguments"])
            ]
            events.append(
                {"type": "response.function_call_arguments.done", **ids, "arguments": item["arguments"]}
            )
        else:
            raise ValueError(f"responses_stream: unsupported output item type {item['type']!r}")
        events.append({"type": "response.output_item.done", "output_index": i, "item": item})
    events.append({"type": "response.completed", "response": response})
    return [sse_event({**ev, "sequence_number": n}) for n, ev in enumerate(events)]


def messages_stream(message: dict[str, Any]) -> list[bytes]:
    """The Anthropic stream of a ``message`` with ``text`` and ``tool_use`` blocks:
    ``message_start`` (no content, ``output_tokens: 1``), per block its start / deltas (two
    pieces: ``text_delta`` or ``input_json_delta``) / stop, ``message_delta`` (stop reason and
    the final ``output_tokens``), ``message_stop``."""
    usage = message["usage"]
    start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
    events: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
    for i, block in enumerate(message["content"]):
        if block["type"] == "text":
            events.append(
                {"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}}
            )
            events += [
                {"type": "content_block_delta", "index": i, "delta": {"type": "text_delta", "text": p}}
                for p in _halves(block["text"])
            ]
        elif block["type"] == "tool_use":
            events.append(
                {"type": "content_block_start", "index": i, "content_block": {**block, "input": {}}}
            )
            events += [
                {
                    "type": "content_block_delta",
                    "index": i,
                    "delta": {"type": "input_json_delta", "partial_json": p},
                }
                for p in _halves(_dumps(block["input"]))
            ]
        else:
            raise ValueError(f"messages_stream: unsupported block type {block['type']!r}")
        events.append({"type": "content_block_stop", "index": i})
    events += [
        {
            "type": "message_delta",
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
            "usage": {"output_tokens": usage["output_tokens"]},
        },
        {"type": "message_stop"},
    ]
    return [sse_event(ev) for ev in events]
