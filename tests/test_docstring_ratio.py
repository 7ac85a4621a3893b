"""scripts/docstring_ratio.py: which lines count as docstring lines, and its --max check."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "docstring_ratio.py"

SOURCE = '''"""Module docstring,
two lines."""

X = 1
"""An attribute docstring."""


class C:
    """One line."""

    def f(self) -> str:
        """Three
        lines
        here."""
        text = """not a docstring:
        an assigned string"""
        return text
'''


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_counts_module_class_function_and_attribute_docstrings_only(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "mod.py").write_text(SOURCE)
    (pkg / "empty.py").write_text("\n\n\n")

    done = run(str(pkg))

    assert done.returncode == 0, done.stderr
    # 2 + 1 + 1 + 3 docstring lines of 17 + 3 lines in all
    assert done.stdout.strip() == f"{pkg}: 7/20 docstring lines = 35.0%"


def test_max_fails_a_package_above_it(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "mod.py").write_text(SOURCE)

    # 7/17 = 41.2%
    assert run("--max", "0.42", str(pkg)).returncode == 0
    assert run("--max", "0.41", str(pkg)).returncode == 1
