"""Runtime of the workspace env: a tool-calling agent loop with one ``bash`` tool.

The runtime's cwd is the session's temporary workspace (the task's ``files/`` copied in). The loop
sends the task instruction, runs every tool call of each assistant message and answers it with a
``tool`` message, and stops when the model answers without tool calls, when the step budget is used
(``request.max_steps``, or the gateway's budget stop), or on an API error. Params (``env_params``):
``bash_timeout_s`` (default 20), ``output_limit_chars`` (default 8000), ``max_tokens`` (default 512),
``turn_cap`` (model calls allowed when ``max_steps`` is -1, default 50).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai

from env.runtime_kit import InfraErrorClass, chat_completion, infra_error_class, openai_client, run_runtime
from env.workspace.bash_tool import BASH_TOOL_SPEC, run_bash
from rollout.protocol import SimulationStartRequest, SimulationStartResult

logger = logging.getLogger("env.workspace.runtime")

ANSWER_PATH = "outputs/answer.json"
SYSTEM_PROMPT = (
    "You are an agent solving a task in a Linux workspace (your current directory). You have one tool, "
    "`bash`, which runs a shell command there and returns its output and exit code; python3 is available. "
    "Inspect the files, compute the answer, and write it as JSON to the file the task names. When the file "
    "is written, reply with a short final message and no tool call."
)


@dataclass(frozen=True)
class LoopParams:
    """Loop settings from ``env_params``: seconds per bash call, characters of tool output kept,
    tokens per completion, and model calls allowed when the step budget is unlimited."""

    bash_timeout_s: float = 20.0
    output_limit_chars: int = 8000
    max_tokens: int = 512
    turn_cap: int = 50

    @classmethod
    def from_env_params(cls, env_params: dict[str, Any]) -> LoopParams:
        """Read the params, falling back to the defaults for absent keys."""
        d = cls()
        return cls(
            bash_timeout_s=float(env_params.get("bash_timeout_s", d.bash_timeout_s)),
            output_limit_chars=int(env_params.get("output_limit_chars", d.output_limit_chars)),
            max_tokens=int(env_params.get("max_tokens", d.max_tokens)),
            turn_cap=int(env_params.get("turn_cap", d.turn_cap)),
        )


@dataclass
class LoopOutcome:
    """What the loop did: model calls made (``steps``), tool calls run, why it stopped
    (answered | budget | gateway_stop | length | error), ``truncated``, the API error text and,
    when the API failure was the gateway's or the model server's, its class (``error_class``)."""

    steps: int = 0
    tool_calls: int = 0
    stop_reason: str = "answered"
    truncated: bool = False
    error: str | None = None
    error_class: InfraErrorClass | None = None


def execute_tool_call(name: str | None, arguments: Any, cwd: str, params: LoopParams) -> str:
    """Run one tool call and return the tool message content.

    Never raises on bad input from the model: an unknown tool name, arguments that are not a JSON
    object with a string ``command``, or bash failing to start all come back as an ``error: ...``
    string for the model to read.
    """
    if name != "bash":
        return f"error: unknown tool {name!r}; the only tool is 'bash'"
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError as exc:
            return f'error: tool arguments are not valid JSON ({exc}); expected {{"command": "<bash command>"}}'
    if not isinstance(arguments, dict) or not isinstance(arguments.get("command"), str):
        return 'error: tool arguments must be a JSON object {"command": "<bash command>"}'
    try:
        result = run_bash(arguments["command"], cwd, params.bash_timeout_s, params.output_limit_chars)
    except OSError as exc:
        return f"error: could not start bash: {exc}"
    return result.render(params.bash_timeout_s)


def _tool_call_parts(call: Any, n: int) -> tuple[str, str | None, Any]:
    """(id, function name, arguments) of an SDK tool call; ids are invented when the server sent none."""
    function = getattr(call, "function", None)
    call_id = getattr(call, "id", None) or f"call_{n}"
    if function is None:
        return call_id, getattr(call, "type", None), None
    return call_id, function.name, function.arguments


def run_agent(client: openai.OpenAI, req: SimulationStartRequest, cwd: str, params: LoopParams) -> LoopOutcome:
    """Drive the conversation until the model stops calling tools, the budget is used or the API fails."""
    instruction = str(req.env_params["dataset"]["instruction"])
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": instruction},
    ]
    extra: dict[str, Any] = {} if req.temperature is None else {"temperature": req.temperature}
    budget = req.max_steps if req.max_steps >= 0 else params.turn_cap
    out = LoopOutcome()
    while True:
        if out.steps >= budget:
            out.stop_reason, out.truncated = "budget", True
            return out
        try:
            completion, gateway_stop = chat_completion(
                client, model=req.model, messages=messages, tools=[BASH_TOOL_SPEC],
                max_tokens=params.max_tokens, **extra,
            )
        except openai.APIError as exc:
            out.stop_reason, out.error = "error", f"{type(exc).__name__}: {exc}"
            out.error_class = infra_error_class(exc)
            return out
        if gateway_stop is not None:
            out.stop_reason, out.truncated = "gateway_stop", True
            return out
        out.steps += 1
        if not completion.choices:
            out.stop_reason, out.error = "error", "APIError: completion has no choices"
            return out
        choice = completion.choices[0]
        calls = [_tool_call_parts(c, out.tool_calls + i) for i, c in enumerate(choice.message.tool_calls or [])]
        messages.append(_assistant_message(choice.message.content, calls))
        if not calls:
            out.truncated = choice.finish_reason == "length"
            out.stop_reason = "length" if out.truncated else "answered"
            return out
        for call_id, name, arguments in calls:
            out.tool_calls += 1
            content = execute_tool_call(name, arguments, cwd, params)
            messages.append({"role": "tool", "tool_call_id": call_id, "content": content})


def _assistant_message(content: str | None, calls: list[tuple[str, str | None, Any]]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content or ""}
    if calls:
        message["tool_calls"] = [
            {"id": cid, "type": "function", "function": {"name": name or "", "arguments": _as_text(args)}}
            for cid, name, args in calls
        ]
    return message


def _as_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def check_answer(workspace: Path) -> str | None:
    """None when ``outputs/answer.json`` exists and parses as JSON, else why not."""
    path = workspace / ANSWER_PATH
    try:
        json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"{ANSWER_PATH} is missing"
    except (OSError, ValueError) as exc:
        return f"{ANSWER_PATH} is unreadable or not JSON: {exc}"
    return None


def main(req: SimulationStartRequest) -> SimulationStartResult:
    """Run the agent in the cwd and report: succeeded when the answer file parses, else failed.

    Metrics: ``steps``, ``tool_calls``, ``answer_present``, ``stop_reason``.
    """
    workspace = Path.cwd()
    params = LoopParams.from_env_params(req.env_params)
    outcome = run_agent(openai_client(req), req, str(workspace), params)
    answer_error = check_answer(workspace)
    logger.info("session %s: %s after %d steps, answer: %s", req.session_id, outcome.stop_reason,
                outcome.steps, answer_error or "present")
    errors = [e for e in (outcome.error, answer_error) if e]
    return SimulationStartResult(
        session_id=req.session_id,
        status="succeeded" if answer_error is None else "failed",
        step_count=outcome.steps,
        terminated=outcome.stop_reason == "answered",
        truncated=outcome.truncated,
        error_text="; ".join(errors) or None,
        error_class=outcome.error_class if answer_error is not None else None,
        metrics={
            "steps": outcome.steps,
            "tool_calls": outcome.tool_calls,
            "answer_present": answer_error is None,
            "stop_reason": outcome.stop_reason,
        },
    )


if __name__ == "__main__":
    run_runtime(main)
