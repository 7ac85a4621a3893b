"""Checks the names of the project's code quoted in backticks in markdown (docs/testing.md, "The docs").

What is checked, and nothing else (so that shell commands, JSON keys, env var names and user-space
file names are left alone); "nearby" is the span's paragraph and the heading of its section:

- a dotted name rooted at one of ``DOTTED_ROOTS`` (``rollout.core.outcomes.classify``): the module imports
  and the attribute chain exists (``env.yaml``, a name and a file extension, is a file name);
- ``Class.attr`` where ``Class`` is a class that one module of ``CODE`` (or a helper module of
  ``tests/``) defines, or several and one of them is named nearby (``Store.trajectory``);
- a call of either, of such a class, or of a bare function whose module is named nearby in full
  (``Call.finish(end)``, ``Dropped(group_id, ...)``): every keyword and every bare-name argument
  is a parameter of the real signature, in its place; no more positional arguments than it takes;
  without ``...`` none of its required ones left out; a ``name: Type`` (or ``-> Type``) is its
  annotation;
- a path under ``PATH_ROOTS`` ending in ``/`` or a file extension, and the module of
  ``python -m module``: it exists;
- in a table with a ``file`` (or ``module``) column and a ``read`` (or ``names``) column, each
  name quoted in the second is in the module quoted in the first;
- a dotted name rooted at a table of the store (``job_environments.outcome``: the column exists;
  what follows is JSON) or at a top-level key of env.yaml or gateway.yaml (``runtime.timeout_s``:
  each key down to a free-form dict exists in ``CONFIG_MODELS``).

A name whose module fails to import for a missing third-party package is skipped, with the reason.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import types
import typing
from collections import defaultdict
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CODE = ("rollout", "gateway", "store", "wire", "env")
DOTTED_ROOTS = (*CODE, "tests")
CONFIG_MODELS = ("rollout.core.envs.EnvConfig", "gateway.settings.GatewaySettings")
"""env.yaml and gateway.yaml: a quoted key path of theirs (``runtime.timeout_s``) is checked."""
PATH_ROOTS = (*CODE, "attacks", "benchmarks", "configs", "docs", "examples", "harnesses", "scripts")
FILE_EXTENSIONS = frozenset(
    "py sh yaml yml json jsonl toml md txt log db sqlite parquet csv html js css cfg ini lock gz tar".split()
)
QUOTED = re.compile(r"(`+)(.+?)\1")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
PATH = re.compile("(?:" + "|".join(PATH_ROOTS) + r")/[\w./-]*")
RUN_MODULE = re.compile(r"(?:^|\s)-m\s+([A-Za-z_][\w.]*)")
QUALIFIER = re.compile(r"\b(?:[A-Za-z_]\w*\.)+(?=[A-Za-z_])")


@dataclass
class Report:
    """What one check found: ``problems`` fail it; ``skipped`` names could not be imported here."""

    checked: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


class _Skip(Exception):
    """The module of a name needs a third-party package that is not installed."""


class _Stale(Exception):
    """The name does not resolve."""


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for ``CODE`` and ``tests/``'s helper modules."""
    files = [p for pkg in CODE for p in sorted((ROOT / pkg).rglob("*.py")) if "__pycache__" not in p.parts]
    files += [
        p for p in sorted((ROOT / "tests").glob("*.py")) if not p.name.startswith(("test_", "conftest"))
    ]
    out = {}
    for path in files:
        rel = path.relative_to(ROOT).with_suffix("")
        out[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = path
    return out


@dataclass
class Index:
    """Where the short names are defined: ``classes`` (checked on any page), ``local`` (functions:
    checked only where the paragraph or its heading names their module in full)."""

    classes: dict[str, list[str]]
    local: dict[str, list[str]]


def build_index() -> Index:
    """The top-level classes and functions of every module of :func:`_modules` (read, not imported)."""
    classes: dict[str, list[str]] = defaultdict(list)
    local: dict[str, list[str]] = defaultdict(list)
    for module, path in _modules().items():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef):
                classes[node.name].append(module)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                local[node.name].append(module)
    return Index(dict(classes), dict(local))


def _named_in(module: str, text: str) -> bool:
    path = module.replace(".", "/")
    return (
        re.search(rf"(?<![\w/.]){re.escape(module)}(?![\w])|(?<![\w/]){re.escape(path)}(?:\.py|/)", text)
        is not None
    )


def quoted(text: str) -> list[str]:
    """The inline code spans of a markdown text."""
    return [m.group(2).strip() for m in QUOTED.finditer(text)]


def _import(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        missing = e.name or ""
        if missing.split(".")[0] in DOTTED_ROOTS:
            raise
        raise _Skip(f"{module} needs {missing!r}, not installed") from e


def _module_of(dotted: str) -> tuple[Any, list[str]]:
    """The longest importable module prefix of ``dotted`` and the attribute names after it."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        rel = Path(*parts[:i])
        if (ROOT / rel.with_suffix(".py")).is_file() or (ROOT / rel / "__init__.py").is_file():
            return _import(name), parts[i:]
    raise _Stale(f"no module {parts[0]}")


def _has(owner: Any, name: str) -> bool:
    if hasattr(owner, name):
        return True
    if not inspect.isclass(owner):
        return False
    for klass in owner.__mro__:
        fields = {
            *getattr(klass, "model_fields", {}),
            *getattr(klass, "__dataclass_fields__", {}),
            *vars(klass).get("__annotations__", {}),
            *vars(klass).get("__slots__", ()),
        }
        if name in fields or name in _assigned_on_self(klass):
            return True
    return False


def _assigned_on_self(klass: type) -> set[str]:
    """``self.x = ...`` in the class's own source: instance attributes ``getattr`` cannot see."""
    try:
        tree = ast.parse(inspect.getsource(klass).strip())
    except (OSError, TypeError, SyntaxError):
        return set()
    return {
        t.attr
        for node in ast.walk(tree)
        for t in _targets(node)
        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
    }


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return node.targets
    if isinstance(node, ast.AnnAssign | ast.AugAssign):
        return [node.target]
    return []


@dataclass
class _Target:
    obj: Any
    owner: Any = None
    attr: str = ""


def _field_type(klass: type, name: str) -> Any:
    """The class a field is annotated with (``Optional`` unwrapped), or None: a dict, a union."""
    try:
        hint = typing.get_type_hints(klass).get(name)
    except (NameError, TypeError, AttributeError):  # a hint under TYPE_CHECKING: the rest is unchecked
        return None
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if hint is not None and typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:
        hint = args[0]
    return hint if inspect.isclass(hint) and typing.get_origin(hint) is None else None


def _walk(obj: Any, attrs: list[str], what: str) -> _Target:
    target = _Target(obj)
    for attr in attrs:
        if target.obj is None:
            break  # the keys of a dict field, or an attribute of a value whose type is not known here
        if not _has(target.obj, attr):
            raise _Stale(f"{what}: no attribute {attr!r} on {getattr(target.obj, '__name__', target.obj)!r}")
        owner = target.obj
        value = getattr(owner, attr, None) if hasattr(owner, attr) else None
        if value is None and inspect.isclass(owner):
            value = _field_type(owner, attr)
        target = _Target(value, owner, attr)
    return target


def _chain(node: ast.expr) -> list[str] | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


class Checker:
    """Resolves the quoted names of markdown texts; ``index`` from :func:`build_index`."""

    def __init__(self, index: Index) -> None:
        self.index = index

    def check(self, text: str, where: str, report: Report) -> None:
        heading = ""
        for paragraph in re.split(r"\n\s*\n", FENCE.sub("", text)):
            if re.match(r"#{1,6} ", paragraph):
                heading = paragraph.strip().splitlines()[0]
            nearby = f"{heading}\n{paragraph}"
            checks = [(span, partial(self._check_span, span, nearby)) for span in quoted(paragraph)]
            checks += [
                (f"{path}: {name}", partial(_in_module, path, name)) for path, name in _table_reads(paragraph)
            ]
            for span, run in checks:
                try:
                    if run():
                        report.checked.append(f"{where}: `{span}`")
                except _Skip as e:
                    report.skipped.append(f"{where}: `{span}`: {e}")
                except (_Stale, ImportError) as e:
                    report.problems.append(f"{where}: `{span}`: {e}")

    def _check_span(self, span: str, text: str) -> bool:
        if (m := RUN_MODULE.search(span)) and m.group(1).split(".")[0] in CODE:
            rel = Path(*m.group(1).split("."))
            if not ((ROOT / rel.with_suffix(".py")).is_file() or (ROOT / rel / "__main__.py").is_file()):
                raise _Stale(f"no module {m.group(1)} to run")
            return True
        first = span.split()[0] if span.split() else ""
        if PATH.fullmatch(first) and not re.search(r"[<>*{}\[\]]", first):
            if not (first.endswith("/") or Path(first).suffix):
                return False
            if not (ROOT / first).exists():
                raise _Stale(f"{first} does not exist")
            return True
        return self._check_code(span, text)

    def _check_code(self, span: str, text: str) -> bool:
        expr: ast.AST | None
        try:
            expr = ast.parse(span, mode="eval").body
        except SyntaxError:
            expr = self._as_def(span)
        if expr is None:
            return False
        if isinstance(expr, ast.FunctionDef):
            target = self._resolve(expr.name, text)
            if target is None:
                return False
            self._check_params(target, expr, span)
            return True
        if isinstance(expr, ast.Call):
            target = self._resolve_callee(expr.func, text, span)
            if target is None:
                return False
            self._check_args(target, expr, span)
            return True
        chain = _chain(expr) if isinstance(expr, ast.Attribute) else None
        if chain is None or (
            len(chain) == 2 and chain[1] in FILE_EXTENSIONS and chain[0] not in self.index.classes
        ):
            return False
        return self._resolve(".".join(chain), text) is not None or _key_path(chain)

    @staticmethod
    def _as_def(span: str) -> ast.FunctionDef | None:
        m = re.fullmatch(r"([A-Za-z_][\w.]*)\((.*)\)\s*(->\s*.+)?", span)
        if not m:
            return None
        try:
            node = ast.parse(f"def _({m.group(2)}) {m.group(3) or ''}: ...").body[0]
        except SyntaxError:
            return None
        assert isinstance(node, ast.FunctionDef)
        node.name = m.group(1)
        return node

    def _resolve(self, dotted: str, text: str) -> _Target | None:
        parts = dotted.split(".")
        if parts[0] in DOTTED_ROOTS:
            module, attrs = _module_of(dotted)
            return _walk(module, attrs, dotted)
        if parts[0] in self.index.classes:
            return _walk(self._class(parts[0], text, dotted), parts[1:], dotted)
        named = [m for m in self.index.local.get(parts[0], []) if _named_in(m, text)]
        if len(parts) > 1 or len(named) != 1:
            return None
        return _walk(_import(named[0]), parts, dotted)

    def _class(self, name: str, text: str, what: str) -> Any:
        modules = self.index.classes[name]
        if len(modules) > 1:
            named = [m for m in modules if _named_in(m, text)]
            if len(named) != 1:
                raise _Stale(f"{what}: {name} is defined in {modules}; name its module nearby")
            modules = named
        return getattr(_import(modules[0]), name)

    def _resolve_callee(self, func: ast.expr, text: str, span: str) -> _Target | None:
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Call):
            inner = self._resolve_callee(func.value.func, text, span)
            if inner is None:
                return None
            self._check_args(inner, func.value, span)
            if not inspect.isclass(inner.obj):
                return None
            return _walk(inner.obj, [func.attr], span)
        chain = _chain(func)
        if chain is None:
            return None
        return self._resolve(".".join(chain), text)

    @staticmethod
    def _signature(target: _Target, span: str) -> inspect.Signature | None:
        """None where the arguments cannot be checked here: a value of unknown type (an instance
        attribute, a dict's key), or a callable without a signature (an exception class)."""
        if target.obj is None:
            return None
        if not callable(target.obj):
            raise _Stale(f"{target.attr or span} is not callable")
        try:
            sig = inspect.signature(target.obj)
        except (ValueError, TypeError):
            return None
        static = (
            inspect.getattr_static(target.owner, target.attr, None) if inspect.isclass(target.owner) else None
        )
        if inspect.isfunction(static) and sig.parameters:
            sig = sig.replace(parameters=list(sig.parameters.values())[1:])
        return sig

    def _check_args(self, target: _Target, call: ast.Call, span: str) -> None:
        sig = self._signature(target, span)
        if sig is None:
            return
        params = list(sig.parameters.values())
        var_pos = any(p.kind is p.VAR_POSITIONAL for p in params)
        var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
        names = {p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
        positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        elided = [i for i, a in enumerate(call.args) if _elides(a)]
        given = [a for a in call.args if not _elides(a)]
        if not elided and not var_pos and len(given) > len(positional):
            raise _Stale(f"{len(given)} positional arguments, the signature {sig} takes {len(positional)}")
        for i, arg in enumerate(call.args):
            if not isinstance(arg, ast.Name) or var_pos:
                continue
            if arg.id not in names:
                raise _Stale(f"no parameter {arg.id!r} in {sig}")
            if (not elided or i < elided[0]) and i < len(positional) and positional[i] != arg.id:
                raise _Stale(f"{arg.id!r} is not the argument number {i + 1} of {sig}")
        for kw in call.keywords:
            if kw.arg is not None and kw.arg not in names and not var_kw:
                raise _Stale(f"no parameter {kw.arg!r} in {sig}")
        if elided or any(kw.arg is None for kw in call.keywords):
            return
        passed = {*positional[: len(given)], *(kw.arg for kw in call.keywords)}
        required = [
            p.name for p in params if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        if missing := [n for n in required if n not in passed]:
            raise _Stale(f"leaves out {missing} of {sig} (write `...` where the quote leaves arguments out)")

    def _check_params(self, target: _Target, node: ast.FunctionDef, span: str) -> None:
        sig = self._signature(target, span)
        if sig is None:
            return
        quoted_args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
        for arg in quoted_args:
            param = sig.parameters.get(arg.arg)
            if param is None:
                raise _Stale(f"no parameter {arg.arg!r} in {sig}")
            if arg.annotation is not None and not _same(ast.unparse(arg.annotation), param.annotation):
                raise _Stale(f"{arg.arg} is {_text(param.annotation)!r}, not {ast.unparse(arg.annotation)!r}")
        if node.returns is not None and not _same(ast.unparse(node.returns), sig.return_annotation):
            raise _Stale(f"returns {_text(sig.return_annotation)!r}, not {ast.unparse(node.returns)!r}")


def _key_path(parts: list[str]) -> bool:
    """``table.column`` of the store (what follows is JSON), or a key path of a config file."""
    importlib.import_module("store.models")
    tables = importlib.import_module("sqlmodel").SQLModel.metadata.tables
    if parts[0] in tables:
        if parts[1] not in tables[parts[0]].c:
            raise _Stale(f"no column {parts[1]!r} in table {parts[0]}")
        return True
    roots = [_import(m.rsplit(".", 1)[0]) for m in CONFIG_MODELS]
    models = [getattr(r, m.rsplit(".", 1)[1]) for r, m in zip(roots, CONFIG_MODELS, strict=True)]
    mine = [m for m in models if parts[0] in _config_fields(m)]
    if not mine:
        return False
    if not any(_config_walk(m, parts) for m in mine):
        raise _Stale(f"no key {'.'.join(parts)} in {' or '.join(m.__name__ for m in mine)}")
    return True


def _config_fields(model: Any) -> dict[str, Any]:
    fields = getattr(model, "model_fields", {})
    return {**fields, **{f.alias: f for f in fields.values() if f.alias}}


def _config_walk(model: Any, parts: list[str]) -> bool:
    i = 0
    while i < len(parts) and model is not None:
        field_info = _config_fields(model).get(parts[i])
        if field_info is None:
            return False
        hint, model = field_info.annotation, None
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:
            hint, args = args[0], list(typing.get_args(args[0]))
        if typing.get_origin(hint) is dict and len(args) == 2 and _config_fields(args[1]):
            model, i = args[1], i + 1  # the next part is a key of the dict (``llm_routes.NAME``)
        elif inspect.isclass(hint) and _config_fields(hint):
            model = hint
        i += 1
    return True


def _table_reads(paragraph: str) -> list[tuple[str, str]]:
    """(module path, name) of a table with a ``file`` (or ``module``) column and a ``read`` (or
    ``names``) column: each name quoted in the second is in the module quoted in the first."""
    rows = [
        [c.strip() for c in line.strip().strip("|").split("|")]
        for line in paragraph.strip().splitlines()
        if line.lstrip().startswith("|")
    ]
    if len(rows) < 3:
        return []
    header = [c.lower() for c in rows[0]]
    files = [i for i, c in enumerate(header) if c in ("file", "module")]
    reads = [i for i, c in enumerate(header) if c in ("read", "names")]
    if not files or not reads:
        return []
    out = []
    for row in rows[2:]:
        if len(row) != len(header) or not (m := re.fullmatch(r"`([\w/]+\.py)`", row[files[0]])):
            continue
        out += [(m.group(1), name) for name in quoted(row[reads[0]])]
    return out


def _in_module(path: str, name: str) -> bool:
    if not (ROOT / path).is_file():
        raise _Stale(f"{path} does not exist")
    module, attrs = _module_of(".".join([*Path(path).with_suffix("").parts, name]))
    _walk(module, attrs, name)
    return True


def _elides(arg: ast.expr) -> bool:
    return isinstance(arg, ast.Starred) or (isinstance(arg, ast.Constant) and arg.value is ...)


def _text(annotation: Any) -> str:
    if annotation is inspect.Parameter.empty:
        return "(none)"
    return annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)


def _same(quoted_annotation: str, real: Any) -> bool:
    def norm(s: str) -> str:
        return QUALIFIER.sub("", re.sub(r"\s+", "", s.strip("'\"")))

    return norm(quoted_annotation) == norm(_text(real))


def check_markdown(files: list[Path]) -> Report:
    """Every checked name of ``files``, what is stale, what was skipped."""
    report = Report()
    checker = Checker(build_index())
    for path in files:
        checker.check(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)), report)
    return report
