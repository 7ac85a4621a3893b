"""The ``mini-swe-agent`` harness: the ``mini`` CLI (PyPI ``mini-swe-agent``) in a virtual
environment of its own in the install cache, speaking chat completions through LiteLLM
(``openai/<route>`` with ``api_base`` = the session URL). By default the text protocol
(``mini_textbased.yaml``: one fenced ``mswea_bash_command`` block per reply, so small models can
act); env param ``mswea_protocol: tools`` uses its bash tool calls (``mini.yaml``) instead.
Offline: no setup wizard (``MSWEA_CONFIGURED``), no cost lookups (``MSWEA_COST_TRACKING``,
LiteLLM's bundled cost map); it ends on ``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from rollout.harness import Harness, HarnessContext, HarnessLaunch, HarnessUnavailable

PACKAGE = "mini-swe-agent"
VERSION = "2.4.6"
# every package of its venv pinned (`pip freeze` of a working install), so each machine installs the
# same LiteLLM and openai SDK; the lock's hash is part of the version (the cache key)
CONSTRAINTS = Path(__file__).with_name("constraints.txt")
LOCK = hashlib.sha256(CONSTRAINTS.read_bytes()).hexdigest()[:8]
PYTHON = "venv/bin/python"
CONFIGS = {"text": "mini_textbased.yaml", "tools": "mini.yaml"}
MODEL_CLASSES = {"text": "litellm_textbased", "tools": "litellm"}


class MiniSweAgent(Harness):
    """``python -m minisweagent.run.mini -y --exit-immediately -c <builtin> -c <session yaml>
    -t INSTRUCTION``. Env params read: ``mswea_protocol`` (text | tools, default text),
    ``max_tokens``; the session's ``max_steps`` is its ``step_limit``."""

    name = "mini-swe-agent"
    protocol = "chat_completions"
    version = f"{VERSION}-{LOCK}"

    def install(self, cache_dir: Path) -> None:
        venv = cache_dir / "venv"
        steps = [
            [sys.executable, "-m", "venv", str(venv)],
            [
                str(cache_dir / PYTHON),
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--constraint",
                str(CONSTRAINTS),
                f"{PACKAGE}=={VERSION}",
            ],
            [str(cache_dir / PYTHON), "-c", "import minisweagent.run.mini"],
        ]
        for argv in steps:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=1800, check=False)
            if p.returncode != 0:
                raise HarnessUnavailable(
                    f"{PACKAGE}=={VERSION}: {' '.join(argv[:4])} failed: "
                    f"{(p.stderr or p.stdout).strip()[-500:]}"
                )

    def launch(self, ctx: HarnessContext) -> HarnessLaunch:
        mode = str(ctx.params.get("mswea_protocol", "text"))
        if mode not in CONFIGS:
            raise ValueError(f"mswea_protocol must be one of {sorted(CONFIGS)}, not {mode!r}")
        kwargs: dict[str, object] = {"api_base": ctx.session_url, "api_key": ctx.api_key, "drop_params": True}
        if ctx.temperature is not None:
            kwargs["temperature"] = ctx.temperature
        if ctx.params.get("max_tokens") is not None:
            kwargs["max_tokens"] = int(ctx.params["max_tokens"])
        session = {
            "agent": {
                "step_limit": max(ctx.max_steps, 0),
                "cost_limit": 0,
                "mode": "yolo",
                "confirm_exit": False,
            },
            "model": {
                "model_name": f"openai/{ctx.model}",
                "model_class": MODEL_CLASSES[mode],
                "cost_tracking": "ignore_errors",
                "model_kwargs": kwargs,
            },
        }
        config = f"{ctx.home}/rollout-session.yaml"  # JSON is YAML
        argv = [
            f"{ctx.install_dir}/{PYTHON}",
            "-m",
            "minisweagent.run.mini",
            "-y",
            "--exit-immediately",
            "-c",
            CONFIGS[mode],
            "-c",
            config,
            "-o",
            f"{ctx.home}/trajectory.json",
            "-t",
            ctx.instruction,
        ]
        env = {
            "MSWEA_CONFIGURED": "true",
            "MSWEA_COST_TRACKING": "ignore_errors",
            "MSWEA_SILENT_STARTUP": "1",
            "MSWEA_GLOBAL_CONFIG_DIR": f"{ctx.home}/.config/mini-swe-agent",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_TELEMETRY": "False",
            "NO_COLOR": "1",
        }
        return HarnessLaunch(argv=argv, env=env, files={config: json.dumps(session, indent=1)})


HARNESS = MiniSweAgent()
