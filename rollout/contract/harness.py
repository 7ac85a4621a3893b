"""The harness plugin API: an agent CLI run unmodified as a session's runtime.

A harness is a folder holding ``harness.py`` that defines ``HARNESS = <instance of a Harness
subclass>``. ``install`` runs once per machine into a cached folder (``rollout.sandbox.harness_cache``),
bound read-only into each sandbox; ``launch`` says, inside the sandbox, how to start the CLI headless
(``rollout.contract.harness_runtime`` runs it). Standard library and pydantic only: this module is
imported inside the sandbox. Details: docs/harnesses.md.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rollout.errors import RolloutError

Protocol = Literal["chat_completions", "responses", "anthropic_messages"]
PROTOCOLS: tuple[str, ...] = ("chat_completions", "responses", "anthropic_messages")
HARNESS_FILE = "harness.py"
SOLUTION_ENV = "ROLLOUT_SOLUTION_DIR"
"""The variable that names a task's reference solution folder to a harness that uses it."""
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class HarnessUnavailable(RolloutError, RuntimeError):
    """The harness cannot be installed or run on this machine; the message says why (and how to
    fix it when known, e.g. a missing ``npm``)."""


class HarnessContext(BaseModel):
    """What ``Harness.launch`` gets, all as seen INSIDE the sandbox: the task's ``instruction``
    (instruction.md, nothing hidden), ``model`` (the route key the CLI must send), ``session_url``
    (``http://127.0.0.1:41800/v1/sessions/<sid>``: the OpenAI SDK's base_url; an Anthropic client
    uses the same, its SDK appends ``/v1/messages``), ``api_key`` (the gateway's key or a
    placeholder), ``workspace`` (the CLI's cwd), ``home`` (a private writable HOME, not in the
    workspace), ``install_dir`` (the cache folder, read-only), ``max_steps`` (the session's model
    calls, -1 unlimited), ``temperature`` (None: the route's default), ``params`` (the env's
    params) and ``solution_dir`` (a Harbor task's ``solution/``, bound read-only: only for a
    harness whose ``uses_solution`` is true, else None), ``case_id`` (the case, or task, it runs)
    and ``instruction_path`` (a read-only file holding the instruction; None when there is none)."""

    model_config = ConfigDict(extra="forbid")

    instruction: str
    model: str
    session_url: str
    api_key: str
    workspace: str
    home: str
    install_dir: str
    max_steps: int = -1
    temperature: float | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    solution_dir: str | None = None
    case_id: str | None = None
    instruction_path: str | None = None


class HarnessLaunch(BaseModel):
    """How to start the CLI: ``argv`` (run in the workspace), ``env`` (added to the sandbox's
    environment, ``HOME`` already set to ``ctx.home``), ``files`` (absolute path under ``home``
    or the workspace -> text, written before the start, e.g. a config file) and ``answer_path``
    (relative to the workspace: the JSON file read as the session's answer; None: the task has
    no answer file (a Harbor task, graded by its tests), the session succeeded when the CLI
    exited 0)."""

    model_config = ConfigDict(extra="forbid")

    argv: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    files: dict[str, str] = Field(default_factory=dict)
    answer_path: str | None = "outputs/answer.json"


class Harness:
    """Base class of a harness plugin. Subclasses set ``name``, ``protocol`` (what the CLI speaks
    to the gateway) and ``version`` (what ``install`` installs; part of the cache key), and
    implement ``launch``; ``install`` defaults to nothing to install.
    ``unavailable_exit_codes``: exit codes by which the CLI says the gateway or the model was
    unavailable (then, without an answer, the result claims ``upstream_unavailable``; the attempt is
    retried only when the gateway's record shows the outage, docs/outcomes.md).
    ``uses_solution``: the harness runs the task's reference solution (the ``oracle``), which is
    then bound read-only into its sandbox (never into any other harness's). ``calls_model``
    False: it never calls a model (the ``oracle``): a job whose every session runs such harnesses
    starts no managed model server.
    ``runtime``: a file of the harness folder that speaks the runtime contract itself (reads the
    start request on stdin, prints the result line): run as the session's runtime instead of the
    wrapper (``launch`` is not called), on any env, seeing what the env's own runtime sees (a
    scripted attack of ``launcher.py audit``, docs/audit.md)."""

    name: str = ""
    protocol: Protocol = "chat_completions"
    version: str = "0"
    unavailable_exit_codes: frozenset[int] = frozenset()
    uses_solution: bool = False
    calls_model: bool = True
    runtime: str | None = None

    def install(self, cache_dir: Path) -> None:
        """Install once per machine into ``cache_dir`` (empty, owned by us). Raise
        HarnessUnavailable(reason) when it cannot be installed here."""

    def launch(self, ctx: HarnessContext) -> HarnessLaunch:
        """The command that runs the CLI headless for ``ctx`` (called inside the sandbox)."""
        raise NotImplementedError(f"harness {self.name!r} does not implement launch()")


def load_harness_file(path: Path) -> Harness:
    """Import ``path`` (a ``harness.py``) under a unique module name and return its ``HARNESS``,
    checked: an instance of ``Harness`` with a valid name, protocol and version. Raises
    HarnessUnavailable naming the file and the problem."""
    path = path.resolve()
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:12]
    module_name = f"_rollout_harness_{re.sub(r'[^A-Za-z0-9]', '_', path.parent.name)}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise HarnessUnavailable(f"{path}: not importable as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look modules up there
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as e:
        sys.modules.pop(module_name, None)
        raise HarnessUnavailable(f"{path}: import failed: {type(e).__name__}: {e}") from e
    h = getattr(module, "HARNESS", None)
    if not isinstance(h, Harness):
        raise HarnessUnavailable(
            f"{path}: defines no HARNESS = <instance of rollout.harness.Harness subclass> "
            f"(found {type(h).__name__})"
        )
    if not NAME_PATTERN.match(h.name or ""):
        raise HarnessUnavailable(f"{path}: HARNESS.name {h.name!r} must be letters, digits, - _ . (max 64)")
    if h.protocol not in PROTOCOLS:
        raise HarnessUnavailable(
            f"{path}: HARNESS.protocol {h.protocol!r} is not one of {', '.join(PROTOCOLS)}"
        )
    if not NAME_PATTERN.match(str(h.version)):
        raise HarnessUnavailable(
            f"{path}: HARNESS.version {h.version!r} must be letters, digits, - _ . (max 64)"
        )
    if h.runtime is not None and (
        Path(h.runtime).is_absolute()
        or ".." in Path(h.runtime).parts
        or not (path.parent / h.runtime).is_file()
    ):
        raise HarnessUnavailable(
            f"{path}: HARNESS.runtime {h.runtime!r} must name a file of the harness folder"
        )
    return h


def npm_install(cache_dir: Path, spec: str, version_argv: list[str]) -> None:
    """For a plugin's ``install``: ``npm install --prefix cache_dir spec``, then check that
    ``version_argv + ["--version"]`` runs. Raises HarnessUnavailable (npm missing, the registry
    unreachable, the CLI broken), with npm's or the CLI's last output."""
    npm = shutil.which("npm")
    if npm is None:
        raise HarnessUnavailable(f"{spec} needs npm (Node.js), which is not installed: apt-get install npm")
    p = subprocess.run(
        [npm, "install", "--prefix", str(cache_dir), "--no-audit", "--no-fund", "--loglevel=error", spec],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if p.returncode != 0:
        raise HarnessUnavailable(f"npm install {spec} failed: {(p.stderr or p.stdout).strip()[-500:]}")
    try:
        v = subprocess.run(
            [*version_argv, "--version"], capture_output=True, text=True, timeout=120, check=False
        )
    except OSError as e:
        raise HarnessUnavailable(f"{spec}: {version_argv} cannot be run: {e}") from e
    if v.returncode != 0:
        raise HarnessUnavailable(f"{spec}: --version failed: {(v.stderr or v.stdout).strip()[-500:]}")
