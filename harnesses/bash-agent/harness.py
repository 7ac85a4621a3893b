"""The ``bash-agent`` harness: the project's own bash agent loop (``python -m env.bash_agent``),
native tool calls or the fenced-bash text protocol, over chat completions. Nothing to install:
it runs on the launcher's Python, which every sandbox sees."""

from __future__ import annotations

import sys

from rollout.harness import Harness, HarnessContext, HarnessLaunch


class BashAgent(Harness):
    """``python -m env.bash_agent --model ROUTE --instruction-file PATH ...`` in the workspace.
    Env params passed on when set: ``temperature`` (when the job sets none), ``protocol`` (auto |
    tools | text, default auto), ``max_tokens``, ``bash_timeout_s``, ``output_limit_chars`` and
    ``turn_cap`` (model calls when the session budget is unlimited)."""

    name = "bash-agent"
    protocol = "chat_completions"
    version = "1"
    unavailable_exit_codes = frozenset({2})  # the CLI's "gateway or model unavailable"
    _FLAGS = {
        "max_tokens": "--max-tokens",
        "bash_timeout_s": "--bash-timeout",
        "output_limit_chars": "--output-limit",
        "turn_cap": "--turn-cap",
    }

    def launch(self, ctx: HarnessContext) -> HarnessLaunch:
        instruction = f"{ctx.home}/instruction.md"
        argv = [
            sys.executable,
            "-m",
            "env.bash_agent",
            "--model",
            ctx.model,
            "--instruction-file",
            instruction,
            "--protocol",
            str(ctx.params.get("protocol", "auto")),
            "--max-steps",
            str(ctx.max_steps),
        ]
        temperature = ctx.temperature if ctx.temperature is not None else ctx.params.get("temperature")
        if temperature is not None:  # the job's, else the env's own ``temperature`` param
            argv += ["--temperature", str(temperature)]
        for key, flag in self._FLAGS.items():
            if ctx.params.get(key) is not None:
                argv += [flag, str(ctx.params[key])]
        return HarnessLaunch(
            argv=argv,
            files={instruction: ctx.instruction},
            env={"OPENAI_BASE_URL": ctx.session_url, "OPENAI_API_KEY": ctx.api_key},
        )


HARNESS = BashAgent()
