"""A ``transformers`` causal LM (the trainer's module itself) and its tokenizer as a sampling
:class:`~rollout.train.sampling.Engine`: KV cache, no gradient, the module left in whatever mode
the trainer put it in (models with dropout should be served in eval mode)."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["TransformersEngine"]


class _Decoding:
    def __init__(self, model: Any, cache_kw: str, prompt_ids: Sequence[int]) -> None:
        self.model, self.cache_kw = model, cache_kw
        self.device = next(model.parameters()).device
        self.cache: Any = None
        self._run(list(prompt_ids))

    def _run(self, ids: list[int]) -> None:
        with torch.no_grad():
            out = self.model(
                input_ids=torch.tensor([ids], dtype=torch.long, device=self.device),
                use_cache=True,
                **{self.cache_kw: self.cache},
            )
        self.cache = getattr(out, self.cache_kw)
        self._logits = out.logits[0, -1].float().cpu().numpy()

    def logits(self) -> np.ndarray:
        return self._logits

    def push(self, token: int) -> None:
        self._run([token])


class TransformersEngine:
    """``model`` (a ``transformers`` causal LM, used as is: no copy) and ``tokenizer`` (its chat
    template renders prompts)."""

    def __init__(self, model: Any, tokenizer: Any, name: str = "policy") -> None:
        self.model, self.tokenizer, self.name = model, tokenizer, name
        template = getattr(tokenizer, "chat_template", None)
        self.takes_tools = isinstance(template, str) and "tools" in template
        self.context_length: int | None = (
            int(getattr(model.config, "max_position_embeddings", 0) or 0) or None
        )
        eos: set[int] = set()
        for source in (
            getattr(tokenizer, "eos_token_id", None),
            getattr(getattr(model, "generation_config", None), "eos_token_id", None),
        ):
            if isinstance(source, int):
                eos.add(source)
            elif isinstance(source, list | tuple):
                eos.update(int(i) for i in source)
        self.eos_ids = frozenset(eos)
        # transformers >= 5.24 names the KV cache ``cache`` (``past_key_values`` is deprecated)
        self._cache_kw = (
            "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        )

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        return self.encode(self.render(messages, tools, True))

    def render(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, add_generation_prompt: bool
    ) -> str:
        return str(
            self.tokenizer.apply_chat_template(
                messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt
            )
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))

    def token_text(self, token: int) -> str:
        return str(self.tokenizer.decode([token]))

    def open(self, prompt_ids: Sequence[int]) -> _Decoding:
        return _Decoding(self.model, self._cache_kw, prompt_ids)
