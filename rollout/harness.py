"""The harness plugin API: an agent CLI run unmodified as a session's runtime.

A harness is a folder holding ``harness.py`` that defines ``HARNESS = <instance of a Harness
subclass>``. Bundled ones live in ``harnesses/<name>/`` at the project root (``--harness NAME``);
a user's own is given by its folder (``--harness PATH``). ``install`` runs once per machine into
a cached folder (``ensure_installed``: file lock + completion stamp), bound read-only into each
sandbox; ``launch`` says, inside the sandbox, how to start the CLI headless
(``rollout.harness_runtime`` runs it). Standard library and pydantic only: this module is
imported inside the sandbox. Details: docs/harnesses.md.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Protocol = Literal["chat_completions", "responses", "anthropic_messages"]
PROTOCOLS: tuple[str, ...] = ("chat_completions", "responses", "anthropic_messages")
HARNESS_FILE = "harness.py"
PROJECT_ROOT = Path(__file__).resolve().parents[1]
HARNESS_ROOT = PROJECT_ROOT / "harnesses"
"""Where bundled harnesses live: ``harnesses/<name>/harness.py``."""
CACHE_ENV = "ROLLOUT_HARNESS_CACHE"
SOLUTION_ENV = "ROLLOUT_SOLUTION_DIR"
"""The variable that names a task's reference solution folder to a harness that uses it."""
STAMP = ".rollout-installed"
"""The file ``ensure_installed`` writes into a cache folder once ``install`` succeeded."""
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class HarnessUnavailable(RuntimeError):
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
    harness whose ``uses_solution`` is true, else None)."""

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
    then bound read-only into its sandbox (never into any other harness's)."""

    name: str = ""
    protocol: Protocol = "chat_completions"
    version: str = "0"
    unavailable_exit_codes: frozenset[int] = frozenset()
    uses_solution: bool = False

    def install(self, cache_dir: Path) -> None:
        """Install once per machine into ``cache_dir`` (empty, owned by us). Raise
        HarnessUnavailable(reason) when it cannot be installed here."""

    def launch(self, ctx: HarnessContext) -> HarnessLaunch:
        """The command that runs the CLI headless for ``ctx`` (called inside the sandbox)."""
        raise NotImplementedError(f"harness {self.name!r} does not implement launch()")


class LoadedHarness(BaseModel):
    """A harness found and imported: its ``HARNESS`` instance and its folder (bound read-only
    into each sandbox, and imported again there by ``rollout.harness_runtime``)."""

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True)

    harness: Harness
    folder: Path

    @property
    def name(self) -> str:
        """The harness's name (what the ``harness`` column and the table show)."""
        return self.harness.name


def harness_folder(spec: str, root: Path = HARNESS_ROOT) -> Path:
    """The folder of ``spec``: a path (it contains a ``/`` or is an existing folder) as given,
    else the bundled ``<root>/<spec>/``. Raises HarnessUnavailable when it holds no
    ``harness.py`` (naming the bundled harnesses for an unknown name)."""
    as_path = Path(spec).expanduser()
    if "/" in spec or spec.startswith(".") or as_path.is_dir():
        folder = as_path.resolve()
        if not (folder / HARNESS_FILE).is_file():
            raise HarnessUnavailable(f"--harness {spec}: no {HARNESS_FILE} in {folder}")
        return folder
    if not _NAME.match(spec):
        raise HarnessUnavailable(f"--harness {spec!r}: not a harness name (letters, digits, - _ .) or a folder")
    folder = root / spec
    if not (folder / HARNESS_FILE).is_file():
        raise HarnessUnavailable(f"--harness {spec}: no such harness (bundled: {', '.join(bundled(root)) or 'none'}; "
                                 f"or give a folder holding a {HARNESS_FILE})")
    return folder


def bundled(root: Path = HARNESS_ROOT) -> list[str]:
    """Names of the harnesses in ``root`` (folders holding a ``harness.py``), sorted."""
    return sorted(p.parent.name for p in root.glob(f"*/{HARNESS_FILE}")) if root.is_dir() else []


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
        raise HarnessUnavailable(f"{path}: defines no HARNESS = <instance of rollout.harness.Harness subclass> "
                                 f"(found {type(h).__name__})")
    if not _NAME.match(h.name or ""):
        raise HarnessUnavailable(f"{path}: HARNESS.name {h.name!r} must be letters, digits, - _ . (max 64)")
    if h.protocol not in PROTOCOLS:
        raise HarnessUnavailable(f"{path}: HARNESS.protocol {h.protocol!r} is not one of {', '.join(PROTOCOLS)}")
    if not _NAME.match(str(h.version)):
        raise HarnessUnavailable(f"{path}: HARNESS.version {h.version!r} must be letters, digits, - _ . (max 64)")
    return h


def load_harness(spec: str, root: Path = HARNESS_ROOT) -> LoadedHarness:
    """Find (``harness_folder``) and import (``load_harness_file``) the harness ``spec``.
    Raises HarnessUnavailable."""
    folder = harness_folder(spec, root)
    return LoadedHarness(harness=load_harness_file(folder / HARNESS_FILE), folder=folder)


def cache_root() -> Path:
    """The install cache: ``$ROLLOUT_HARNESS_CACHE``, else ``~/.cache/rollout-factory/harnesses``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "rollout-factory" / "harnesses"


def cache_dir(h: Harness, root: Path | None = None) -> Path:
    """The harness's install folder: ``<cache_root>/<name>-<version>/``."""
    return (root or cache_root()) / f"{h.name}-{h.version}"


def is_installed(h: Harness, root: Path | None = None) -> bool:
    """Whether the harness's install folder holds the completion stamp."""
    return (cache_dir(h, root) / STAMP).is_file()


def ensure_installed(h: Harness, root: Path | None = None) -> Path:
    """Install ``h`` into its cache folder unless a stamp says it is there; returns the folder.

    One install per machine: an exclusive ``flock`` on ``<name>-<version>.lock`` next to the
    folder serializes jobs (a second job waits, then finds the stamp and installs nothing). A
    folder without a stamp (an install that failed or was killed) is emptied first. When
    ``install`` raises, the folder is removed and no stamp is written, so the next job tries
    again; its error comes back as HarnessUnavailable."""
    folder = cache_dir(h, root)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f"{folder.name}.lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if (folder / STAMP).is_file():
                return folder
            if folder.exists():
                shutil.rmtree(folder)
            folder.mkdir()
            try:
                h.install(folder)
            except BaseException as e:
                shutil.rmtree(folder, ignore_errors=True)
                if isinstance(e, HarnessUnavailable):
                    raise
                if isinstance(e, Exception):
                    raise HarnessUnavailable(f"harness {h.name}: install failed: {type(e).__name__}: {e}") from e
                raise
            _make_readable(folder)
            (folder / STAMP).write_text(f"{h.name} {h.version}\n")
            return folder
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _make_readable(folder: Path) -> None:
    """Let the sandbox's user read (and run) what ``install`` wrote, whatever its umask."""
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in [*dirnames, *filenames]:
            p = Path(dirpath) / name
            with contextlib.suppress(OSError):
                if not p.is_symlink():
                    mode = p.stat().st_mode
                    os.chmod(p, mode | 0o444 | (0o111 if p.is_dir() or mode & 0o100 else 0))
    with contextlib.suppress(OSError):
        os.chmod(folder, folder.stat().st_mode | 0o555)


class InstalledHarness(BaseModel):
    """A harness ready for sessions (host side): its name, folder and install folder, and whether
    it uses the task's reference solution (``Harness.uses_solution``)."""

    model_config = ConfigDict(frozen=True)

    name: str
    folder: Path
    install_dir: Path
    uses_solution: bool = False

    def argv(self) -> list[str]:
        """The runtime command of its sessions: the wrapper ``rollout.harness_runtime``."""
        return [sys.executable, "-m", "rollout.harness_runtime", str(self.folder), str(self.install_dir)]


def install(loaded: LoadedHarness, root: Path | None = None) -> InstalledHarness:
    """``ensure_installed`` for a found harness. Raises HarnessUnavailable."""
    return InstalledHarness(name=loaded.name, folder=loaded.folder,
                            install_dir=ensure_installed(loaded.harness, root),
                            uses_solution=loaded.harness.uses_solution)


def npm_install(cache_dir: Path, spec: str, version_argv: list[str]) -> None:
    """For a plugin's ``install``: ``npm install --prefix cache_dir spec``, then check that
    ``version_argv + ["--version"]`` runs. Raises HarnessUnavailable (npm missing, the registry
    unreachable, the CLI broken), with npm's or the CLI's last output."""
    npm = shutil.which("npm")
    if npm is None:
        raise HarnessUnavailable(f"{spec} needs npm (Node.js), which is not installed: apt-get install npm")
    p = subprocess.run([npm, "install", "--prefix", str(cache_dir), "--no-audit", "--no-fund",
                        "--loglevel=error", spec], capture_output=True, text=True, timeout=900, check=False)
    if p.returncode != 0:
        raise HarnessUnavailable(f"npm install {spec} failed: {(p.stderr or p.stdout).strip()[-500:]}")
    try:
        v = subprocess.run([*version_argv, "--version"], capture_output=True, text=True, timeout=120, check=False)
    except OSError as e:
        raise HarnessUnavailable(f"{spec}: {version_argv} cannot be run: {e}") from e
    if v.returncode != 0:
        raise HarnessUnavailable(f"{spec}: --version failed: {(v.stderr or v.stdout).strip()[-500:]}")
