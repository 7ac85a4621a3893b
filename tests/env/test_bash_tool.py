"""env/bash_tool.py and the bash agent's tool-call execution."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from env.bash_agent import LoopParams, execute_tool_call
from env.bash_tool import run_bash, truncate_output


def test_output_and_exit_code(tmp_path: Path) -> None:
    (tmp_path / "data.txt").write_text("a\nb\n")
    result = run_bash("wc -l < data.txt; echo oops >&2; exit 3", str(tmp_path))
    assert (result.exit_code, result.output, result.timed_out) == (3, "2\noops\n", False)
    assert result.render(20) == "[exit code 3]\n2\noops\n"


@pytest.fixture(autouse=True)
def _slow_login_profile(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """A HOME whose login profile is slow and loud, and a BASH_ENV file: a command must not see
    either (the host's own profile never matters to these tests)."""
    home = tmp_path_factory.mktemp("home")
    for name in (".bash_profile", ".profile", ".bashrc"):
        (home / name).write_text("echo PROFILE-RAN; sleep 30\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("BASH_ENV", str(home / ".bashrc"))


def test_no_login_profile_and_the_path_as_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "mytool").write_text("#!/bin/sh\necho from-my-tool\n")
    (tools / "mytool").chmod(0o755)
    monkeypatch.setenv(
        "PATH", f"{tools}:/usr/bin:/bin"
    )  # as the sandbox sets it: its interpreter's folder first
    result = run_bash('echo "$PATH"; mytool; echo "${BASH_ENV-unset}"', str(tmp_path), timeout_s=20)
    assert (result.exit_code, result.output) == (0, f"{tools}:/usr/bin:/bin\nfrom-my-tool\nunset\n")


def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    started = time.monotonic()
    result = run_bash(
        "echo before; (sleep 2; echo late > marker.txt) & sleep 30", str(tmp_path), timeout_s=0.5
    )
    elapsed = time.monotonic() - started
    assert (result.exit_code, result.output, result.timed_out) == (None, "before\n", True)
    assert elapsed < 25  # killed, not waited for (the command alone sleeps 30 s)
    assert result.render(0.5) == "[timed out after 0.5s (killed)]\nbefore\n"
    time.sleep(2.5)
    assert not (tmp_path / "marker.txt").exists()  # the background child died with the group


def test_output_is_truncated_to_the_limit(tmp_path: Path) -> None:
    result = run_bash("python3 -c \"print('x' * 50 + 'y' * 50, end='')\"", str(tmp_path), output_limit=20)
    assert result.output == "x" * 10 + "\n[... 80 characters truncated ...]\n" + "y" * 10


def test_truncate_output() -> None:
    assert truncate_output("abcdefghij", 4) == "ab\n[... 6 characters truncated ...]\nij"
    assert truncate_output("abcdefghij", 5) == "ab\n[... 5 characters truncated ...]\nhij"
    assert truncate_output("abc", 3) == "abc"
    assert truncate_output("abc", 0) == "abc"


def test_execute_tool_call_handles_bad_calls(tmp_path: Path) -> None:
    params = LoopParams()
    cwd = str(tmp_path)
    assert execute_tool_call("bash", '{"command": "echo hi"}', cwd, params) == "[exit code 0]\nhi\n"
    assert execute_tool_call("bash", {"command": "echo dict"}, cwd, params) == "[exit code 0]\ndict\n"
    assert execute_tool_call("python", '{"command": "ls"}', cwd, params) == (
        "error: unknown tool 'python'; the only tool is 'bash'"
    )
    assert execute_tool_call("bash", '{"command": "ls', cwd, params).startswith(
        "error: tool arguments are not valid JSON (Unterminated string"
    )
    assert execute_tool_call("bash", None, cwd, params) == (
        'error: tool arguments must be a JSON object {"command": "<bash command>"}'
    )
    assert execute_tool_call("bash", '{"cmd": "ls"}', cwd, params) == (
        'error: tool arguments must be a JSON object {"command": "<bash command>"}'
    )
    assert execute_tool_call("bash", '"ls"', cwd, params) == (
        'error: tool arguments must be a JSON object {"command": "<bash command>"}'
    )
