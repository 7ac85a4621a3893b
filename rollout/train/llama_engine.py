"""A llama.cpp model (``llama-cpp-python``, the ``local`` extra) as a sampling
:class:`~rollout.train.sampling.Engine`: llama.cpp computes the next-token logits (reusing the KV
cache of the longest prompt prefix it already holds), the sampling is the policy server's, so the
answer carries exact token ids and logprobs, which llama.cpp's own server does not return."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

__all__ = ["LlamaCppEngine"]


class _Decoding:
    def __init__(self, engine: LlamaCppEngine, prompt_ids: Sequence[int]) -> None:
        self.llm, self.n_vocab = engine.llm, engine.n_vocab
        ids = list(prompt_ids)
        held = self.llm.input_ids[: self.llm.n_tokens].tolist()
        same = 0
        for a, b in zip(held, ids[:-1], strict=False):  # at least the last prompt token is evaluated
            if a != b:
                break
            same += 1
        self.llm.n_tokens = same  # eval drops the KV cache from here on
        self.llm.eval(ids[same:])

    def logits(self) -> np.ndarray:
        ptr = llama_cpp.llama_get_logits_ith(self.llm.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()

    def push(self, token: int) -> None:
        self.llm.eval([token])


class LlamaCppEngine:
    """A GGUF model run by llama.cpp (``n_ctx`` tokens of context), its chat template from the
    GGUF's metadata. One generation at a time (the caller's lock)."""

    def __init__(
        self, gguf: Path, *, n_ctx: int = 4096, n_threads: int | None = None, name: str = "local"
    ) -> None:
        # verbose: llama.cpp's load log goes to stderr (its quiet mode leaks /dev/null handles)
        self.llm = llama_cpp.Llama(
            model_path=str(gguf), n_ctx=n_ctx, n_threads=n_threads, logits_all=False, verbose=True
        )
        self.name = name
        self.context_length: int | None = n_ctx
        self.n_vocab = self.llm.n_vocab()
        vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        self.eos_ids = frozenset(t for t in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t))
        template = self.llm.metadata.get("tokenizer.chat_template")
        if not template:
            raise ValueError(f"{gguf} carries no chat template")
        self.takes_tools = "tools" in template
        self._formatters = {
            add: Jinja2ChatFormatter(
                template=template,
                eos_token=self._special(self.llm.token_eos()),
                bos_token=self._special(self.llm.token_bos()),
                add_generation_prompt=add,
            )
            for add in (True, False)
        }

    def _special(self, token: int) -> str:
        return (
            "" if token < 0 else self.llm.detokenize([token], special=True).decode("utf-8", errors="replace")
        )

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        return self.encode(self.render(messages, tools, True))

    def render(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, add_generation_prompt: bool
    ) -> str:
        return self._formatters[add_generation_prompt](messages=messages, tools=tools).prompt  # type: ignore[arg-type]

    def encode(self, text: str) -> list[int]:
        return list(self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True))

    def decode(self, ids: Sequence[int]) -> str:
        return self.llm.detokenize(list(ids)).decode("utf-8", errors="replace")

    def token_text(self, token: int) -> str:
        return self._special(token)

    def open(self, prompt_ids: Sequence[int]) -> _Decoding:
        return _Decoding(self, prompt_ids)
