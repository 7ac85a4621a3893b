"""Share of a package's lines that are docstrings: ``python scripts/docstring_ratio.py gateway wire``.

A docstring line is a line of a bare string statement: the docstring of a module, class or
function, or an attribute docstring (a string right after an assignment). Total lines are all
lines of the package's ``.py`` files, blank ones included. ``--max 0.15`` exits 1 when a package
is above that share.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path


def docstring_lines(source: str) -> int:
    """The number of lines of ``source`` inside bare string statements."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return len(lines)


def package_ratio(root: Path) -> tuple[int, int]:
    """(docstring lines, total lines) over every ``.py`` file under ``root``."""
    doc = total = 0
    for path in sorted(root.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        doc += docstring_lines(source)
        total += len(source.splitlines())
    return doc, total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("packages", nargs="+", type=Path, help="package folders")
    parser.add_argument("--max", type=float, default=None, help="fail above this share (0-1)")
    args = parser.parse_args(argv)
    over = False
    for pkg in args.packages:
        if not pkg.is_dir():
            parser.error(f"{pkg}: not a folder")
        doc, total = package_ratio(pkg)
        ratio = doc / total if total else 0.0
        over = over or (args.max is not None and ratio > args.max)
        print(f"{pkg}: {doc}/{total} docstring lines = {ratio:.1%}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
