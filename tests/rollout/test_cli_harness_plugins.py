"""The harness plugins without their CLIs: what ``launch`` asks for
(argv, env, files) and how ``install`` fails where a tool is missing (their runs:
tests/test_harness_clis_e2e.py)."""

from __future__ import annotations

import json
import shutil
import tomllib
from pathlib import Path

import pytest

from rollout.contract.harness import HarnessContext, HarnessUnavailable
from rollout.sandbox.harness_cache import load_harness

CTX = HarnessContext(
    instruction="Do the task.\nCarefully.",
    model="route-x",
    session_url="http://127.0.0.1:41800/v1/sessions/s1",
    api_key="sk-gw",
    workspace="/workspace",
    home="/tmp/h",
    install_dir="/cache/x",
    max_steps=7,
    temperature=0.3,
    params={"max_tokens": 256},
)


def test_claude_code_launch() -> None:
    h = load_harness("claude-code").harness
    launch = h.launch(CTX)
    assert (h.name, h.protocol, h.version) == ("claude-code", "anthropic_messages", "2.1.332")
    assert launch.argv == [
        "/cache/x/node_modules/.bin/claude",
        "-p",
        CTX.instruction,
        "--model",
        "route-x",
        "--allowedTools",
        "Bash",
        "--output-format",
        "json",
    ]
    assert launch.env["ANTHROPIC_BASE_URL"] == CTX.session_url and launch.env["ANTHROPIC_API_KEY"] == "sk-gw"
    assert launch.env["DISABLE_TELEMETRY"] == launch.env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert launch.files == {} and launch.answer_path == "outputs/answer.json"


def test_codex_launch_writes_a_provider_config() -> None:
    h = load_harness("codex").harness
    launch = h.launch(CTX)
    assert (h.protocol, h.version) == ("responses", "0.171.0")
    assert launch.argv[1:] == [
        "/cache/x/node_modules/@openai/codex/bin/codex.js",
        "exec",
        "--strict-config",
        "--skip-git-repo-check",
        "--json",
        "--sandbox",
        "danger-full-access",
        "--model",
        "route-x",
        CTX.instruction,
    ]
    assert launch.env == {"CODEX_HOME": "/tmp/h/.codex", "ROLLOUT_GATEWAY_KEY": "sk-gw"}
    config = tomllib.loads(launch.files["/tmp/h/.codex/config.toml"])
    assert config["model"] == "route-x" and config["model_provider"] == "rollout"
    assert config["model_providers"]["rollout"] == {
        "name": "rollout gateway session",
        "base_url": CTX.session_url,
        "env_key": "ROLLOUT_GATEWAY_KEY",
        "wire_api": "responses",
        "request_max_retries": 0,
        "stream_max_retries": 0,
    }
    assert (config["check_for_update_on_startup"], config["analytics"], config["otel"]["exporter"]) == (
        False,
        {"enabled": False},
        "none",
    )


def test_mini_swe_agent_launch_text_and_tools_protocols() -> None:
    h = load_harness("mini-swe-agent").harness
    assert h.version.startswith("2.4.6-") and h.protocol == "chat_completions"
    launch = h.launch(CTX)
    assert launch.argv[:6] == [
        "/cache/x/venv/bin/python",
        "-m",
        "minisweagent.run.mini",
        "-y",
        "--exit-immediately",
        "-c",
    ]
    assert launch.argv[6] == "mini_textbased.yaml" and launch.argv[-2:] == ["-t", CTX.instruction]
    session = json.loads(launch.files["/tmp/h/rollout-session.yaml"])
    assert session["model"] == {
        "model_name": "openai/route-x",
        "model_class": "litellm_textbased",
        "cost_tracking": "ignore_errors",
        "model_kwargs": {
            "api_base": CTX.session_url,
            "api_key": "sk-gw",
            "drop_params": True,
            "temperature": 0.3,
            "max_tokens": 256,
        },
    }
    assert session["agent"]["step_limit"] == 7 and session["agent"]["mode"] == "yolo"
    assert launch.env["MSWEA_CONFIGURED"] == "true" and launch.env["MSWEA_COST_TRACKING"] == "ignore_errors"
    tools = h.launch(CTX.model_copy(update={"params": {"mswea_protocol": "tools"}}))
    assert tools.argv[6] == "mini.yaml"
    assert json.loads(tools.files["/tmp/h/rollout-session.yaml"])["model"]["model_class"] == "litellm"
    with pytest.raises(ValueError, match="mswea_protocol must be one of"):
        h.launch(CTX.model_copy(update={"params": {"mswea_protocol": "xml"}}))


@pytest.mark.parametrize("name", ["claude-code", "codex"])
def test_npm_harnesses_say_what_is_missing(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shutil, "which", lambda _cmd: None)
    with pytest.raises(HarnessUnavailable, match=r"apt-get install (npm|nodejs)"):
        load_harness(name).harness.install(tmp_path)


def test_bash_agent_takes_the_env_temperature_only_when_the_job_sets_none() -> None:
    h = load_harness("bash-agent").harness
    env_set = CTX.model_copy(update={"temperature": None, "params": {"temperature": 0.5, "protocol": "text"}})
    argv = h.launch(env_set).argv
    assert argv[argv.index("--temperature") + 1] == "0.5" and argv[argv.index("--protocol") + 1] == "text"
    both = CTX.model_copy(update={"params": {"temperature": 0.5}})  # the job's 0.3 wins
    argv = h.launch(both).argv
    assert argv[argv.index("--temperature") + 1] == "0.3"
    assert "--temperature" not in h.launch(CTX.model_copy(update={"temperature": None, "params": {}})).argv
