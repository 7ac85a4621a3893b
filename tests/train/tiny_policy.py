"""A tiny causal LM and a real byte-level tokenizer built in memory (no download, seconds on a
CPU) for the policy server's tests: a 2-layer Llama with hidden size 64 over 256 byte tokens plus
the ChatML specials, with a ChatML chat template."""

from __future__ import annotations

from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import bytes_to_unicode

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def tiny_tokenizer() -> Any:
    """Byte-level BPE without merges: every byte is one token (ids 0-255), then the specials."""
    vocab = {ch: i for i, ch in enumerate(bytes_to_unicode().values())}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.add_special_tokens({"additional_special_tokens": SPECIALS[1:]})
    tok.chat_template = CHATML
    return tok


def tiny_model(tokenizer: Any, seed: int = 0) -> Any:
    """A randomly initialised 2-layer Llama (float32, eval mode) over ``tokenizer``'s vocabulary."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    model = LlamaForCausalLM(config)
    # sharper than the initial near-uniform distribution, so sampling settings visibly matter
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    return model.eval()
