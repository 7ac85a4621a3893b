"""What of the verifier's workspace copy would run before or instead of the task's tests: found
and removed from the copy, each listed with why (docs/verifiers.md).

The tests run with the workspace as the cwd, first on ``sys.path`` (``python -m pytest`` puts it
there, and tests import the agent's modules from it). So these are removed from the copy, unless
the file is byte for byte the one the session started with (``baseline``: the image's WORKDIR or
the task's files: not the agent's):

- Python start-up hooks anywhere: ``sitecustomize``/``usercustomize`` modules and ``.pth`` files;
- ``conftest.py`` anywhere (the task's own tests are at ``/tests``, never in the copy);
- ``pytest.py`` anywhere;
- at the copy's top level, a module that would shadow one the test tools import: a standard
  library module or ``pytest``, ``_pytest``, ``pluggy``, ``py``, ``iniconfig``, ``packaging``,
  ``tomli``, ``exceptiongroup``, ``colorama``, ``pygments`` (``NAME.py``, ``NAME.pyc``, an
  extension ``NAME.*.so``, a package's ``__init__``);
- executables named ``python``, ``python3``, ``python3.N``, ``pytest``, ``py.test``, ``bash`` or
  ``sh`` anywhere.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import sys
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
SHADOWED = (frozenset(sys.stdlib_module_names) | TOOL_MODULES) - {"test", "__main__"}
"""Module names a top-level file of the copy must not take (``test`` is a task's own name often)."""
_EXE = re.compile(r"^(python(\d+(\.\d+)?)?|pytest|py\.test|bash|sh)$")
_MODULE_SUFFIX = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(\.py|\.pyc|(\.[A-Za-z0-9_-]+)?\.so)$")


def why_stripped(rel: str, mode: int) -> str | None:
    """Why the copy's regular file at ``rel`` (``/``-separated) is removed, None to keep it."""
    parts = rel.split("/")
    name = parts[-1]
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
    if len(parts) == 1 and module in SHADOWED:
        return f"shadows the module {module} (the cwd is first on sys.path)"
    if len(parts) == 2 and parts[0] in SHADOWED and module == "__init__":
        return f"makes {parts[0]}/ a package shadowing the module {parts[0]} (the cwd is first on sys.path)"
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


def strip_hooks(copy: Path, baseline: Path | None = None) -> list[str]:
    """Remove from ``copy`` (a workspace copy: files and folders, no links) what the module
    docstring lists; ``"<relative path>: <why>"`` for each removed, sorted."""
    out: list[str] = []
    for parent, dirs, names in os.walk(copy):
        dirs.sort()
        for name in sorted(names):
            path = Path(parent) / name
            rel = path.relative_to(copy).as_posix()
            try:
                st = path.lstat()
            except OSError as e:
                log.warning("the workspace copy's %s cannot be read: %s", rel, e.strerror)
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            why = why_stripped(rel, st.st_mode)
            if why is None or _same(path, baseline, rel):
                continue
            path.unlink()
            out.append(f"{rel}: {why}")
    return sorted(out)
