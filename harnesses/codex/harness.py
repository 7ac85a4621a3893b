"""The ``codex`` harness: OpenAI's Codex CLI (npm ``@openai/codex``) run headless
(``codex exec --json``), speaking OpenAI Responses over SSE to the session URL through a custom
provider in a private ``CODEX_HOME/config.toml`` (``wire_api = "responses"``: this version has
no chat wire API). Offline: update checks, analytics, feedback and OpenTelemetry are off.
Codex's own ``workspace-write`` sandbox is bubblewrap too and cannot nest inside the session's
sandbox, so it runs with ``--sandbox danger-full-access``: the session's sandbox is the wall."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from rollout.harness import Harness, HarnessContext, HarnessLaunch, HarnessUnavailable, npm_install

PACKAGE = "@openai/codex"
VERSION = "0.171.0"
ENTRY = "node_modules/@openai/codex/bin/codex.js"
KEY_ENV = "ROLLOUT_GATEWAY_KEY"


def config_toml(ctx: HarnessContext) -> str:
    """The ``config.toml`` of one session: the route as the model, the session URL as the one
    provider (key from ``$ROLLOUT_GATEWAY_KEY``), no retries of its own (the gateway retries the
    upstream), nothing sent anywhere else."""
    lines = [
        f"model = {json.dumps(ctx.model)}",
        'model_provider = "rollout"',
        "check_for_update_on_startup = false",
        "",
        "[analytics]",
        "enabled = false",
        "",
        "[feedback]",
        "enabled = false",
        "",
        "[otel]",
        'exporter = "none"',
        "log_user_prompt = false",
        "",
        "[model_providers.rollout]",
        'name = "rollout gateway session"',
        f"base_url = {json.dumps(ctx.session_url)}",
        f'env_key = "{KEY_ENV}"',
        'wire_api = "responses"',
        "request_max_retries = 0",
        "stream_max_retries = 0",
    ]
    return "\n".join(lines) + "\n"


class Codex(Harness):
    """``codex exec --strict-config --skip-git-repo-check --json --sandbox danger-full-access
    INSTRUCTION`` with ``CODEX_HOME=$HOME/.codex`` (its JSONL events go to the harness log)."""

    name = "codex"
    protocol = "responses"
    version = VERSION

    def install(self, cache_dir: Path) -> None:
        node = shutil.which("node")
        if node is None:
            raise HarnessUnavailable(
                f"{PACKAGE} needs Node.js, which is not installed: apt-get install nodejs"
            )
        npm_install(cache_dir, f"{PACKAGE}@{VERSION}", [node, str(cache_dir / ENTRY)])

    def launch(self, ctx: HarnessContext) -> HarnessLaunch:
        codex_home = f"{ctx.home}/.codex"
        node = shutil.which("node") or "node"
        argv = [
            node,
            f"{ctx.install_dir}/{ENTRY}",
            "exec",
            "--strict-config",
            "--skip-git-repo-check",
            "--json",
            "--sandbox",
            "danger-full-access",
            "--model",
            ctx.model,
            ctx.instruction,
        ]
        return HarnessLaunch(
            argv=argv,
            env={"CODEX_HOME": codex_home, KEY_ENV: ctx.api_key},
            files={f"{codex_home}/config.toml": config_toml(ctx)},
        )


HARNESS = Codex()
