"""The bash agent: a chat-completions loop that acts in a workspace through bash commands.

The model acts by native tool calls of one ``bash`` tool (protocol ``tools``), by one fenced
```` ```bash ```` (or ```` ```sh ````) block per reply (``text``: the convention mini-swe-agent
uses, for models without tool calling) or by either (``auto``: the tool is offered, both are
accepted). The loop ends when the model finishes, when the step budget is used, or on an API
error. ``run_agent`` is the loop; ``main`` is the CLI (``python -m env.bash_agent --help``), run
inside a session sandbox with ``OPENAI_BASE_URL`` pointing at the session URL. Behaviour, exit
codes and the summary line: docs/bash-agent.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, NoReturn

import openai

from env.bash_tool import BASH_TOOL_SPEC, BashResult, run_bash
from env.runtime_kit import DEFAULT_API_KEY, InfraErrorClass, chat_completion, infra_error_class

logger = logging.getLogger("env.bash_agent")

Protocol = Literal["auto", "tools", "text"]
PROTOCOLS: tuple[Protocol, ...] = ("auto", "tools", "text")
# A command whose output starts with this line ends the loop (the model's way to say "done").
SUBMIT_SENTINEL = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
# ```bash or ```sh, up to the next closing fence; the body is the command.
_BLOCK = re.compile(r"```(?:bash|sh)[ \t]*\r?\n(.*?)```", re.DOTALL)

TOOLS_SYSTEM_PROMPT = (
    "You are an agent solving a task in a Linux workspace (your current directory). You have one tool, "
    "`bash`, which runs a shell command there and returns its output and exit code; python3 is available. "
    "Inspect the files, compute the answer, and write it as JSON to the file the task names. When the file "
    "is written, reply with a short final message and no tool call."
)
TEXT_SYSTEM_PROMPT = (
    "You are an agent in a Linux workspace. To run a shell command, reply with exactly one ```bash code block "
    "holding the command. You will get its output back. When the task is done, reply with:\n"
    f"```bash\necho {SUBMIT_SENTINEL}\n```"
)
AUTO_SYSTEM_PROMPT = (
    "You are an agent solving a task in a Linux workspace (your current directory). Run shell commands "
    "there with the `bash` tool, or, if you cannot call tools, by replying with exactly one code block that "
    "starts with ```bash and holds the command. You will get the output and exit code back; python3 is "
    "available. Inspect the files, compute the answer, and write it as JSON to the file the task names. "
    f"When the file is written, reply with a short final message and no command, or run `echo {SUBMIT_SENTINEL}`."
)
SYSTEM_PROMPTS: dict[Protocol, str] = {
    "tools": TOOLS_SYSTEM_PROMPT,
    "text": TEXT_SYSTEM_PROMPT,
    "auto": AUTO_SYSTEM_PROMPT,
}

StopReason = Literal["answered", "submitted", "budget", "gateway_stop", "length", "error"]


@dataclass(frozen=True)
class LoopParams:
    """Loop settings: ``protocol``, seconds per bash call, characters of command output kept,
    tokens per completion, and model calls allowed when the step budget is unlimited."""

    protocol: Protocol = "tools"
    bash_timeout_s: float = 20.0
    output_limit_chars: int = 8000
    max_tokens: int = 512
    turn_cap: int = 50

    @classmethod
    def from_env_params(cls, env_params: dict[str, Any], default_protocol: Protocol = "tools") -> LoopParams:
        """Read ``protocol``, ``bash_timeout_s``, ``output_limit_chars``, ``max_tokens`` and
        ``turn_cap`` from an env's params, defaults for absent keys. Raises ValueError for an
        unknown protocol."""
        d = cls()
        return cls(
            protocol=parse_protocol(env_params.get("protocol", default_protocol)),
            bash_timeout_s=float(env_params.get("bash_timeout_s", d.bash_timeout_s)),
            output_limit_chars=int(env_params.get("output_limit_chars", d.output_limit_chars)),
            max_tokens=int(env_params.get("max_tokens", d.max_tokens)),
            turn_cap=int(env_params.get("turn_cap", d.turn_cap)),
        )


def parse_protocol(value: Any) -> Protocol:
    """``value`` as a protocol name; ValueError naming the choices otherwise."""
    for p in PROTOCOLS:
        if value == p:
            return p
    raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {value!r}")


@dataclass
class LoopOutcome:
    """What the loop did: model calls made (``steps``), commands run (``tool_calls``: native calls
    and fenced blocks), replies answered with a format error, why it stopped (``stop_reason``:
    answered | submitted | budget | gateway_stop | length | error), ``truncated``, the API error
    text and, when the API failure was the gateway's or the model server's, its class."""

    steps: int = 0
    tool_calls: int = 0
    format_errors: int = 0
    stop_reason: StopReason = "answered"
    truncated: bool = False
    error: str | None = None
    error_class: InfraErrorClass | None = None

    @property
    def finished(self) -> bool:
        """True when the model itself ended the loop (a final reply or the submit command)."""
        return self.stop_reason in ("answered", "submitted")


def execute_tool_call(name: str | None, arguments: Any, cwd: str, params: LoopParams) -> str:
    """Run one native tool call and return the tool message content (see ``run_tool_call``)."""
    result = run_tool_call(name, arguments, cwd, params)
    return result if isinstance(result, str) else result.render(params.bash_timeout_s)


def run_tool_call(name: str | None, arguments: Any, cwd: str, params: LoopParams) -> BashResult | str:
    """Run one native tool call: its ``BashResult``, or an ``error: ...`` string for the model to
    read when the tool name is unknown, the arguments are not a JSON object with a string
    ``command``, or bash cannot start. Never raises on bad input from the model."""
    if name != "bash":
        return f"error: unknown tool {name!r}; the only tool is 'bash'"
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError as exc:
            return (
                f'error: tool arguments are not valid JSON ({exc}); expected {{"command": "<bash command>"}}'
            )
    if not isinstance(arguments, dict) or not isinstance(arguments.get("command"), str):
        return 'error: tool arguments must be a JSON object {"command": "<bash command>"}'
    return _run(arguments["command"], cwd, params)


def _run(command: str, cwd: str, params: LoopParams) -> BashResult | str:
    try:
        return run_bash(command, cwd, params.bash_timeout_s, params.output_limit_chars)
    except OSError as exc:
        return f"error: could not start bash: {exc}"


def bash_blocks(text: str | None) -> list[str]:
    """The commands of every closed ```` ```bash ```` / ```` ```sh ```` block of ``text``, in order
    (an unclosed block, e.g. a reply cut at ``max_tokens``, does not count)."""
    return [m.group(1).rstrip("\n") for m in _BLOCK.finditer(text or "")]


def is_submit(result: BashResult | str) -> bool:
    """True when a command's output starts with the line ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``."""
    if not isinstance(result, BashResult) or result.timed_out:
        return False
    lines = result.output.lstrip().splitlines()
    return bool(lines) and lines[0].strip() == SUBMIT_SENTINEL


def observation(result: BashResult | str, timeout_s: float) -> str:
    """The user message that answers a fenced block: the exit code and the output in tags."""
    if isinstance(result, str):
        return f"<returncode>-1</returncode>\n<output>\n{result}\n</output>"
    code = "timeout" if result.timed_out else str(result.exit_code)
    note = f"(killed after {timeout_s:g}s)\n" if result.timed_out else ""
    return f"<returncode>{code}</returncode>\n<output>\n{note}{result.output}</output>"


def format_error(n_blocks: int) -> str:
    """The user message that answers a reply with zero or several fenced blocks."""
    found = "no ```bash block" if n_blocks == 0 else f"{n_blocks} ```bash blocks"
    return (
        f"Format error: your reply had {found}. Reply with exactly one ```bash block holding one command. "
        f"When the task is done, reply with:\n```bash\necho {SUBMIT_SENTINEL}\n```"
    )


def run_agent(
    client: openai.OpenAI,
    *,
    model: str,
    instruction: str,
    cwd: str,
    params: LoopParams,
    max_steps: int = -1,
    temperature: float | None = None,
) -> LoopOutcome:
    """Drive the conversation in ``cwd`` until the model finishes, ``max_steps`` model calls were
    made (-1: ``params.turn_cap``), the gateway sends its budget stop, or the API fails (the
    error is in the outcome, never raised).

    The model finishes by running a command that prints ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``
    first, or (``tools`` and ``auto``) by a reply with nothing to run. In ``text`` and ``auto``, a
    reply with exactly one fenced block runs it and sends the output back as a user message; in
    ``text`` a reply with none, and in both a reply with several, gets a format error back (the
    reply still counts as a step)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPTS[params.protocol]},
        {"role": "user", "content": instruction},
    ]
    extra: dict[str, Any] = {} if temperature is None else {"temperature": temperature}
    if params.protocol != "text":
        extra["tools"] = [BASH_TOOL_SPEC]
    budget = max_steps if max_steps >= 0 else params.turn_cap
    out = LoopOutcome()
    while True:
        if out.steps >= budget:
            out.stop_reason, out.truncated = "budget", True
            return out
        try:
            completion, gateway_stop = chat_completion(
                client, model=model, messages=messages, max_tokens=params.max_tokens, **extra
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
        content = choice.message.content
        logger.debug("step %d reply: %r", out.steps, content)
        calls = (
            []
            if params.protocol == "text"
            else [
                _tool_call_parts(c, out.tool_calls + i) for i, c in enumerate(choice.message.tool_calls or [])
            ]
        )
        messages.append(_assistant_message(content, calls))
        if calls:
            for call_id, name, arguments in calls:
                out.tool_calls += 1
                result = run_tool_call(name, arguments, cwd, params)
                logger.info("step %d: tool call %s -> %s", out.steps, _short(arguments), _status(result))
                if is_submit(result):
                    out.stop_reason = "submitted"
                    return out
                text = result if isinstance(result, str) else result.render(params.bash_timeout_s)
                messages.append({"role": "tool", "tool_call_id": call_id, "content": text})
            continue
        blocks = [] if params.protocol == "tools" else bash_blocks(content)
        if len(blocks) == 1:
            out.tool_calls += 1
            result = _run(blocks[0], cwd, params)
            logger.info("step %d: block %s -> %s", out.steps, _short(blocks[0]), _status(result))
            if is_submit(result):
                out.stop_reason = "submitted"
                return out
            messages.append({"role": "user", "content": observation(result, params.bash_timeout_s)})
            continue
        if not blocks and params.protocol != "text":
            out.truncated = choice.finish_reason == "length"
            out.stop_reason = "length" if out.truncated else "answered"
            return out
        out.format_errors += 1
        logger.info("step %d: format error (%d blocks)", out.steps, len(blocks))
        messages.append({"role": "user", "content": format_error(len(blocks))})


def _tool_call_parts(call: Any, n: int) -> tuple[str, str | None, Any]:
    """(id, function name, arguments) of an SDK tool call; ids are invented when the server sent none."""
    function = getattr(call, "function", None)
    call_id = getattr(call, "id", None) or f"call_{n}"
    if function is None:
        return call_id, getattr(call, "type", None), None
    return call_id, function.name, function.arguments


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


def _short(value: Any, limit: int = 120) -> str:
    text = _as_text(value) if value is not None else "null"
    return text if len(text) <= limit else text[:limit] + "..."


def _status(result: BashResult | str) -> str:
    if isinstance(result, str):
        return result
    return "timed out" if result.timed_out else f"exit code {result.exit_code}"


# ---- CLI -------------------------------------------------------------------------------------

EXIT_FINISHED = 0  # the model finished
EXIT_NOT_FINISHED = 1  # step budget used, gateway budget stop, or reply cut at max_tokens
EXIT_UNAVAILABLE = 2  # the gateway or the model server was unavailable
EXIT_API_ERROR = 3  # any other API error (e.g. a 400 or 401)
EXIT_USAGE = 64  # bad flags, unreadable instruction file, OPENAI_BASE_URL unset


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The CLI's flags (see the module docstring and docs/bash-agent.md)."""
    ap = _Parser(
        prog="python -m env.bash_agent",
        description="Run the bash agent in the current directory against OPENAI_BASE_URL.",
    )
    ap.add_argument("--model", required=True, help="the model (a gateway route key)")
    ap.add_argument("--instruction-file", required=True, type=Path, help="the task, as text")
    ap.add_argument("--max-steps", type=int, default=-1, help="model calls allowed (-1: up to --turn-cap)")
    ap.add_argument(
        "--temperature", type=float, default=None, help="sampling temperature (default: the server's)"
    )
    ap.add_argument("--max-tokens", type=int, default=512, help="tokens per completion (default 512)")
    ap.add_argument(
        "--protocol", choices=PROTOCOLS, default="auto", help="how the model runs commands (default auto)"
    )
    ap.add_argument("--bash-timeout", type=float, default=20.0, help="seconds per command (default 20)")
    ap.add_argument("--output-limit", type=int, default=8000, help="characters of output kept per command")
    ap.add_argument("--turn-cap", type=int, default=50, help="model calls allowed when --max-steps is -1")
    return ap


def exit_code(outcome: LoopOutcome) -> int:
    """The CLI's exit status for an outcome (constants ``EXIT_*``)."""
    if outcome.stop_reason == "error":
        return EXIT_UNAVAILABLE if outcome.error_class is not None else EXIT_API_ERROR
    return EXIT_FINISHED if outcome.finished else EXIT_NOT_FINISHED


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status. The last stdout line is one JSON object: the
    ``LoopOutcome`` fields plus ``finished`` and ``protocol``."""
    args = build_parser().parse_args(argv)
    level = os.environ.get("ROLLOUT_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(
        stream=sys.stderr,
        level=level if level in logging.getLevelNamesMapping() else "INFO",
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    base_url = os.environ.get("OPENAI_BASE_URL")
    if not base_url:
        print(
            "error: OPENAI_BASE_URL is not set (the session URL, e.g. http://127.0.0.1:41800/v1/sessions/<sid>)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        instruction = args.instruction_file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        print(f"error: cannot read --instruction-file {args.instruction_file}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    params = LoopParams(
        protocol=args.protocol,
        bash_timeout_s=args.bash_timeout,
        output_limit_chars=args.output_limit,
        max_tokens=args.max_tokens,
        turn_cap=args.turn_cap,
    )
    client = openai.OpenAI(
        base_url=base_url,
        api_key=os.environ.get("OPENAI_API_KEY") or DEFAULT_API_KEY,
        max_retries=2,
        timeout=600.0,
    )
    outcome = run_agent(
        client,
        model=args.model,
        instruction=instruction,
        cwd=os.getcwd(),
        params=params,
        max_steps=args.max_steps,
        temperature=args.temperature,
    )
    summary = {**asdict(outcome), "finished": outcome.finished, "protocol": params.protocol}
    print(json.dumps(summary), flush=True)
    return exit_code(outcome)


if __name__ == "__main__":
    sys.exit(main())
