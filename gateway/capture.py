"""Token capture (route option ``capture``): ask a vLLM or SGLang upstream for the exact token ids
and logprobs of a chat completion, keep them in the step, and give the client only what it asked.

Pure data code (no HTTP): :func:`upstream_fields` says which request fields the gateway adds,
:func:`strip_answer` / :func:`strip_chunk` take them out of what the client gets, and
:func:`tokens_of` reads the step columns ``prompt_token_ids``, ``completion_token_ids`` and
``completion_logprobs`` from a (possibly assembled) ``chat.completion``. Field names per
server and the exact stripping rule: docs/tokens.md.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["CaptureSettings", "strip_answer", "strip_chunk", "tokens_of", "upstream_fields"]

TOKEN_KEYS = ("prompt_token_ids", "token_ids")
"""Keys that carry token ids: top level (vLLM ``prompt_token_ids``) and per choice (vLLM and
SGLang ``token_ids``, SGLang ``prompt_token_ids``)."""


class CaptureSettings(BaseModel):
    """What a route captures for training (``capture: tokens`` is short for ``{mode: tokens}``).

    ``server`` names the upstream's request fields: ``vllm`` (``return_token_ids``, vLLM >=
    0.10.2) or ``sglang`` (``return_token_ids`` + ``return_prompt_token_ids``). ``logprobs``:
    also ask for the completion's per-token logprobs (``logprobs: true``). ``prompt_logprobs``
    (vLLM only): ask for that many top logprobs per prompt token (0: the prompt token's own);
    they stay in the step's ``response``, not in a column. None: not asked."""

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
    """The fields to add to a chat request ``body`` so the upstream returns what ``capture``
    wants, leaving out those the client set itself (truthy value). Empty when nothing is
    missing."""
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
    """``answer`` (a ``chat.completion``) without what the gateway asked for and the client did
    not (``added``: the field names :func:`upstream_fields` added): top-level
    ``prompt_token_ids`` / ``prompt_logprobs`` and per-choice ``token_ids`` /
    ``prompt_token_ids`` removed, per-choice ``logprobs`` set to null. A new object (``answer``
    is not changed), or None when there is nothing to take out."""
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
    """``(prompt_token_ids, completion_token_ids, completion_logprobs)`` of a ``chat.completion``
    (choice 0), each None when the answer does not carry it: prompt ids from the top-level
    ``prompt_token_ids`` (vLLM) or ``choices[0].prompt_token_ids`` (SGLang), completion ids from
    ``choices[0].token_ids``, logprobs from ``choices[0].logprobs.content[].logprob`` (an entry
    is None where the upstream sent a non-finite number, made null by the strict-JSON rule)."""
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
