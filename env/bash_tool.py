"""The ``bash`` tool of the bash agent: one command with ``bash --noprofile --norc -c`` in the
workspace, in its own process group (a timeout kills all it started), without ``BASH_ENV``/``ENV``;
stdout and stderr interleaved, decoded as UTF-8 (docs/bash-agent.md)."""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass

# The OpenAI function-tool schema offered to the model.
BASH_TOOL_SPEC = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a bash command in the task workspace and return its output and exit code.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The bash command to run."}},
            "required": ["command"],
        },
    },
}


@dataclass(frozen=True)
class BashResult:
    """Outcome of one command: ``exit_code`` (None when killed at the timeout), the (possibly
    truncated) combined ``output`` and whether it ``timed_out``."""

    exit_code: int | None
    output: str
    timed_out: bool

    def render(self, timeout_s: float) -> str:
        """The text given back to the model as the tool message content."""
        status = (
            f"timed out after {timeout_s:g}s (killed)" if self.timed_out else f"exit code {self.exit_code}"
        )
        return f"[{status}]\n{self.output}"


def truncate_output(text: str, limit: int) -> str:
    """Keep at most ``limit`` characters of ``text``: its head and tail halves around a marker
    ``\\n[... N characters truncated ...]\\n`` (N = characters dropped). ``limit <= 0`` keeps all."""
    if limit <= 0 or len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    dropped = len(text) - head - tail
    return f"{text[:head]}\n[... {dropped} characters truncated ...]\n{text[len(text) - tail :]}"


_STARTUP_FILES = ("BASH_ENV", "ENV")


def command_env() -> dict[str, str]:
    """The environment a command runs with: this process's, without the variables that name a
    startup file for the shell to source."""
    return {k: v for k, v in os.environ.items() if k not in _STARTUP_FILES}


def run_bash(command: str, cwd: str, timeout_s: float = 20.0, output_limit: int = 8000) -> BashResult:
    """Run ``command`` in ``cwd`` (stdin closed, :func:`command_env`); at ``timeout_s`` the group is
    killed and the output so far returned with ``timed_out=True``. OSError only when bash cannot start."""
    proc = subprocess.Popen(
        ["bash", "--noprofile", "--norc", "-c", command],
        cwd=cwd,
        env=command_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    timed_out = False
    try:
        raw, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc.pid)
        # Children that left the group may still hold the pipe: bound the final read too.
        try:
            raw, _ = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raw = b""
    text = raw.decode("utf-8", errors="replace")
    return BashResult(None if timed_out else proc.returncode, truncate_output(text, output_limit), timed_out)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return
