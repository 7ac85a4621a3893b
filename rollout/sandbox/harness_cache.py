"""The launcher's side of harnesses: find a harness folder, import it, install it once per
machine into a cache folder (file lock + completion stamp). Details: docs/harnesses.md."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sys
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from rollout.contract.harness import (
    HARNESS_FILE,
    NAME_PATTERN,
    Harness,
    HarnessUnavailable,
    load_harness_file,
)

PROJECT_ROOT = Path(__file__).resolve().parents[2]
HARNESS_ROOT = PROJECT_ROOT / "harnesses"
"""Where bundled harnesses live: ``harnesses/<name>/harness.py``."""
CACHE_ENV = "ROLLOUT_HARNESS_CACHE"
STAMP = ".rollout-installed"
"""The file ``ensure_installed`` writes into a cache folder once ``install`` succeeded."""


class LoadedHarness(BaseModel):
    """A harness found and imported: its ``HARNESS`` instance and its folder (bound read-only
    into each sandbox, and imported again there by ``rollout.contract.harness_runtime``)."""

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
    if not NAME_PATTERN.match(spec):
        raise HarnessUnavailable(
            f"--harness {spec!r}: not a harness name (letters, digits, - _ .) or a folder"
        )
    folder = root / spec
    if not (folder / HARNESS_FILE).is_file():
        raise HarnessUnavailable(
            f"--harness {spec}: no such harness (bundled: {', '.join(bundled(root)) or 'none'}; "
            f"or give a folder holding a {HARNESS_FILE})"
        )
    return folder


def bundled(root: Path = HARNESS_ROOT) -> list[str]:
    """Names of the harnesses in ``root`` (folders holding a ``harness.py``), sorted."""
    return sorted(p.parent.name for p in root.glob(f"*/{HARNESS_FILE}")) if root.is_dir() else []


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
                    raise HarnessUnavailable(
                        f"harness {h.name}: install failed: {type(e).__name__}: {e}"
                    ) from e
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
    """A harness ready for sessions (host side): its name, folder and install folder, whether
    it uses the task's reference solution (``Harness.uses_solution``) and its own runtime file
    (``Harness.runtime``, None: the wrapper runs it)."""

    model_config = ConfigDict(frozen=True)

    name: str
    folder: Path
    install_dir: Path
    uses_solution: bool = False
    runtime: Path | None = None

    def argv(self) -> list[str]:
        """The runtime command of its sessions: the wrapper ``rollout.contract.harness_runtime``,
        or the harness's own runtime file."""
        if self.runtime is not None:
            return [sys.executable, str(self.runtime)]
        return [
            sys.executable,
            "-m",
            "rollout.contract.harness_runtime",
            str(self.folder),
            str(self.install_dir),
        ]


def install(loaded: LoadedHarness, root: Path | None = None) -> InstalledHarness:
    """``ensure_installed`` for a found harness. Raises HarnessUnavailable."""
    return InstalledHarness(
        name=loaded.name,
        folder=loaded.folder,
        install_dir=ensure_installed(loaded.harness, root),
        uses_solution=loaded.harness.uses_solution,
        runtime=loaded.folder / loaded.harness.runtime if loaded.harness.runtime else None,
    )
