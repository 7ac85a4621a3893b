"""The top-level import contracts of pyproject.toml ([tool.importlinter]): each breaks on the
import it forbids, checked on a throwaway tree of packages (the real tree keeps every contract:
test_layers.py)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
PACKAGES = ("wire", "gateway", "store", "rollout", "env")

pytestmark = pytest.mark.skipif(
    not LINT_IMPORTS.is_file(), reason="import-linter is not installed (the dev extra)"
)


def lint_imports(cwd: Path, config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(config), "--no-cache"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    ("importer", "imported", "contract"),
    [
        ("wire", "gateway", "top-level-wire"),
        ("wire", "store", "top-level-wire"),
        ("wire", "rollout", "top-level-wire"),
        ("store", "gateway", "top-level-store"),
        ("store", "rollout", "top-level-store"),
        ("store", "fastapi", "top-level-store"),
        ("gateway", "rollout", "top-level-gateway"),
        ("gateway", "env", "top-level-gateway"),
    ],
)
def test_a_forbidden_import_breaks_its_contract(
    tmp_path: Path, importer: str, imported: str, contract: str
) -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    contracts = [c for c in config["contracts"] if str(c.get("id", "")).startswith("top-level-")]
    assert contract in {c["id"] for c in contracts}
    for pkg in PACKAGES:
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
        (tmp_path / pkg / "mod.py").write_text("")
    (tmp_path / importer / "mod.py").write_text(f"import {imported}\n")
    lines = [
        "[tool.importlinter]",
        f"root_packages = {list(PACKAGES)!r}".replace("'", '"'),
        "include_external_packages = true",
    ]
    for c in contracts:
        lines.append("[[tool.importlinter.contracts]]")
        lines += [f"{key} = {value!r}".replace("'", '"') for key, value in c.items()]
    (tmp_path / "pyproject.toml").write_text("\n".join(lines) + "\n")

    done = lint_imports(tmp_path, tmp_path / "pyproject.toml")

    assert done.returncode == 1, done.stdout + done.stderr
    broken = {c["id"] for c in contracts if f"{c['name']} BROKEN" in " ".join(done.stdout.split())}
    assert broken == {contract}, done.stdout
