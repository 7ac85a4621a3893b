"""Token-by-token sampling that keeps the exact ids and the logprob of each sampled token under
the distribution it was drawn from (docs/training.md, "The policy server"). The model is behind
an :class:`Engine` (a ``transformers`` model: :mod:`rollout.train.hf_engine`; a llama.cpp model:
:mod:`rollout.train.llama_engine`); sampling is numpy on the next-token logits, with a seeded
generator per call (no global RNG)."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

__all__ = ["Decoding", "Engine", "Generation", "SamplingParams", "generate", "sampling_logprobs"]


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


class Decoding(Protocol):
    """One generation's model state: the next-token logits after the prompt and after each
    token pushed."""

    def logits(self) -> np.ndarray: ...

    def push(self, token: int) -> None: ...


class Engine(Protocol):
    """A model and its tokenizer as the policy server uses them."""

    name: str
    context_length: int | None
    eos_ids: frozenset[int]
    takes_tools: bool

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        """The chat template applied to ``messages`` (and ``tools``), generation prompt added, as ids."""
        ...

    def render(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, add_generation_prompt: bool
    ) -> str:
        """The chat template applied to ``messages`` (and ``tools``), as text."""
        ...

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` (special tokens written in it parsed, none added)."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` without special tokens."""
        ...

    def token_text(self, token: int) -> str:
        """Text of one token (special tokens included)."""
        ...

    def open(self, prompt_ids: Sequence[int]) -> Decoding:
        """Start a generation after ``prompt_ids``."""
        ...


def sampling_logprobs(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Log-probabilities (float64, last axis) of the distribution ``params`` samples from: the
    softmax of ``logits / temperature`` with tokens outside ``top_k`` and the ``top_p`` nucleus at
    -inf, renormalised. Temperature 0 (greedy) gives the model's own distribution (temperature 1,
    nothing cut): the argmax is taken from it."""
    x = np.array(logits, dtype=np.float64)
    if params.temperature != 0:
        x /= params.temperature
        rows = x.reshape(-1, x.shape[-1])
        for row in rows:
            _cut(row, params)
    top = x.max(axis=-1, keepdims=True)
    shifted = x - top
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _cut(row: np.ndarray, params: SamplingParams) -> None:
    """Set the tokens of one row of scaled logits outside ``top_k`` and the ``top_p`` nucleus to -inf."""
    if 0 < params.top_k < row.shape[0]:
        kth = np.partition(row, -params.top_k)[-params.top_k]
        row[row < kth] = -np.inf
    if params.top_p < 1.0:
        kept = np.flatnonzero(np.isfinite(row))  # after top_k: only its survivors are sorted
        order = kept[np.argsort(-row[kept], kind="stable")]
        probs = np.exp(row[order] - row[order[0]])
        probs /= probs.sum()
        before = np.cumsum(probs) - probs  # mass of the tokens ranked above each token
        row[order[before >= params.top_p]] = -np.inf  # keep the smallest prefix reaching top_p


def _first_stop(text: str, stop: Sequence[str]) -> int | None:
    hits = [i for i in (text.find(s) for s in stop if s) if i >= 0]
    return min(hits) if hits else None


def generate(engine: Engine, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
    """Sample a completion of ``prompt_ids`` one token at a time as ``params`` says. The caller
    holds whatever lock keeps the weights still."""
    rng = np.random.default_rng(params.seed if params.seed is not None else secrets.randbits(63))
    out = Generation()
    decoding = engine.open(prompt_ids)
    for n in range(params.max_new_tokens):
        logp = sampling_logprobs(decoding.logits(), params)
        if params.temperature == 0:
            token = int(np.argmax(logp))
        else:
            cdf = np.cumsum(np.exp(logp))
            token = min(int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")), len(cdf) - 1)
        out.token_ids.append(token)
        out.logprobs.append(float(logp[token]))
        if params.top_logprobs:
            best = np.argsort(-logp, kind="stable")[: params.top_logprobs]
            out.top.append([(int(i), float(logp[i])) for i in best])
        if token in engine.eos_ids:
            out.finish_reason = "stop"
            break
        if params.stop:
            text = engine.decode(out.token_ids)
            cut = _first_stop(text, params.stop)
            if cut is not None:
                out.text, out.finish_reason = text[:cut], "stop"
                return out
        if n + 1 < params.max_new_tokens:
            decoding.push(token)
    out.text = engine.decode(out.token_ids)
    return out
