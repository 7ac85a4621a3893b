"""The layering rule of ``make lint`` (import-linter, ``[tool.importlinter]`` in pyproject.toml) holds
on the tree and fails when a lower layer of rollout/ imports a higher one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")
PACKAGES = ("rollout", "gateway", "store", "env", "wire")

pytestmark = pytest.mark.skipif(not LINT.is_file(), reason="import-linter is not installed (the dev extra)")


def _tree(tmp: Path) -> Path:
    """A copy of the project's packages (code only) and its pyproject.toml under ``tmp``."""
    for name in PACKAGES:
        if (ROOT / name).is_dir():
            shutil.copytree(
                ROOT / name,
                tmp / name,
                ignore=shutil.ignore_patterns("__pycache__", "data", "tasks", "static", "templates"),
            )
    shutil.copy(ROOT / "pyproject.toml", tmp / "pyproject.toml")
    return tmp


def _lint(cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run(
        [str(LINT), "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )


def test_the_tree_keeps_its_layers() -> None:
    out = _lint(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "rollout layers KEPT" in out.stdout


@pytest.mark.parametrize(
    ("lower", "higher"),
    [
        ("rollout/core/envs.py", "rollout.jobs.run"),
        ("rollout/contract/protocol.py", "rollout.core.envs"),
        ("rollout/sandbox/runner.py", "rollout.grading.evaluation"),
        ("rollout/grading/scoring.py", "rollout.results.report"),
        ("rollout/servers/feed/app.py", "rollout.cli.feed"),
    ],
)
def test_an_upward_import_breaks_the_lint(tmp_path: Path, lower: str, higher: str) -> None:
    tree = _tree(tmp_path)
    module = tree / lower
    module.write_text(module.read_text(encoding="utf-8") + f"\nimport {higher}  # upward\n", encoding="utf-8")
    out = _lint(tree)
    assert out.returncode != 0
    assert "rollout layers BROKEN" in out.stdout
    importer = lower.removesuffix(".py").replace("/", ".")
    assert f"{importer} -> {higher}" in out.stdout
