"""Token-by-token sampling from a ``transformers`` causal LM, keeping the exact ids and the
logprob of each sampled token under the distribution it was drawn from (docs/training.md,
"The policy server"). Pure torch: no HTTP, no global RNG (a seeded ``torch.Generator`` per call).
"""

from __future__ import annotations

import inspect
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

__all__ = ["Generation", "SamplingParams", "generate", "sampling_logprobs"]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample: ``temperature`` 0 is greedy; ``top_p`` (nucleus) and ``top_k`` (0: off)
    cut the distribution before sampling; ``stop`` strings end the completion (not included in
    the text); ``seed`` makes a call repeatable; ``top_logprobs``: alternatives kept per token."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    top_logprobs: int = 0


@dataclass
class Generation:
    """One completion: ``token_ids`` (an end-of-sequence token included when the model emitted
    it), ``logprobs`` (one per token), ``top`` (per token, the ``top_logprobs`` best ids with their
    logprobs), ``text`` (decoded without special tokens, cut before a stop string) and why it
    ended: ``stop`` (end-of-sequence token or stop string) or ``length``."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    text: str = ""
    finish_reason: Literal["stop", "length"] = "length"


def sampling_logprobs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Log-probabilities (last dimension) of the distribution ``params`` samples from: the
    softmax of ``logits / temperature`` with tokens outside ``top_k`` and the ``top_p`` nucleus at
    -inf, renormalised. Temperature 0 (greedy) gives the model's own distribution (temperature 1,
    nothing cut): the argmax is taken from it."""
    logits = logits.float()
    if params.temperature == 0:
        return torch.log_softmax(logits, dim=-1)
    scaled = logits / params.temperature
    if params.top_k > 0 and params.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, params.top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs  # mass of the tokens ranked above each token
        drop_sorted = before >= params.top_p  # the smallest prefix reaching top_p is kept
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scaled = scaled.masked_fill(drop, float("-inf"))
    return torch.log_softmax(scaled, dim=-1)


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    for source in (getattr(tokenizer, "eos_token_id", None),
                   getattr(getattr(model, "generation_config", None), "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, list | tuple):
            ids.update(int(i) for i in source)
    return ids


def _cache_keyword(model: Any) -> str:
    """``cache`` (transformers >= 5.24) or ``past_key_values`` (older models): the forward keyword
    and output field of the KV cache."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _first_stop(text: str, stop: Sequence[str]) -> int | None:
    hits = [i for i in (text.find(s) for s in stop if s) if i >= 0]
    return min(hits) if hits else None


def generate(model: Any, tokenizer: Any, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
    """Sample a completion of ``prompt_ids`` from ``model`` one token at a time (KV cache, no
    gradient), as :class:`SamplingParams` says. The caller holds whatever lock keeps the weights
    still; the module is run in the mode it is in (a trainer's module stays in train mode: models
    with dropout should be served in eval mode)."""
    generator = torch.Generator(device="cpu")
    generator.manual_seed(params.seed if params.seed is not None else secrets.randbits(63))
    eos = _eos_ids(model, tokenizer)
    device = next(model.parameters()).device
    cache_kw = _cache_keyword(model)
    out = Generation()
    with torch.no_grad():
        input_ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)
        past: Any = None
        for _ in range(params.max_new_tokens):
            result = model(input_ids=input_ids, use_cache=True, **{cache_kw: past})
            past = getattr(result, cache_kw)
            logp = sampling_logprobs(result.logits[0, -1], params).cpu()
            if params.temperature == 0:
                token = int(torch.argmax(logp))
            else:
                token = int(torch.multinomial(logp.exp(), 1, generator=generator))
            out.token_ids.append(token)
            out.logprobs.append(float(logp[token]))
            if params.top_logprobs:
                best = torch.topk(logp, params.top_logprobs)
                out.top.append([(int(i), float(v)) for v, i in zip(best.values, best.indices, strict=True)])
            if token in eos:
                out.finish_reason = "stop"
                break
            if params.stop:
                text = tokenizer.decode(out.token_ids, skip_special_tokens=True)
                cut = _first_stop(text, params.stop)
                if cut is not None:
                    out.text, out.finish_reason = text[:cut], "stop"
                    return out
            input_ids = torch.tensor([[token]], dtype=torch.long, device=device)
    out.text = tokenizer.decode(out.token_ids, skip_special_tokens=True)
    return out
