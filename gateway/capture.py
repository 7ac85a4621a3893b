"""Token capture (route option ``capture``): which fields to ask a vLLM or SGLang upstream for,
stripping them from what the client did not ask for, and reading the token columns of a
``chat.completion`` (docs/tokens.md)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["CaptureSettings", "strip_answer", "strip_chunk", "tokens_of", "upstream_fields"]


class CaptureSettings(BaseModel):
    """What a route captures (``capture: tokens`` is ``{mode: tokens}``): the ``server``'s field
    names, ``logprobs``, and vLLM's ``prompt_logprobs`` (docs/tokens.md)."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    mode: Literal["tokens"] = "tokens"
    server: Literal["vllm", "sglang"] = "vllm"
    logprobs: bool = True
    prompt_logprobs: int | None = Field(default=None, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, v: Any) -> Any:
        return {"mode": v} if isinstance(v, str) else v

    @model_validator(mode="after")
    def _prompt_logprobs_vllm_only(self) -> CaptureSettings:
        if self.prompt_logprobs is not None and self.server != "vllm":
            raise ValueError("capture.prompt_logprobs is a vLLM request field; SGLang's chat API has none")
        return self


def _asked(body: dict[str, Any], key: str) -> bool:
    value = body.get(key)
    return value is not None and value is not False


def upstream_fields(body: dict[str, Any], capture: CaptureSettings) -> dict[str, Any]:
    """The fields to add to a chat request so the upstream returns what ``capture`` wants, those the
    client set itself left out."""
    add: dict[str, Any] = {}
    if not _asked(body, "return_token_ids"):
        add["return_token_ids"] = True
    if capture.server == "sglang" and not _asked(body, "return_prompt_token_ids"):
        add["return_prompt_token_ids"] = True
    if capture.logprobs and not _asked(body, "logprobs"):
        add["logprobs"] = True
    if capture.prompt_logprobs is not None and body.get("prompt_logprobs") is None:
        add["prompt_logprobs"] = capture.prompt_logprobs
    return add


def _strip_choice(choice: Any, added: frozenset[str]) -> bool:
    if not isinstance(choice, dict):
        return False
    changed = False
    if "return_token_ids" in added and "token_ids" in choice:
        del choice["token_ids"]
        changed = True
    if ("return_prompt_token_ids" in added or "return_token_ids" in added) and "prompt_token_ids" in choice:
        del choice["prompt_token_ids"]
        changed = True
    if "logprobs" in added and choice.get("logprobs") is not None:
        choice["logprobs"] = None
        changed = True
    return changed


def _strip(obj: Any, added: frozenset[str]) -> Any | None:
    """A stripped shallow copy of ``obj`` (choices copied too), or None when nothing is to strip."""
    if not isinstance(obj, dict) or not added:
        return None
    out = dict(obj)
    changed = False
    if "return_token_ids" in added and "prompt_token_ids" in out:
        del out["prompt_token_ids"]
        changed = True
    if "prompt_logprobs" in added and "prompt_logprobs" in out:
        del out["prompt_logprobs"]
        changed = True
    choices = out.get("choices")
    if isinstance(choices, list):
        copies = [dict(c) if isinstance(c, dict) else c for c in choices]
        hit = [_strip_choice(c, added) for c in copies]
        if any(hit):
            out["choices"] = copies
            changed = True
    return out if changed else None


def strip_answer(answer: Any, added: frozenset[str]) -> Any | None:
    """A copy of ``answer`` without the ``added`` fields the client did not ask for, or None when there
    is nothing to take out."""
    return _strip(answer, added)


def strip_chunk(chunk: Any, added: frozenset[str]) -> Any | None:
    """The same for one ``chat.completion.chunk`` of a stream."""
    return _strip(chunk, added)


_MAX_ID = 2**63  # token ids are stored and fingerprinted as 64-bit integers


def _ints(value: Any) -> list[int] | None:
    """``value`` when it is a list of token ids (integers in [0, 2**63)), else None."""
    if not isinstance(value, list):
        return None
    for v in value:
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < _MAX_ID:
            return None
    return list(value)


def tokens_of(response: Any) -> tuple[list[int] | None, list[int] | None, list[float | None] | None]:
    """``(prompt_token_ids, completion_token_ids, completion_logprobs)`` of choice 0 of a
    ``chat.completion``, each None when absent."""
    if not isinstance(response, dict):
        return None, None, None
    choices = response.get("choices")
    first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    prompt = _ints(response.get("prompt_token_ids"))
    if prompt is None:
        prompt = _ints(first.get("prompt_token_ids"))
    completion = _ints(first.get("token_ids"))
    logprobs: list[float | None] | None = None
    lp = first.get("logprobs")
    content = lp.get("content") if isinstance(lp, dict) else None
    if isinstance(content, list):
        values: list[float | None] = []
        for entry in content:
            v = entry.get("logprob") if isinstance(entry, dict) else None
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
                values = []
                break
            values.append(None if v is None else float(v))
        else:
            logprobs = values
    return prompt, completion, logprobs
