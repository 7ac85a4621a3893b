"""The ``bash-agent`` harness: the project's own bash agent loop (``python -m env.bash_agent``),
native tool calls or the fenced-bash text protocol, over chat completions. Nothing to install:
it runs on the launcher's Python, which every sandbox sees."""

from __future__ import annotations

import sys

from rollout.harness import Harness, HarnessContext, HarnessLaunch


class BashAgent(Harness):
    """``python -m env.bash_agent --model ROUTE --instruction-file PATH ...`` in the workspace.
    Env params read: ``max_tokens``, ``protocol`` (auto | tools | text, default auto) and
    ``turn_cap`` (model calls when the session budget is unlimited)."""

    name = "bash-agent"
    protocol = "chat_completions"
    version = "1"
    unavailable_exit_codes = frozenset({2})  # the CLI's "gateway or model unavailable"

    def launch(self, ctx: HarnessContext) -> HarnessLaunch:
        instruction = f"{ctx.home}/instruction.md"
        max_steps = ctx.max_steps if ctx.max_steps >= 0 else ctx.params.get("turn_cap")
        argv = [sys.executable, "-m", "env.bash_agent", "--model", ctx.model, "--instruction-file", instruction,
                "--protocol", str(ctx.params.get("protocol", "auto"))]
        if max_steps is not None:
            argv += ["--max-steps", str(int(max_steps))]
        if ctx.temperature is not None:
            argv += ["--temperature", str(ctx.temperature)]
        if ctx.params.get("max_tokens") is not None:
            argv += ["--max-tokens", str(int(ctx.params["max_tokens"]))]
        return HarnessLaunch(argv=argv, files={instruction: ctx.instruction},
                             env={"OPENAI_BASE_URL": ctx.session_url, "OPENAI_API_KEY": ctx.api_key})


HARNESS = BashAgent()
