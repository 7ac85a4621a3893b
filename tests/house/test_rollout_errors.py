"""Every exception class of rollout/ is a RolloutError, as well as what it was."""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
from pathlib import Path
from types import ModuleType

from rollout.errors import RolloutError

ROOT = Path(__file__).resolve().parents[2]


def rollout_files() -> tuple[list[str], list[Path]]:
    """(the modules of rollout/'s packages, the files of its plugin folders: not a package, loaded by path)."""
    names, plugins = [], []
    for path in sorted((ROOT / "rollout").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if "__pycache__" in rel:
            continue
        if (path.parent / "__init__.py").is_file():
            names.append(rel.removesuffix(".py").removesuffix("/__init__").replace("/", "."))
        else:
            plugins.append(path)
    return names, plugins


def not_rollout_errors(module: ModuleType) -> list[str]:
    """The public exception classes defined in ``module`` that are not RolloutErrors (a class named
    with a leading ``_`` is an internal signal that never reaches a caller)."""
    return [
        f"{module.__name__}.{name}"
        for name, cls in vars(module).items()
        if inspect.isclass(cls)
        and issubclass(cls, BaseException)
        and cls.__module__ == module.__name__
        and not name.startswith("_")
        and not issubclass(cls, RolloutError)
    ]


def importable(name: str) -> ModuleType | None:
    """The module, or None when it needs a third-party package that is not installed here (verl's
    agent loop needs verl, in its own venv); a missing module of ours fails the test."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] in {"rollout", "gateway", "store", "wire", "env"}:
            raise
        return None


def builtin_exception_classes(source: str) -> list[str]:
    """The public classes of a plugin file (read, never run) based directly on a builtin exception
    and not on RolloutError."""

    def builtin_exception(base: ast.expr) -> bool:
        found = getattr(builtins, base.id, None) if isinstance(base, ast.Name) else None
        return inspect.isclass(found) and issubclass(found, BaseException)

    return [
        node.name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ClassDef)
        and not node.name.startswith("_")
        and any(builtin_exception(b) for b in node.bases)
        and not any(isinstance(b, ast.Name) and b.id == "RolloutError" for b in node.bases)
    ]


def test_every_exception_class_of_rollout_is_a_rollout_error() -> None:
    modules, plugins = rollout_files()
    assert "rollout.core.setup" in modules and "rollout.contract.harness" in modules
    assert ROOT / "rollout" / "audit" / "reference" / "run.py" in plugins
    assert "rollout.train.trl_rollout" in modules
    bad = [name for m in modules if (module := importable(m)) for name in not_rollout_errors(module)]
    bad += [
        f"{p.relative_to(ROOT)}: {name}"
        for p in plugins
        for name in builtin_exception_classes(p.read_text(encoding="utf-8"))
    ]
    assert bad == []


def test_they_keep_their_builtin_bases() -> None:
    from rollout.core.envs import EnvConfigError
    from rollout.core.setup import SetupError
    from rollout.servers.feed.app import UnknownJob

    assert issubclass(SetupError, RuntimeError) and issubclass(EnvConfigError, ValueError)
    assert issubclass(UnknownJob, LookupError)


def test_the_check_sees_a_class_that_is_not_one() -> None:
    module = ModuleType("rollout.fake")
    exec(
        "class Broken(RuntimeError): pass\nclass Fine(RolloutError): pass\nclass _Signal(Exception): pass\n",
        {"__name__": "rollout.fake", "RolloutError": RolloutError},
        module.__dict__,
    )
    assert not_rollout_errors(module) == ["rollout.fake.Broken"]
    assert builtin_exception_classes(
        "class A(ValueError): pass\nclass B(RolloutError, OSError): pass\n"
        "class _C(Exception): pass\nclass D(B): pass\n"
    ) == ["A"]


def test_rollout_errors_imports_nothing_of_ours() -> None:
    source = (ROOT / "rollout" / "errors.py").read_text(encoding="utf-8")
    imports = [ln for ln in source.splitlines() if ln.startswith(("import ", "from "))]
    assert imports == ["from __future__ import annotations"]
