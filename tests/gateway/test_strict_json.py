"""Non-finite numbers from the upstream (``NaN``, ``Infinity``, ``-Infinity``: not JSON) reach the
client as ``null`` on every protocol, in non-streamed bodies and in SSE events, and the step
records exactly that (``meta_json.non_finite_numbers`` counts them)."""

from __future__ import annotations

import json
from typing import Any

from tests.fake_upstream import (
    DONE,
    FakeUpstream,
    Reply,
    anthropic_message,
    chat_chunk,
    chat_completion,
    default_responses_stream,
    response_object,
    sse_data,
    sse_event,
)
from tests.gateway.conftest import MESSAGES, StartGateway, anthropic_routes, sse_payloads

NAN, INF = float("nan"), float("inf")


def strict_loads(text: str | bytes) -> Any:
    """A strict JSON parser: refuses ``NaN``/``Infinity``/``-Infinity``."""

    def refuse(name: str) -> None:
        raise ValueError(f"not strict JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def _logprobs() -> dict[str, Any]:
    return {
        "content": [
            {
                "token": "hi",
                "logprob": -INF,
                "bytes": [104, 105],
                "top_logprobs": [{"token": "hi", "logprob": NAN, "bytes": None}],
            }
        ],
        "refusal": None,
    }


def test_the_fake_upstream_really_sends_non_finite_numbers() -> None:
    body = Reply.json({"x": NAN, "y": -INF}).chunks[0]
    assert body == b'{"x":NaN,"y":-Infinity}'


async def test_chat_non_streamed(start_gateway: StartGateway, upstream: FakeUpstream) -> None:
    gw = await start_gateway()
    answer = chat_completion("hi")
    answer["choices"][0]["logprobs"] = _logprobs()
    upstream.script("/v1/chat/completions", [Reply.json(answer)] * 2)
    r = await gw.http().post("/v1/sessions/s1/chat/completions", json={"model": "m", "messages": MESSAGES})
    got = strict_loads(r.content)
    lp = got["choices"][0]["logprobs"]["content"][0]
    assert (lp["logprob"], lp["top_logprobs"][0]["logprob"], lp["bytes"]) == (None, None, [104, 105])
    out = await gw.client("s1").chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert out.choices[0].logprobs is not None and out.choices[0].logprobs.content is not None
    assert out.choices[0].logprobs.content[0].logprob is None
    assert out.choices[0].message.content == "hi"
    first, second = await gw.steps("s1")
    assert first.response == got and second.response == got  # recorded = served
    assert (first.status, first.meta_json["non_finite_numbers"]) == ("ok", 2)


async def test_chat_streamed(start_gateway: StartGateway, upstream: FakeUpstream) -> None:
    gw = await start_gateway()
    lp = {"content": [{"token": "hi", "logprob": -INF, "bytes": None, "top_logprobs": []}]}
    chunks = [chat_chunk("hi", role="assistant", logprobs=lp), chat_chunk(finish_reason="stop"), DONE]
    upstream.script("/v1/chat/completions", [Reply.sse(chunks)] * 2)
    body = {"model": "m", "messages": MESSAGES, "stream": True}
    async with gw.http().stream("POST", "/v1/sessions/s1/chat/completions", json=body) as r:
        raw = await r.aread()
    payloads = [strict_loads(p) for p in sse_payloads(raw) if p != "[DONE]"]
    assert payloads[0]["choices"][0]["logprobs"]["content"][0]["logprob"] is None
    stream = await gw.client("s1").chat.completions.create(model="m", messages=MESSAGES, stream=True)  # type: ignore[call-overload]
    got = [c async for c in stream]
    assert got[0].choices[0].logprobs.content[0].logprob is None
    first, _ = await gw.steps("s1")
    assert first.status == "ok" and first.meta_json["non_finite_numbers"] == 1
    assert first.response["choices"][0]["logprobs"]["content"][0]["logprob"] is None
    assert first.response["choices"][0]["message"]["content"] == "hi"


async def test_responses_non_streamed_and_streamed(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway()
    answer = response_object("hi")
    answer["output"][0]["content"][0]["logprobs"] = [{"token": "hi", "logprob": -INF, "top_logprobs": []}]
    stream = default_responses_stream()
    delta = json.loads(sse_payloads(stream[4])[0])
    assert delta["type"] == "response.output_text.delta"
    delta["logprobs"] = [{"token": "hello", "logprob": NAN, "top_logprobs": []}]
    stream[4] = sse_event(delta)
    completed = json.loads(sse_payloads(stream[-1])[0])  # the recorded answer of a stream comes from here
    assert completed["type"] == "response.completed"
    completed["response"]["output"][0]["content"][0]["logprobs"] = [
        {"token": "x", "logprob": -INF, "top_logprobs": []}
    ]
    stream[-1] = sse_event(completed)
    upstream.script("/v1/responses", [Reply.json(answer), Reply.sse(stream)])
    client = gw.client("s1")
    out = await client.responses.create(model="m", input="hi")
    part = out.output[0].content[0]  # type: ignore[union-attr]
    assert part.logprobs is not None and part.logprobs[0].logprob is None  # type: ignore[union-attr]
    events = [ev async for ev in await client.responses.create(model="m", input="hi", stream=True)]
    deltas = [ev for ev in events if ev.type == "response.output_text.delta"]
    assert deltas[0].logprobs[0].logprob is None  # type: ignore[union-attr]
    plain, streamed = await gw.steps("s1")
    assert plain.response["output"][0]["content"][0]["logprobs"][0]["logprob"] is None
    assert plain.meta_json["non_finite_numbers"] == 1 and streamed.meta_json["non_finite_numbers"] == 2
    assert streamed.status == "ok"
    assert streamed.response["output"][0]["content"][0]["logprobs"][0]["logprob"] is None


async def test_anthropic_non_streamed_and_streamed(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(routes=anthropic_routes(upstream))
    answer = anthropic_message(
        blocks=[{"type": "tool_use", "id": "t1", "name": "f", "input": {"x": NAN}}], stop_reason="tool_use"
    )
    start = {**anthropic_message(), "content": [], "stop_reason": None, "x_confidence": -INF}
    events = [
        {"type": "message_start", "message": start},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}},
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": 1},
        },
        {"type": "message_stop"},
    ]
    upstream.script("/v1/messages", [Reply.json(answer), Reply.sse([sse_event(e) for e in events])])
    client = gw.anthropic("s1")
    msg = await client.messages.create(model="a", max_tokens=8, messages=MESSAGES)  # type: ignore[arg-type]
    assert msg.content[0].input == {"x": None}  # type: ignore[union-attr]
    async with gw.http().stream(
        "POST",
        "/v1/sessions/s1/v1/messages",
        json={"model": "a", "max_tokens": 8, "messages": MESSAGES, "stream": True},
    ) as r:
        raw = await r.aread()
    sent = [strict_loads(p) for p in sse_payloads(raw)]
    assert sent[0]["message"]["x_confidence"] is None and raw.count(b"event: message_start\n") == 1
    plain, streamed = await gw.steps("s1")
    assert plain.response["content"][0]["input"] == {"x": None} and plain.meta_json["non_finite_numbers"] == 1
    assert streamed.status == "ok" and streamed.response["x_confidence"] is None
    assert streamed.response["content"][0]["text"] == "hi" and streamed.meta_json["non_finite_numbers"] == 1


async def test_strings_that_look_non_finite_are_relayed_untouched(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway()
    text = "NaN and -Infinity, in words"
    upstream.script(
        "/v1/chat/completions",
        [
            Reply.sse(
                [
                    sse_data(
                        {
                            "id": "c",
                            "object": "chat.completion.chunk",
                            "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": "stop"}],
                        }
                    ),
                    DONE,
                ]
            )
        ],
    )
    async with gw.http().stream(
        "POST", "/v1/sessions/s1/chat/completions", json={"model": "m", "messages": MESSAGES, "stream": True}
    ) as r:
        raw = await r.aread()
    assert raw.startswith(b'data: {"id":"c"')  # byte for byte, not re-encoded
    [step] = await gw.steps("s1")
    assert step.response["choices"][0]["message"]["content"] == text
    assert "non_finite_numbers" not in step.meta_json


async def test_a_stream_retold_from_a_non_streamed_answer(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(routes={"m": {"supports_stream": False}})
    answer = chat_completion("hi")
    answer["choices"][0]["logprobs"] = _logprobs()
    upstream.script("/v1/chat/completions", [Reply.json(answer)])
    async with gw.http().stream(
        "POST", "/v1/sessions/s1/chat/completions", json={"model": "m", "messages": MESSAGES, "stream": True}
    ) as r:
        raw = await r.aread()
    sent = [strict_loads(p) for p in sse_payloads(raw) if p != "[DONE]"]
    assert any(c["choices"] and c["choices"][0].get("delta", {}).get("content") == "hi" for c in sent)
    [step] = await gw.steps("s1")
    assert step.meta_json["stream_synthesized"] is True and step.meta_json["non_finite_numbers"] == 2
    assert step.response["choices"][0]["logprobs"]["content"][0]["logprob"] is None


LONE = "bad \ud800 answer"
"""A lone UTF-16 surrogate: the JSON escape ``"\\ud800"`` decodes to it; no UTF-8 text carries it."""
ASKED = b'{"model":"m","messages":[{"role":"user","content":"say \\ud800 \\u0000"}]}'
"""A request body holding a lone surrogate's escape and NUL's."""


async def test_a_lone_surrogate_with_non_finite_numbers_is_kept_as_its_escape(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    """The strict-JSON rewrite of a body or an event that also holds a lone surrogate: the client
    gets the surrogate as its escape (the text stays UTF-8), the step records it exactly."""
    gw = await start_gateway()
    answer = chat_completion(LONE)
    answer["choices"][0]["logprobs"] = _logprobs()
    lp = {"content": [{"token": "x", "logprob": -INF, "bytes": None, "top_logprobs": []}]}
    chunks = [chat_chunk(LONE, role="assistant", logprobs=lp), chat_chunk(finish_reason="stop"), DONE]
    upstream.script("/v1/chat/completions", [Reply.json(answer), Reply.sse(chunks)])
    headers = {"content-type": "application/json"}
    r = await gw.http().post("/v1/sessions/s1/chat/completions", content=ASKED, headers=headers)
    assert r.status_code == 200 and b"bad \\ud800 answer" in r.content
    assert strict_loads(r.content)["choices"][0]["message"]["content"] == LONE
    async with gw.http().stream(
        "POST", "/v1/sessions/s1/chat/completions", headers=headers, content=ASKED[:-1] + b',"stream":true}'
    ) as s:
        raw = await s.aread()
    assert s.status_code == 200 and b"bad \\ud800 answer" in raw
    assert [
        strict_loads(p)["choices"][0]["delta"].get("content") for p in sse_payloads(raw) if p != "[DONE]"
    ] == [LONE, None]
    first, second = await gw.steps("s1")
    for step in (first, second):
        assert step.status == "ok" and step.messages == [{"role": "user", "content": "say \ud800 \x00"}]
        assert step.response["choices"][0]["message"]["content"] == LONE
    # what the upstream got: the request's own bytes
    assert [q.body for q in upstream.requests][0] == ASKED


async def test_a_stream_retold_from_an_answer_holding_a_lone_surrogate(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(routes={"m": {"supports_stream": False}})
    upstream.script("/v1/chat/completions", [Reply.json(chat_completion(LONE))])
    async with gw.http().stream(
        "POST", "/v1/sessions/s1/chat/completions", json={"model": "m", "messages": MESSAGES, "stream": True}
    ) as r:
        raw = await r.aread()
    assert r.status_code == 200 and b"bad \\ud800 answer" in raw
    sent = [strict_loads(p) for p in sse_payloads(raw) if p != "[DONE]"]
    assert any(c["choices"] and c["choices"][0].get("delta", {}).get("content") == LONE for c in sent)
    [step] = await gw.steps("s1")
    assert step.meta_json is not None and step.meta_json["stream_synthesized"] is True
    assert step.response["choices"][0]["message"]["content"] == LONE


async def test_an_error_that_echoes_a_lone_surrogate_is_an_error_not_a_500(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    """The gateway's own error bodies quote what they refuse (here an unknown model name): the
    quote is a lone surrogate's escape, the answer the error in the endpoint's shape."""
    gw = await start_gateway()
    chat = b'{"model":"\\ud800","messages":[{"role":"user","content":"x"}]}'
    for path, body in (
        ("/v1/sessions/s1/chat/completions", chat),
        ("/v1/sessions/s1/responses", b'{"model":"\\ud800","input":"x"}'),
    ):
        r = await gw.http().post(path, content=body, headers={"content-type": "application/json"})
        assert r.status_code == 404, r.text
        assert b"`\\ud800`" in r.content and "`\ud800`" in strict_loads(r.content)["error"]["message"]
    assert upstream.requests == []
