"""rollout.grading.hooks on its own: which module names a workspace copy's top level may not take
in an image (its Python's modules, other Python versions' standard library names), and which it
may (the task's own project, installed by the image too). The verifier runs: test_verifier.py."""

from __future__ import annotations

from pathlib import Path

from rollout.grading.hooks import shadowed, strip_hooks

HOOK = "import os\nos._exit(0)\n"


def _image(root: Path) -> Path:
    """A root filesystem with a Python 3.12's library: a C extension in lib-dynload, a package
    and a module in site-packages (``mylib``: the task's project, installed from its WORKDIR)."""
    lib = root / "usr" / "local" / "lib" / "python3.12"
    (lib / "lib-dynload").mkdir(parents=True)
    (lib / "lib-dynload" / "_blake9.cpython-312-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")
    (lib / "site-packages" / "requests").mkdir(parents=True)
    (lib / "site-packages" / "requests" / "__init__.py").write_text("")
    (lib / "site-packages" / "mylib.py").write_text("def add(a, b):\n    return a - b\n")
    return root


def test_an_images_python_and_other_versions_names_are_guarded(tmp_path: Path) -> None:
    root = _image(tmp_path / "rootfs")
    names = shadowed(root)
    # 3.12's platform tries _wmi, its random imports _sha2: not names of the launcher's 3.11
    assert {"_wmi", "_sha2", "_blake9", "requests", "mylib", "json", "pytest"} <= names
    assert "utils" not in names and "semver" not in shadowed(Path("/"))


def test_the_tasks_own_project_stays_changed_and_an_installed_shadow_goes(tmp_path: Path) -> None:
    """The image installs the task's project (``pip install /app``) and the agent fixes
    ``/app/mylib.py``: its fix is the answer, never a hook; a ``requests`` it adds is one."""
    root = _image(tmp_path / "rootfs")
    baseline = tmp_path / "app"
    baseline.mkdir()
    (baseline / "mylib.py").write_text("def add(a, b):\n    return a - b\n")
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "mylib.py").write_text("def add(a, b):\n    return a + b\n")
    (copy / "requests.py").write_text(HOOK)
    (copy / "_wmi.py").write_text(HOOK)
    (copy / "_sha2.py").write_text(HOOK)
    assert strip_hooks(copy, baseline, root) == [
        "_sha2.py: shadows the module _sha2 (the cwd is first on sys.path)",
        "_wmi.py: shadows the module _wmi (the cwd is first on sys.path)",
        "requests.py: shadows the module requests (the cwd is first on sys.path)",
    ]
    assert sorted(p.name for p in copy.iterdir()) == ["mylib.py"]
