"""The gateway's own SSE keep-alives toward streaming clients : when the
upstream stays silent for ``keepalive_interval_s`` while a stream is relayed, the client gets the
comment line ``: keep-alive\\n`` (no blank line after it), only between whole events, never in
the recorded step. Consumed with the real openai and anthropic SDKs (whose SSE decoders
dispatch an empty event on a lone blank line once an ``id:`` was seen), with the exact bytes
they received captured by a tee transport under the SDK."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest
from openai._streaming import SSEDecoder

from gateway.relay import KEEPALIVE
from gateway.settings import GatewaySettings
from tests.fake_upstream import FakeUpstream, Reply, default_messages_stream
from tests.faults import COMMENTS_AND_KEEPALIVES
from tests.gateway.conftest import MESSAGES, StartGateway

UP_PATH = "/v1/chat/completions"
INTERVAL = 0.2  # seconds: the keep-alive interval of these tests
STALL = 1.0  # seconds of upstream silence: several keep-alive intervals
# what the gateway relays of COMMENTS_AND_KEEPALIVES (comment and data-less blocks are dropped): the two data events and [DONE]
RELAYED_OF_COMMENTS = COMMENTS_AND_KEEPALIVES[1] + COMMENTS_AND_KEEPALIVES[5] + COMMENTS_AND_KEEPALIVES[6]


class _TeeStream(httpx2.AsyncByteStream):
    """A response body stream that appends every chunk it yields to ``sink``."""

    def __init__(self, inner: Any, sink: bytearray) -> None:
        self._inner = inner
        self._sink = sink

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            self._sink += chunk
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class Tee(httpx2.AsyncBaseTransport):
    """An httpx2 transport (the one the openai/anthropic SDKs use) that keeps the exact body
    bytes of every response in ``raw``, as the SDK's SSE decoder receives them."""

    def __init__(self) -> None:
        self._inner = httpx2.AsyncHTTPTransport()
        self.raw = bytearray()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        resp = await self._inner.handle_async_request(request)
        return httpx2.Response(
            resp.status_code,
            headers=resp.headers,
            stream=_TeeStream(resp.stream, self.raw),
            extensions=resp.extensions,
            request=request,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


def assert_only_between_events(raw: bytes) -> None:
    """Every keep-alive in ``raw`` starts the body or follows the blank line that ends an event
    (or another keep-alive), and is not followed by a blank line."""
    at = raw.find(KEEPALIVE)
    assert at >= 0, "no keep-alive was sent"
    while at >= 0:
        before = raw[:at]
        assert before == b"" or before.endswith((b"\n\n", KEEPALIVE)), raw
        assert not raw[at + len(KEEPALIVE) :].startswith((b"\n", b"\r")), raw
        at = raw.find(KEEPALIVE, at + 1)


def test_keepalive_is_one_comment_line_that_openai_python_ignores_after_an_id() -> None:
    """Why the keep-alive has no blank line after it: openai-python's decoder (the SDK these
    clients use) dispatches an empty-data event on a lone blank line once an ``id:`` was seen
    (openai-python dispatches an empty event there), which its stream then fails to parse as JSON."""
    assert KEEPALIVE == b": keep-alive\n"
    lines = [b"id: 1", b'data: {"x":1}', b""]

    def events(extra: list[bytes]) -> list[str]:
        dec = SSEDecoder()
        out = [dec.decode(line.decode()) for line in lines + extra]
        return [e.data for e in out if e is not None]

    assert events(KEEPALIVE.splitlines()) == ['{"x":1}']
    assert events([b": keep-alive", b""]) == ['{"x":1}', ""]  # the ": ping\n\n" style would break it


async def test_stall_gets_keepalives_and_the_openai_sdk_reads_ab(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(keepalive_interval_s=INTERVAL)
    delays = [0, 0, 0, 0, 0, STALL, 0]  # the upstream stalls between the "A" and "B" events
    upstream.script(UP_PATH, [Reply.sse(COMMENTS_AND_KEEPALIVES, delay_s=delays)])
    tee = Tee()
    client = gw.client("s1", http_client=httpx2.AsyncClient(transport=tee))
    stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
    chunks = [c async for c in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "AB"
    assert [c.choices[0].finish_reason for c in chunks] == [None, "stop"]

    raw = bytes(tee.raw)
    n = raw.count(KEEPALIVE)
    assert n >= 2  # 1.0 s of silence at 0.2 s intervals
    assert raw.replace(KEEPALIVE, b"") == RELAYED_OF_COMMENTS  # nothing else added, the events byte for byte
    assert_only_between_events(raw)
    assert raw.index(KEEPALIVE) > raw.index(b'"content":"A"')  # sent during the stall, after "A"
    assert await gw.metric("gateway_stream_keepalives_total", route="m") == n

    [step] = await gw.steps("s1")
    assert (step.status, step.finish_reason) == ("ok", "stop")
    assert step.response["choices"][0]["message"] == {"role": "assistant", "content": "AB"}
    assert step.meta_json["chunks"] == 2
    assert "keep-alive" not in json.dumps(step.response)


async def test_a_stall_inside_an_event_never_splits_it(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    """The upstream stops in the middle of the "B" event: the keep-alives go out before the
    whole event, never inside it."""
    gw = await start_gateway(keepalive_interval_s=INTERVAL)
    b_event = COMMENTS_AND_KEEPALIVES[5]
    pieces = [*COMMENTS_AND_KEEPALIVES[:5], b_event[:25], b_event[25:], COMMENTS_AND_KEEPALIVES[6]]
    upstream.script(UP_PATH, [Reply.sse(pieces, delay_s=[0, 0, 0, 0, 0, 0, STALL, 0])])
    tee = Tee()
    client = gw.client("s1", http_client=httpx2.AsyncClient(transport=tee))
    stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
    assert "".join([c.choices[0].delta.content or "" async for c in stream]) == "AB"
    raw = bytes(tee.raw)
    assert raw.replace(KEEPALIVE, b"") == RELAYED_OF_COMMENTS
    assert_only_between_events(raw)
    assert raw.rindex(KEEPALIVE) < raw.index(b_event)  # all before the event, none inside
    [step] = await gw.steps("s1")
    assert step.response["choices"][0]["message"]["content"] == "AB"


async def test_keepalives_while_waiting_for_the_first_event(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    """Headers came at once, then a long prefill: keep-alives start the body; TTFT is still the
    time to the first upstream byte."""
    gw = await start_gateway(keepalive_interval_s=INTERVAL)
    upstream.script(UP_PATH, [Reply.sse(COMMENTS_AND_KEEPALIVES, delay_s=[STALL, 0, 0, 0, 0, 0, 0])])
    r = await gw.http().post(
        "/v1/sessions/s1/chat/completions", json={"model": "m", "messages": MESSAGES, "stream": True}
    )
    assert r.status_code == 200
    assert r.content.startswith(KEEPALIVE)
    assert r.content.replace(KEEPALIVE, b"") == RELAYED_OF_COMMENTS
    assert_only_between_events(r.content)
    [step] = await gw.steps("s1")
    assert step.ttft_ms is not None and step.ttft_ms >= STALL * 1000 * 0.9


async def test_zero_interval_disables_and_a_route_overrides(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    """``keepalive_interval_s: 0`` on the gateway sends none; a route's own interval wins."""
    routes = {"m": {}, "fast": {"keepalive_interval_s": INTERVAL}}
    gw = await start_gateway(keepalive_interval_s=0, routes=routes)
    assert (gw.settings.keepalive_for("m"), gw.settings.keepalive_for("fast")) == (0, INTERVAL)
    http = gw.http()
    for route in ("m", "fast"):
        upstream.script(UP_PATH, [Reply.sse(COMMENTS_AND_KEEPALIVES, delay_s=[0, 0, 0, 0, 0, 0.7, 0])])
        r = await http.post(
            f"/v1/sessions/s-{route}/chat/completions",
            json={"model": route, "messages": MESSAGES, "stream": True},
        )
        assert r.content.replace(KEEPALIVE, b"") == RELAYED_OF_COMMENTS
        if route == "m":
            assert KEEPALIVE not in r.content
        else:
            assert_only_between_events(r.content)
    assert await gw.metric("gateway_stream_keepalives_total", route="m") == 0
    assert await gw.metric("gateway_stream_keepalives_total", route="fast") >= 1


def test_keepalive_interval_settings() -> None:
    routes = {"m": {"base_url": "http://u/v1"}, "r": {"base_url": "http://u/v1", "keepalive_interval_s": 3}}
    s = GatewaySettings.model_validate({"llm_routes": routes})
    assert (s.keepalive_interval_s, s.keepalive_for("m"), s.keepalive_for("r")) == (15.0, 15.0, 3.0)
    with pytest.raises(ValueError, match="keepalive_interval_s"):
        GatewaySettings.model_validate({"keepalive_interval_s": -1})
    with pytest.raises(ValueError, match="keepalive_interval_s"):
        GatewaySettings.model_validate(
            {"llm_routes": {"m": {"base_url": "http://u/v1", "keepalive_interval_s": -1}}}
        )


async def test_anthropic_stream_with_a_stall(start_gateway: StartGateway, upstream: FakeUpstream) -> None:
    """The same for an Anthropic Messages stream, read by the real anthropic SDK."""
    gw = await start_gateway(
        keepalive_interval_s=INTERVAL, routes={"a": {"api": "anthropic", "base_url": upstream.origin}}
    )
    events = default_messages_stream()
    delays = [0.0] * len(events)
    delays[4] = 0.7  # between the first and second text delta
    upstream.script("/v1/messages", [Reply.sse(events, delay_s=delays)])
    tee = Tee()
    client = gw.anthropic("s1", http_client=httpx2.AsyncClient(transport=tee))
    async with client.messages.stream(model="a", max_tokens=16, messages=MESSAGES) as stream:  # type: ignore[arg-type]
        text = "".join([t async for t in stream.text_stream])
    assert text == "hello from fake"
    raw = bytes(tee.raw)
    assert raw.replace(KEEPALIVE, b"") == b"".join(events)
    assert_only_between_events(raw)
    [step] = await gw.steps("s1")
    assert step.status == "ok"
    assert step.response["content"] == [{"type": "text", "text": "hello from fake"}]
