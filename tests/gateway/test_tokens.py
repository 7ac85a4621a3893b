"""Token capture (route ``capture``): the gateway asks a vLLM/SGLang-style upstream for token ids and
logprobs, stores them exactly in the step, and gives the client byte for byte what it would get
without capture when it did not ask. The fake upstream answers as vLLM/SGLang do
(:func:`tests.fake_upstream.token_rule`)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from gateway.capture import CaptureSettings, strip_answer, tokens_of, upstream_fields
from gateway.settings import GatewaySettings
from tests.fake_upstream import (
    DEFAULT_TEXT,
    IM_END,
    FakeUpstream,
    fake_completion_ids,
    fake_logprob,
    fake_prompt_ids,
    token_rule,
)
from tests.gateway.conftest import MESSAGES, StartGateway, sse_json

CHAT = {"model": "cap", "messages": MESSAGES}
PROMPT = fake_prompt_ids(MESSAGES)
COMPLETION = fake_completion_ids(DEFAULT_TEXT)
LOGPROBS = [fake_logprob(t) for t in COMPLETION]


def routes(**capture: Any) -> dict[str, dict[str, Any]]:
    """``cap``: token capture on; ``plain``: the same upstream model without it."""
    return {"cap": {"capture": capture or "tokens", "upstream_model": "m"}, "plain": {"upstream_model": "m"}}


async def post(gw: Any, sid: str, body: dict[str, Any]) -> bytes:
    r = await gw.http().post(f"/v1/sessions/{sid}/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.content


@pytest.mark.parametrize("stream", [False, True])
async def test_exact_ids_stored_and_client_answer_unchanged(
    start_gateway: StartGateway, upstream: FakeUpstream, stream: bool
) -> None:
    upstream.add_rule(token_rule())
    gw = await start_gateway(routes=routes())
    captured = await post(gw, "s-cap", {**CHAT, "stream": stream})
    plain = await post(gw, "s-plain", {**CHAT, "model": "plain", "stream": stream})
    assert captured == plain  # byte for byte: what the client would get without capture
    assert b"token_ids" not in captured and b"logprob" not in captured.replace(b'"logprobs":null', b"")
    sent = upstream.requests[0].json
    assert sent["return_token_ids"] is True and sent["logprobs"] is True
    assert "return_token_ids" not in upstream.requests[1].json
    (step,) = await gw.wait_steps("s-cap", 1)
    assert step.prompt_token_ids == PROMPT
    assert step.completion_token_ids == COMPLETION and step.completion_token_ids[-1] == IM_END
    assert step.completion_logprobs == LOGPROBS
    assert step.finish_reason == "stop"
    assert step.meta_json is not None and step.meta_json["capture_added"] == ["logprobs", "return_token_ids"]
    assert step.request["return_token_ids"] is True  # the request column is what went upstream
    (other,) = await gw.wait_steps("s-plain", 1)
    assert (other.prompt_token_ids, other.completion_token_ids, other.completion_logprobs) == (
        None,
        None,
        None,
    )


async def test_stream_through_the_openai_sdk(start_gateway: StartGateway, upstream: FakeUpstream) -> None:
    upstream.add_rule(token_rule())
    gw = await start_gateway(routes=routes())
    stream = await gw.client("s1").chat.completions.create(model="cap", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == DEFAULT_TEXT
    (step,) = await gw.wait_steps("s1", 1)
    assert step.completion_token_ids == COMPLETION and step.prompt_token_ids == PROMPT


async def test_what_the_client_asked_for_it_keeps(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    upstream.add_rule(token_rule())
    gw = await start_gateway(routes=routes())
    answer = json.loads(await post(gw, "s1", {**CHAT, "logprobs": True}))
    assert [e["logprob"] for e in answer["choices"][0]["logprobs"]["content"]] == LOGPROBS
    assert "token_ids" not in answer["choices"][0] and "prompt_token_ids" not in answer
    both = json.loads(await post(gw, "s2", {**CHAT, "logprobs": True, "return_token_ids": True}))
    assert both["prompt_token_ids"] == PROMPT and both["choices"][0]["token_ids"] == COMPLETION
    (step,) = await gw.wait_steps("s2", 1)
    assert step.completion_token_ids == COMPLETION
    assert step.meta_json is not None and "capture_added" not in step.meta_json


async def test_prompt_logprobs_asked_and_kept_in_the_step(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    upstream.add_rule(token_rule())
    gw = await start_gateway(routes=routes(prompt_logprobs=0))
    captured = await post(gw, "s1", CHAT)
    assert captured == await post(gw, "s2", {**CHAT, "model": "plain"})
    assert upstream.requests[0].json["prompt_logprobs"] == 0
    (step,) = await gw.wait_steps("s1", 1)
    plp = step.response["prompt_logprobs"]
    assert plp[0] is None and len(plp) == len(PROMPT)
    assert plp[1] == {
        str(PROMPT[1]): {"logprob": fake_logprob(PROMPT[1]), "rank": 1, "decoded_token": chr(PROMPT[1])}
    }


@pytest.mark.parametrize("stream", [False, True])
async def test_sglang_fields(start_gateway: StartGateway, upstream: FakeUpstream, stream: bool) -> None:
    upstream.add_rule(token_rule("sglang"))
    gw = await start_gateway(routes=routes(server="sglang"))
    captured = await post(gw, "s1", {**CHAT, "stream": stream})
    assert captured == await post(gw, "s2", {**CHAT, "model": "plain", "stream": stream})
    sent = upstream.requests[0].json
    assert (sent["return_token_ids"], sent["return_prompt_token_ids"], sent["logprobs"]) == (True, True, True)
    (step,) = await gw.wait_steps("s1", 1)
    assert step.completion_logprobs == LOGPROBS
    if stream:  # SGLang's stream chunks carry no token ids: unknown, never empty
        assert (step.prompt_token_ids, step.completion_token_ids) == (None, None)
    else:
        assert (step.prompt_token_ids, step.completion_token_ids) == (PROMPT, COMPLETION)


async def test_route_that_cannot_stream_retells_the_stripped_answer(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    upstream.add_rule(token_rule())
    gw = await start_gateway(
        routes={
            "cap": {"capture": "tokens", "supports_stream": False, "upstream_model": "m"},
            "plain": {"supports_stream": False, "upstream_model": "m"},
        }
    )
    captured = await post(gw, "s1", {**CHAT, "stream": True})
    plain = await post(gw, "s2", {**CHAT, "model": "plain", "stream": True})

    def same(chunks: list[Any]) -> list[Any]:  # a re-told stream has its own id and time
        return [{k: v for k, v in c.items() if k not in ("id", "created")} for c in chunks]

    assert same(sse_json(captured)) == same(sse_json(plain))
    assert b"token_ids" not in captured
    (step,) = await gw.wait_steps("s1", 1)
    assert step.completion_token_ids == COMPLETION


async def test_other_endpoints_leave_the_columns_unknown(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(routes=routes())
    r = await gw.http().post("/v1/sessions/s1/responses", json={"model": "cap", "input": "hi"})
    assert r.status_code == 200
    (step,) = await gw.wait_steps("s1", 1)
    assert (step.prompt_token_ids, step.completion_token_ids, step.completion_logprobs) == (None, None, None)
    assert "return_token_ids" not in upstream.requests[0].json


def test_capture_config_is_strict(upstream: FakeUpstream) -> None:
    base = {"base_url": "http://127.0.0.1:1/v1"}
    ok = GatewaySettings.model_validate({"llm_routes": {"m": {**base, "capture": "tokens"}}})
    cap = ok.llm_routes["m"].capture
    assert cap == CaptureSettings(mode="tokens", server="vllm", logprobs=True, prompt_logprobs=None)
    for bad in (
        {"mode": "tokens", "typo": 1},
        "everything",
        {"server": "tgi"},
        {"server": "sglang", "prompt_logprobs": 1},
        {"prompt_logprobs": -1},
    ):
        with pytest.raises(ValidationError):
            GatewaySettings.model_validate({"llm_routes": {"m": {**base, "capture": bad}}})
    with pytest.raises(ValidationError, match="anthropic"):
        GatewaySettings.model_validate(
            {"llm_routes": {"a": {**base, "api": "anthropic", "capture": "tokens"}}}
        )


def test_pure_helpers() -> None:
    cap = CaptureSettings()
    assert upstream_fields({"logprobs": True}, cap) == {"return_token_ids": True}
    assert upstream_fields({"logprobs": False}, CaptureSettings(logprobs=False)) == {"return_token_ids": True}
    assert upstream_fields({"return_token_ids": True, "logprobs": True}, cap) == {}
    answer = {
        "choices": [{"index": 0, "logprobs": {"content": []}, "token_ids": [1]}],
        "prompt_token_ids": [2],
    }
    stripped = strip_answer(answer, frozenset({"return_token_ids", "logprobs"}))
    assert stripped == {"choices": [{"index": 0, "logprobs": None}]}
    assert answer["choices"][0]["token_ids"] == [1]  # the recorded answer is not touched
    assert strip_answer({"choices": [{"logprobs": None}]}, frozenset({"logprobs"})) is None
    lp = {"content": [{"logprob": -0.5}, {"logprob": None}]}
    assert tokens_of({"choices": [{"token_ids": [3, 4], "logprobs": lp}]}) == (None, [3, 4], [-0.5, None])
    assert tokens_of({"choices": [{"token_ids": [3, True]}]}) == (None, None, None)
    assert tokens_of({"prompt_token_ids": [2**63], "choices": [{"token_ids": [-1]}]}) == (None, None, None)
    assert tokens_of({"error": "x"}) == (None, None, None)
