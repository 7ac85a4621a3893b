"""What of the verifier's workspace copy would run before or instead of the task's tests: found
and removed from the copy, each listed with why (docs/verifiers.md).

The tests run with the workspace as the cwd, first on ``sys.path`` (``python -m pytest`` puts it
there, and tests import the agent's modules from it). So these are removed from the copy, unless
the file is byte for byte the one the session started with (``baseline``: the image's WORKDIR or
the task's files: not the agent's):

- Python start-up hooks anywhere: ``sitecustomize``/``usercustomize`` modules and ``.pth`` files;
- ``conftest.py`` anywhere (the task's own tests are at ``/tests``, never in the copy);
- ``pytest.py`` anywhere;
- at the copy's top level, a module that would shadow one the tests or their tools import: a
  standard library module, ``pytest``, ``_pytest``, ``pluggy``, ``py``, ``iniconfig``,
  ``packaging``, ``tomli``, ``exceptiongroup``, ``colorama``, ``pygments``, every name pytest's
  start-up looks up, found or not (``tool_imports``), the standard library names of other
  Python versions (``OTHER_STDLIB``), and in an image any module its Python library folders
  install but the task's own (at the top of its WORKDIR) (``NAME.py``, ``NAME.pyc``, an
  extension ``NAME.*.so``, a package's ``__init__``), never a few names a project uses for its
  own (``GENERIC``);
- at the copy's top level, a distribution's ``entry_points.txt`` (``NAME.dist-info``,
  ``NAME.egg-info``: pytest and other tools load the plugins it names from ``sys.path``);
- in a git folder (one holding ``HEAD`` and ``objects/`` or ``commondir``, ``.git`` or another),
  its ``config``, ``config.worktree``, ``commondir``, ``gitdir`` and ``hooks/``: git runs the
  programs they name (``core.fsmonitor``, hooks) when a test script runs git in the workspace;
- executables named ``python``, ``python3``, ``python3.N``, ``pytest``, ``py.test``, ``bash`` or
  ``sh`` anywhere.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

TOOL_MODULES = frozenset(
    {
        "pytest",
        "_pytest",
        "pluggy",
        "py",
        "iniconfig",
        "packaging",
        "tomli",
        "exceptiongroup",
        "colorama",
        "pygments",
    }
)
GENERIC = frozenset(
    {"test", "tests", "__main__", "app", "main", "src", "lib", "utils", "util", "common", "helpers"}
    | {"docs", "doc", "examples", "example", "scripts", "tools", "build", "dist", "benchmarks", "setup"}
)
"""Names a project's own top-level modules often have, which a package may install by mistake too:
never taken as shadowing (an agent's ``utils.py`` stays)."""
OTHER_STDLIB = frozenset(
    {"_android_support", "_colorize", "_interpchannels", "_interpqueues", "_interpreters", "_ios_support"}
    | {"_opcode_metadata", "_pydatetime", "_pylong", "_pyrepl", "_sha2", "_suggestions", "_sysconfig", "_wmi"}
    | {"binhex", "annotationlib", "compression", "_zstd", "_remote_debugging"}
)
"""Standard library module names of other Python 3 versions than the launcher's (3.10 to 3.14):
an image's Python may look them up (3.12's ``platform`` tries ``_wmi``, its ``random``
``_sha2``), found in the cwd first when the image has none."""
SHADOWED = (frozenset(sys.stdlib_module_names) | OTHER_STDLIB | TOOL_MODULES) - GENERIC
"""Module names a top-level file of the copy must not take, whatever the image installs."""
_EXE = re.compile(r"^(python(\d+(\.\d+)?)?|pytest|py\.test|bash|sh)$")
_MODULE_SUFFIX = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(\.py|\.pyc|(\.[A-Za-z0-9_-]+)?\.so)$")
_MODULE_DIR = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LIBRARIES = (
    "usr/lib/python3*",
    "usr/lib/python3*/lib-dynload",
    "usr/lib/python3*/*-packages",
    "usr/local/lib/python3*",
    "usr/local/lib/python3*/lib-dynload",
    "usr/local/lib/python3*/*-packages",
    "opt/*/lib/python3*/*-packages",
    "root/.local/lib/python3*/site-packages",
)
"""Where an image's Python keeps its modules, from its root."""
_GIT_FILES = ("config", "config.worktree", "commondir", "gitdir")
"""A git folder's files that name programs git runs, or another folder whose config it reads."""
_PROBE = """
import importlib.abc, sys
seen = set()
class Seen(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        seen.add(name.partition(".")[0])
sys.meta_path.insert(0, Seen())
import pytest
pytest.main(["-q", "--co", "-p", "no:cacheprovider", sys.argv[1]])
seen.update(n.partition(".")[0] for n in sys.modules)
open(sys.argv[2], "w").write("\\n".join(sorted(seen)))
"""
"""pytest's start-up (its plugins loaded, no test), recording every top-level module name looked up,
found or not (``from org.python.core import ...`` in ``copy``: a name the cwd could answer)."""


@functools.lru_cache(maxsize=1)
def tool_imports() -> frozenset[str]:
    """The top-level module names pytest's start-up looks up with the launcher's interpreter (the
    host tools' ``python3``), found or not, the ``GENERIC`` names left out; empty (and a warning)
    when pytest cannot start."""
    with tempfile.TemporaryDirectory(prefix="rollout-probe-") as d:
        names = Path(d) / "names"
        try:
            subprocess.run(
                [sys.executable, "-I", "-c", _PROBE, d, str(names)],
                cwd=d,
                capture_output=True,
                timeout=120,
                check=True,
                env={"PATH": os.environ.get("PATH", ""), "HOME": d},
            )
            found = names.read_text().split()
        except (OSError, subprocess.SubprocessError) as e:
            log.warning(
                "pytest's start-up imports are unknown (%s): only the listed tool modules are guarded", e
            )
            return frozenset()
    return frozenset(n for n in found if _MODULE_DIR.match(n)) - GENERIC


def _top_level_modules(folder: Path | None) -> frozenset[str]:
    """The module names ``folder``'s top level holds (``NAME.py``, ``.pyc``, ``.so``, a folder)."""
    try:
        entries = list(os.scandir(folder)) if folder is not None else []
    except OSError:
        return frozenset()
    found = (_MODULE_SUFFIX.match(e.name) for e in entries)
    folders = (e.name for e in entries if _MODULE_DIR.match(e.name) and e.is_dir(follow_symlinks=False))
    return frozenset(m[1] for m in found if m) | frozenset(folders)


@functools.lru_cache(maxsize=64)
def installed_modules(root: Path) -> frozenset[str]:
    """The top-level module names of the Python library folders under ``root`` (an image's root
    filesystem), the ``GENERIC`` names left out."""
    folders = (f for pattern in _LIBRARIES for f in root.glob(pattern))
    return frozenset[str]().union(*map(_top_level_modules, folders)) - GENERIC


def shadowed(root: Path | None, baseline: Path | None = None) -> frozenset[str]:
    """The module names a top-level file of the copy must not take when the tests run on ``root``:
    ``SHADOWED``, what pytest's start-up looks up, and for an image what its Python installs but
    the task's own modules (those at the top of ``baseline``: a project the image installs too,
    which the agent is to change). On the host: not the launcher's whole environment, whose many
    names an agent's own module may well have."""
    names = SHADOWED | tool_imports()
    if root is None or root == Path("/"):
        return names
    return names | (installed_modules(root) - _top_level_modules(baseline))


def why_stripped(
    rel: str, mode: int, guarded: frozenset[str] = SHADOWED, git: str | None = None
) -> str | None:
    """Why the copy's regular file at ``rel`` (``/``-separated) is removed, None to keep it;
    ``guarded``: the module names a top-level file must not take (:func:`shadowed`); ``git``: the
    relative path of the git folder ``rel`` is in (None: in none)."""
    parts = rel.split("/")
    name = parts[-1]
    if git is not None:
        inside = rel[len(git) + 1 :] if git else rel
        if inside in _GIT_FILES or inside.startswith("hooks/"):
            return "git's configuration or hooks (git runs the programs they name)"
    m = _MODULE_SUFFIX.match(name)
    module = m[1] if m else None
    if module in ("sitecustomize", "usercustomize") or (
        module == "__init__" and len(parts) > 1 and parts[-2] in ("sitecustomize", "usercustomize")
    ):
        return "a Python start-up hook"
    if name.endswith(".pth"):
        return "a .pth file (run by Python at start-up)"
    if name == "conftest.py":
        return "a conftest.py outside the task's tests"
    if module == "pytest":
        return "shadows pytest"
    if mode & 0o111 and _EXE.match(name):
        return f"an executable shadowing {name}"
    if len(parts) == 1 and module in guarded:
        return f"shadows the module {module} (the cwd is first on sys.path)"
    if len(parts) == 2 and parts[0] in guarded and module == "__init__":
        return f"makes {parts[0]}/ a package shadowing the module {parts[0]} (the cwd is first on sys.path)"
    if (
        len(parts) == 2
        and name == "entry_points.txt"
        and parts[0].lower().endswith((".dist-info", ".egg-info"))
    ):
        return "a distribution's entry points on sys.path (tools load the plugins they name)"
    return None


def _same(path: Path, baseline: Path | None, rel: str) -> bool:
    if baseline is None:
        return False
    try:
        theirs = baseline / rel
        if theirs.is_symlink() or not theirs.is_file() or theirs.stat().st_size != path.stat().st_size:
            return False
        return theirs.read_bytes() == path.read_bytes()
    except OSError:
        return False


def _git_folder(folder: Path) -> bool:
    """A git folder as git finds one: ``HEAD`` with ``objects/``, or with ``commondir`` (a
    worktree's, whose config is read from the folder that names)."""
    return (folder / "HEAD").is_file() and ((folder / "objects").is_dir() or (folder / "commondir").is_file())


def strip_hooks(copy: Path, baseline: Path | None = None, root: Path | None = None) -> list[str]:
    """Remove from ``copy`` (a workspace copy: files and folders, no links) what the module
    docstring lists; ``"<relative path>: <why>"`` for each removed, sorted. ``root``: the root
    filesystem the tests run on (an image's, or ``/``: :func:`shadowed`)."""
    guarded = shadowed(root, baseline)
    out: list[str] = []
    gits: dict[str, str | None] = {}  # a folder (relative) -> the innermost git folder it is in
    for parent, dirs, names in os.walk(copy):
        dirs.sort()
        here = Path(parent).relative_to(copy).as_posix()
        here = "" if here == "." else here
        gits[here] = (
            here if _git_folder(Path(parent)) else gits.get(here.rpartition("/")[0]) if here else None
        )
        for name in sorted(names):
            path = Path(parent) / name
            rel = f"{here}/{name}" if here else name
            try:
                st = path.lstat()
            except OSError as e:
                log.warning("the workspace copy's %s cannot be read: %s", rel, e.strerror)
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            why = why_stripped(rel, st.st_mode, guarded, gits[here])
            if why is None or _same(path, baseline, rel):
                continue
            path.unlink()
            out.append(f"{rel}: {why}")
    return sorted(out)
