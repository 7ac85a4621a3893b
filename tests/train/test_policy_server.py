"""The policy server samples from the very model object it is given and says exactly what it
sampled: the token ids decode to the text, the logprobs are the model's (recomputed by a forward
pass), a seed repeats a call, and a gateway route with ``capture: tokens`` records those ids."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from gateway.settings import GatewaySettings, RouteSettings
from rollout.train.hf_engine import TransformersEngine
from rollout.train.policy_server import ChatPolicy, ChatRequest, PolicyServer
from rollout.train.sampling import Generation, SamplingParams, sampling_logprobs
from rollout.train.sync import PolicySync, set_policy_version
from tests.gateway.conftest import Gateway, serve
from tests.train.tiny_policy import tiny_model, tiny_tokenizer

pytestmark = pytest.mark.train

MESSAGES = [{"role": "system", "content": "You answer."}, {"role": "user", "content": "Say hi."}]
TOKENS = {"return_token_ids": True, "logprobs": True}


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return tiny_tokenizer()


@pytest.fixture
def model(tokenizer: Any) -> Any:
    return tiny_model(tokenizer)


@pytest.fixture
def server(model: Any, tokenizer: Any) -> Iterator[PolicyServer]:
    with PolicyServer(model, tokenizer, model_name="tiny") as s:
        yield s


def chat(server: PolicyServer, **body: Any) -> httpx.Response:
    return httpx.post(
        server.base_url + "/chat/completions",
        json={"model": "tiny", "messages": MESSAGES, **body},
        timeout=60,
    )


def answer(server: PolicyServer, **body: Any) -> dict[str, Any]:
    r = chat(server, **body)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def prompt_ids(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def forward_logprobs(
    model: Any, prompt: list[int], completion: list[int], params: SamplingParams
) -> list[float]:
    """The logprob of each completion token under ``params``'s distribution, from one forward pass
    over prompt + completion (no cache, no sampling loop)."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + completion])).logits[0]
    rows = logits[len(prompt) - 1 : len(prompt) - 1 + len(completion)].numpy()
    logp = sampling_logprobs(rows, params)
    return [float(logp[i, t]) for i, t in enumerate(completion)]


def test_ids_decode_to_the_text_and_logprobs_are_the_models(
    server: PolicyServer, model: Any, tokenizer: Any
) -> None:
    out = answer(server, temperature=1.0, max_tokens=24, seed=3, **TOKENS)
    choice = out["choices"][0]
    ids, content = choice["token_ids"], choice["logprobs"]["content"]
    assert out["prompt_token_ids"] == prompt_ids(tokenizer, MESSAGES)
    assert 1 <= len(ids) <= 24 and len(content) == len(ids)
    assert tokenizer.decode(ids, skip_special_tokens=True) == choice["message"]["content"]
    expected = forward_logprobs(model, out["prompt_token_ids"], ids, SamplingParams(max_new_tokens=1))
    assert [e["logprob"] for e in content] == pytest.approx(expected, abs=1e-4)
    assert [e["token"] for e in content] == [tokenizer.decode([t]) for t in ids]
    assert out["usage"] == {
        "prompt_tokens": len(out["prompt_token_ids"]),
        "completion_tokens": len(ids),
        "total_tokens": len(out["prompt_token_ids"]) + len(ids),
    }
    assert choice["finish_reason"] == ("stop" if ids[-1] == tokenizer.eos_token_id else "length")


def test_logprobs_are_those_of_the_distribution_sampled(server: PolicyServer, model: Any) -> None:
    params = SamplingParams(max_new_tokens=24, temperature=0.6, top_p=0.8, top_k=40)
    out = answer(server, temperature=0.6, top_p=0.8, top_k=40, max_tokens=24, seed=5, **TOKENS)
    ids = out["choices"][0]["token_ids"]
    got = [e["logprob"] for e in out["choices"][0]["logprobs"]["content"]]
    assert got == pytest.approx(forward_logprobs(model, out["prompt_token_ids"], ids, params), abs=1e-4)
    unscaled = forward_logprobs(model, out["prompt_token_ids"], ids, SamplingParams(max_new_tokens=1))
    assert got != pytest.approx(unscaled, abs=1e-3)  # not the temperature-1 numbers


def test_greedy_takes_the_argmax(server: PolicyServer, model: Any) -> None:
    out = answer(server, temperature=0, max_tokens=16, **TOKENS)
    prompt, ids = out["prompt_token_ids"], out["choices"][0]["token_ids"]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + ids])).logits[0]
    assert ids == [int(logits[len(prompt) - 1 + i].argmax()) for i in range(len(ids))]


def test_a_seed_repeats_the_call(server: PolicyServer) -> None:
    first = answer(server, max_tokens=16, seed=11, return_token_ids=True)
    again = answer(server, max_tokens=16, seed=11, return_token_ids=True)
    other = answer(server, max_tokens=16, seed=12, return_token_ids=True)
    assert first["choices"][0]["token_ids"] == again["choices"][0]["token_ids"]
    assert first["choices"][0]["message"] == again["choices"][0]["message"]
    assert other["choices"][0]["token_ids"] != first["choices"][0]["token_ids"]


def test_max_tokens_and_stop(server: PolicyServer, tokenizer: Any) -> None:
    out = answer(server, max_completion_tokens=5, temperature=0, **TOKENS)
    assert len(out["choices"][0]["token_ids"]) == 5 and out["choices"][0]["finish_reason"] == "length"
    full = out["choices"][0]["message"]["content"]
    stop = full[2:4]
    cut = answer(server, max_tokens=5, temperature=0, stop=[stop], **TOKENS)
    assert cut["choices"][0]["finish_reason"] == "stop"
    assert cut["choices"][0]["message"]["content"] == full[: full.find(stop)]
    # the ids keep every token sampled, up to the one that completed the stop string
    assert (
        out["choices"][0]["token_ids"][: len(cut["choices"][0]["token_ids"])]
        == cut["choices"][0]["token_ids"]
    )


def test_plain_request_gets_the_openai_shape(server: PolicyServer) -> None:
    out = answer(server, max_tokens=4)
    assert "prompt_token_ids" not in out and "token_ids" not in out["choices"][0]
    assert out["object"] == "chat.completion" and out["choices"][0]["logprobs"] is None
    assert out["choices"][0]["message"]["role"] == "assistant"
    models = httpx.get(server.base_url + "/models").json()
    assert [m["id"] for m in models["data"]] == ["tiny"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"n": 2}, "n"),
        ({"temperature": -1}, "temperature"),
        ({"frequency_penalty": 0.5}, "frequency_penalty"),
        ({"messages": []}, "messages"),
    ],
)
def test_refusals_in_openai_error_shape(server: PolicyServer, body: dict[str, Any], param: str) -> None:
    r = chat(server, **body)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and param in err["message"]


def test_the_served_weights_are_the_trainers(server: PolicyServer, model: Any) -> None:
    before = answer(server, max_tokens=8, seed=1, **TOKENS)
    with server.lock, torch.no_grad():  # what an optimizer step does, under the server's lock
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    after = answer(server, max_tokens=8, seed=1, **TOKENS)
    ids = after["choices"][0]["token_ids"]
    got = [e["logprob"] for e in after["choices"][0]["logprobs"]["content"]]
    assert got == pytest.approx(
        forward_logprobs(model, after["prompt_token_ids"], ids, SamplingParams(1)), abs=1e-4
    )
    assert got != [e["logprob"] for e in before["choices"][0]["logprobs"]["content"]]


def test_stream_carries_the_same_tokens(server: PolicyServer) -> None:
    whole = answer(server, max_tokens=12, seed=4, **TOKENS)
    with httpx.stream(
        "POST",
        server.base_url + "/chat/completions",
        timeout=60,
        json={
            "messages": MESSAGES,
            "max_tokens": 12,
            "seed": 4,
            "stream": True,
            "stream_options": {"include_usage": True},
            **TOKENS,
        },
    ) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert events[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    ids = [t for e in events if e["choices"] for t in e["choices"][0].get("token_ids", [])]
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
    assert ids == whole["choices"][0]["token_ids"] and text == whole["choices"][0]["message"]["content"]
    assert events[-1]["usage"] == whole["usage"]


@pytest.fixture
async def gateway(server: PolicyServer, tmp_path: Path) -> AsyncIterator[Gateway]:
    settings = GatewaySettings.model_validate(
        {
            "listen_port": 0,
            "storage_config": {"db_url": f"sqlite://{tmp_path}/gw.db"},
            "llm_routes": {"policy": {"base_url": server.base_url, "capture": "tokens"}},
        }
    )
    gw = await serve(settings)
    yield gw
    await gw.stop()


@pytest.mark.parametrize("stream", [False, True])
async def test_capture_through_the_gateway_records_the_servers_tokens(
    server: PolicyServer, gateway: Gateway, stream: bool
) -> None:
    body = {"model": "policy", "messages": MESSAGES, "max_tokens": 16, "seed": 9, "stream": stream}
    r = await gateway.http().post("/v1/sessions/s1/chat/completions", json=body)
    assert r.status_code == 200 and b"token_ids" not in r.content  # the client did not ask for them
    (step,) = await gateway.wait_steps("s1", 1)
    direct = answer(server, **{k: v for k, v in body.items() if k != "stream"}, **TOKENS)  # same seed
    choice = direct["choices"][0]
    assert step.prompt_token_ids == direct["prompt_token_ids"]
    assert step.completion_token_ids == choice["token_ids"]
    assert step.completion_logprobs == [e["logprob"] for e in choice["logprobs"]["content"]]
    assert step.finish_reason == choice["finish_reason"]


async def test_policy_version_set_by_the_trainer_stamps_later_steps(
    server: PolicyServer, gateway: Gateway
) -> None:
    # a blocking call, as a trainer makes it: off this loop, which also runs the gateway
    set_answer = await asyncio.to_thread(set_policy_version, gateway.url + "/v1/sessions", 3)
    assert set_answer["policy_version"] == 3
    body = {"model": "policy", "messages": MESSAGES, "max_tokens": 2}
    assert (await gateway.http().post("/v1/sessions/s2/chat/completions", json=body)).status_code == 200
    (step,) = await gateway.wait_steps("s2", 1)
    assert step.policy_version == 3


def test_a_server_seed_makes_seedless_calls_repeat_in_order(model: Any, tokenizer: Any) -> None:
    def run(seed: int) -> list[list[int]]:
        policy = ChatPolicy(TransformersEngine(model, tokenizer), seed=seed)
        req = ChatRequest(messages=MESSAGES, max_tokens=12)
        return [policy.run(policy.prepare(req)).token_ids for _ in range(3)]

    first = run(5)
    assert run(5) == first
    assert first[0] != first[1]  # the calls of one run differ (samples of a group)
    assert run(6) != first


def test_the_default_routes_server_kind_counts_tokens_by_tokenize() -> None:
    route = RouteSettings.model_validate(
        {"base_url": "http://127.0.0.1:1/v1", "managed": {"kind": "llama_cpp_tokens"}}
    )
    assert route.token_counter() == "vllm"


async def test_count_tokens_through_the_gateway_is_the_chat_templates(
    server: PolicyServer, tmp_path: Path, tokenizer: Any
) -> None:
    settings = GatewaySettings.model_validate(
        {
            "listen_port": 0,
            "storage_config": {"db_url": f"sqlite://{tmp_path}/gw.db"},
            "llm_routes": {"policy": {"base_url": server.base_url, "count_tokens": "vllm"}},
        }
    )
    gw = await serve(settings)
    try:
        r = await gw.http().post(
            "/v1/messages/count_tokens",
            json={
                "model": "policy",
                "system": "You answer.",
                "messages": [{"role": "user", "content": "Say hi."}],
            },
        )
        assert r.status_code == 200, r.text
        assert r.json() == {"input_tokens": len(prompt_ids(tokenizer, MESSAGES))}
    finally:
        await gw.stop()


def test_hermes_tool_calls_become_tool_calls(model: Any, tokenizer: Any) -> None:
    policy = ChatPolicy(TransformersEngine(model, tokenizer))
    text = 'Running it.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
    msg, finish = policy.message(
        Generation(token_ids=[1], logprobs=[0.0], text=text, finish_reason="stop"), True
    )
    assert finish == "tool_calls" and msg["content"] == "Running it."
    (call,) = msg["tool_calls"]
    assert (
        call["function"] == {"name": "bash", "arguments": '{"command": "ls"}'} and call["type"] == "function"
    )
    # tools not rendered (a template without tools): the text stays the content
    assert policy.message(Generation(text=text, finish_reason="stop"), False) == (
        {"role": "assistant", "content": text},
        "stop",
    )


async def test_policy_sync_holds_the_lock_over_the_step_and_counts_versions(
    server: PolicyServer, gateway: Gateway
) -> None:
    sync = PolicySync(server.lock, gateway.url)
    await asyncio.to_thread(sync.on_train_begin, None, None, None)
    assert (await gateway.http().get("/admin/policy_version")).json()["policy_version"] == 0
    for step in (1, 2):
        sync.on_pre_optimizer_step(None, None, None)
        assert server.lock.locked()  # no generation starts while the weights change
        await asyncio.to_thread(sync.on_optimizer_step, None, None, None)
        assert not server.lock.locked()
        assert (await gateway.http().get("/admin/policy_version")).json()["policy_version"] == step


def test_max_tokens_cap_bounds_every_completion_whatever_the_request_asks(model: Any, tokenizer: Any) -> None:
    with PolicyServer(model, tokenizer, model_name="tiny", max_tokens_cap=5) as capped:
        for body in ({"max_tokens": 50}, {"max_completion_tokens": 3}, {}):
            out = answer(capped, temperature=1.0, seed=1, **TOKENS, **body)
            limit = min(5, body.get("max_completion_tokens", 5))
            ids = out["choices"][0]["token_ids"]
            assert len(ids) <= limit and out["usage"]["completion_tokens"] == len(ids)
            if out["choices"][0]["finish_reason"] == "length":
                assert len(ids) == limit
