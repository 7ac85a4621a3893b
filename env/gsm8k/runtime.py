"""Runtime of the gsm8k env: one chat completion per case through the gateway session
(``env_params["dataset"]["question"]``, param ``max_tokens`` 256); metrics ``extracted_answer``,
``completion_text``, ``finish_reason``."""

from __future__ import annotations

import logging
from typing import Any

from env.gsm8k.rule_evaluator import extract_answer
from env.runtime_kit import chat_completion, openai_client, run_runtime
from rollout.protocol import SimulationStartRequest, SimulationStartResult

logger = logging.getLogger("env.gsm8k.runtime")

SYSTEM_PROMPT = (
    "You are a careful math tutor. Solve the problem step by step, showing your reasoning briefly. "
    "End with a final line of the form '#### <number>' containing only the numeric answer."
)
DEFAULT_MAX_TOKENS = 256


def build_messages(question: str) -> list[dict[str, str]]:
    """The chat messages sent for one case: the system prompt, then the question as the user turn."""
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]


def completion_kwargs(req: SimulationStartRequest) -> dict[str, Any]:
    """Keyword arguments for ``chat.completions.create``: model, messages, max_tokens (param
    ``max_tokens``) and temperature (omitted when the request's temperature is None)."""
    kwargs: dict[str, Any] = {
        "model": req.model,
        "messages": build_messages(str(req.env_params["dataset"]["question"])),
        "max_tokens": int(req.env_params.get("max_tokens", DEFAULT_MAX_TOKENS)),
    }
    if req.temperature is not None:
        kwargs["temperature"] = req.temperature
    return kwargs


def main(req: SimulationStartRequest) -> SimulationStartResult:
    """Ask once; ``truncated`` when cut at ``max_tokens`` or stopped by the gateway's budget."""
    completion, stop_reason = chat_completion(openai_client(req), **completion_kwargs(req))
    choice = completion.choices[0] if completion.choices else None
    text = (choice.message.content if choice else None) or ""
    finish_reason = choice.finish_reason if choice else None
    answer = extract_answer(text)
    logger.info("session %s: finish_reason=%s extracted=%s", req.session_id, finish_reason, answer)
    truncated = finish_reason == "length" or stop_reason is not None
    return SimulationStartResult(
        session_id=req.session_id,
        status="succeeded",
        step_count=0 if stop_reason else 1,
        terminated=not truncated,
        truncated=truncated,
        metrics={
            "extracted_answer": answer,
            "completion_text": text,
            "finish_reason": finish_reason,
            "gateway_stop_reason": stop_reason,
        },
    )


if __name__ == "__main__":
    run_runtime(main)
