"""A tiny policy built in memory from a config (nothing downloaded, seconds on a CPU), for smoke
runs and tests of the training loop (``launcher.py train --model-config tiny``): a 2-layer Llama
over a byte-level tokenizer (one token per byte, then the ChatML specials), with a ChatML chat
template. Its output is held to printable ASCII, newline and ``<|im_end|>`` (a constant logit bias
on the others, part of the model, so sampling and training see one distribution): decoding and
re-rendering its text gives back the very tokens it sampled, so its multi-turn sessions are one
exact sequence."""

from __future__ import annotations

from typing import Any

__all__ = ["CHATML", "tiny_policy"]

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_BANNED_BIAS = -1e4


def _tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {ch: i for i, ch in enumerate(bytes_to_unicode().values())}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)  # type: ignore[assignment]
    backend.decoder = decoders.ByteLevel()  # type: ignore[assignment]
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.add_special_tokens({"additional_special_tokens": SPECIALS[1:]})
    tok.chat_template = CHATML
    return tok


def tiny_policy(seed: int = 0) -> tuple[Any, Any]:
    """``(model, tokenizer)``: a randomly initialised (``seed``) float32 Llama, hidden size 64, in
    eval mode, and its byte-level tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tokenizer = _tokenizer()
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    byte_of = {ch: b for b, ch in bytes_to_unicode().items()}
    allowed = {tokenizer.convert_tokens_to_ids(ch) for ch, b in byte_of.items() if 32 <= b < 127 or b == 10}
    allowed.add(tokenizer.eos_token_id)
    bias = torch.full((len(tokenizer),), _BANNED_BIAS)
    bias[sorted(allowed)] = 0.0
    model.lm_head.register_buffer("output_bias", bias, persistent=False)
    model.lm_head.register_forward_hook(lambda head, args, out: out + head.output_bias)
    return model.eval(), tokenizer
