"""The ``claude-code`` harness: Anthropic's Claude Code CLI (npm ``@anthropic-ai/claude-code``)
run headless (``claude -p``), speaking Anthropic Messages over SSE to the session URL
(``ANTHROPIC_BASE_URL``; the CLI appends ``/v1/messages``). Offline: telemetry, error reports,
update checks and other non-essential traffic are off. Claude Code refuses
``--dangerously-skip-permissions`` as root, so the shell tool is allowed by name
(``--allowedTools Bash``); ``--model`` is the route key."""

from __future__ import annotations

from pathlib import Path

from rollout.harness import Harness, HarnessContext, HarnessLaunch, npm_install

PACKAGE = "@anthropic-ai/claude-code"
VERSION = "2.1.332"
BIN = "node_modules/.bin/claude"
OFFLINE_ENV = {
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_BUG_COMMAND": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1",
}


class ClaudeCode(Harness):
    """``claude -p INSTRUCTION --model ROUTE --allowedTools Bash --output-format json`` (its JSON
    result goes to the harness log). The gateway's step budget bounds the turns."""

    name = "claude-code"
    protocol = "anthropic_messages"
    version = VERSION

    def install(self, cache_dir: Path) -> None:
        npm_install(cache_dir, f"{PACKAGE}@{VERSION}", [str(cache_dir / BIN)])

    def launch(self, ctx: HarnessContext) -> HarnessLaunch:
        argv = [
            f"{ctx.install_dir}/{BIN}",
            "-p",
            ctx.instruction,
            "--model",
            ctx.model,
            "--allowedTools",
            "Bash",
            "--output-format",
            "json",
        ]
        env = {**OFFLINE_ENV, "ANTHROPIC_BASE_URL": ctx.session_url, "ANTHROPIC_API_KEY": ctx.api_key}
        return HarnessLaunch(argv=argv, env=env)


HARNESS = ClaudeCode()
