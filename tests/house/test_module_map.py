"""docs/architecture.md's module map names every module of the code, and nothing that is gone."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gateway", "store", "rollout", "wire")
HEADER = re.compile(r"^([A-Za-z_][\w/]*/)(?:\s|$)")
ENTRY = re.compile(r"^  ([\w/]+(?:\.py|/))(?:\s|$)")


def module_map() -> dict[str, list[str]]:
    """The map's blocks: a folder written at column 0 (``rollout/jobs/``) -> its lines."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("## Module map", 1)[1].split("\n## ", 1)[0]
    blocks: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in section.splitlines():
        if line.startswith("```"):
            current = None
            continue
        header = HEADER.match(line)
        if header:
            current = blocks.setdefault(header.group(1), [])
        if current is not None:
            current.append(line)
    return blocks


def _named(blocks: dict[str, list[str]], module: Path) -> bool:
    rel = module.relative_to(ROOT)
    folder, name = f"{rel.parent.as_posix()}/", re.compile(rf"(?<![\w/]){re.escape(module.name)}\b")
    if any(name.search(line) for line in blocks.get(folder, [])):
        return True
    parent, sub = f"{rel.parent.parent.as_posix()}/", f"  {rel.parent.name}/"
    return any(line.startswith(sub) and name.search(line) for line in blocks.get(parent, []))


def test_every_module_is_in_the_module_map() -> None:
    blocks = module_map()
    modules = [
        p
        for pkg in PACKAGES
        if (ROOT / pkg).is_dir()
        for p in sorted((ROOT / pkg).rglob("*.py"))
        if p.name != "__init__.py" and "__pycache__" not in p.parts
    ]
    modules += sorted((ROOT / "env").glob("*.py"))
    missing = [str(p.relative_to(ROOT)) for p in modules if p.name != "__init__.py" and not _named(blocks, p)]
    assert not missing, f"modules missing from the module map of docs/architecture.md: {missing}"


def test_every_entry_of_the_module_map_exists() -> None:
    stale = [
        f"{folder}{m.group(1)}"
        for folder, lines in module_map().items()
        for line in lines
        if (m := ENTRY.match(line)) and "<" not in folder and not (ROOT / folder / m.group(1)).exists()
    ]
    assert not stale, f"the module map of docs/architecture.md names what is gone: {stale}"


def test_the_check_sees_a_missing_module() -> None:
    blocks = module_map()
    assert _named(blocks, ROOT / "rollout" / "jobs" / "attempt.py")
    assert not _named(blocks, ROOT / "rollout" / "jobs" / "no_such_module.py")
    assert not _named(
        {k: [ln.replace("attempt.py", "x.py") for ln in v] for k, v in blocks.items()},
        ROOT / "rollout" / "jobs" / "attempt.py",
    )
