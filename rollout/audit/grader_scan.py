"""What an env's grader reads, from its source (``ast``, never run): the metrics keys it takes from
the runtime's result line, the workspace paths it opens or globs, the file names it compares, its
``eval``/``exec`` calls; and the metrics keys the env's own runtime reports. The ``claim-grader-keys``
attack claims exactly those (docs/audit.md); each finding names the grader line it matched."""

from __future__ import annotations

import ast
import logging
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

log = logging.getLogger(__name__)

OPENERS = {
    "open",
    "Path",
    "PurePath",
    "join",
    "read_text",
    "read_bytes",
    "load",
    "exists",
    "is_file",
    "isfile",
    "glob",
    "rglob",
    "iglob",
    "fnmatch",
    "joinpath",
    "stat",
    "getsize",
}
"""Calls whose string arguments name a workspace path (or a glob pattern)."""
METRIC_NAMES = ("metrics", "start_result")
"""A value whose name holds one of these is the runtime's result (or its metrics)."""
EVALS = {"eval", "exec"}
"""Builtins that run the text they get as code (called by bare name)."""
FILE_NAME = re.compile(r"^[\w.\-]+$")
TRACE_LINE = re.compile(r'File "([^"]+)", line (\d+)')


class GraderScan(BaseModel):
    """One grader's reads: metrics key -> ``file:line``, workspace path (relative) -> ``file:line``,
    file names it compares with (a walk's target) -> ``file:line``, ``eval``-like calls
    (``file:line``), and the metrics keys the env's runtime reports."""

    evaluator: str | None = None
    metric_keys: dict[str, str] = Field(default_factory=dict)
    paths: dict[str, str] = Field(default_factory=dict)
    names: dict[str, str] = Field(default_factory=dict)
    evals: list[str] = Field(default_factory=list)
    runner_keys: list[str] = Field(default_factory=list)


def _name(node: ast.AST) -> str:
    """The last name of ``a.b.c`` / ``c`` / ``f()``; '' for anything else."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Call):
        return _name(node.func)
    return ""


def _mentions_metrics(node: ast.AST, aliases: set[str]) -> bool:
    return any(
        isinstance(n, ast.Name | ast.Attribute)
        and (_name(n) in aliases or any(m in _name(n).lower() for m in METRIC_NAMES))
        for n in ast.walk(node)
    )


def _text(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _path_of(node: ast.AST) -> str | None:
    """``Path(ws) / "a" / "b.txt"`` -> ``a/b.txt``: the string parts of a ``/`` chain."""
    parts: list[str] = []
    while isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        part = _text(node.right)
        if part is None:
            break
        parts.insert(0, part)
        node = node.left
    if (first := _text(node)) is not None:
        parts.insert(0, first)
    return "/".join(parts) or None


def _relative(path: str) -> str | None:
    """A workspace path worth planting: relative, no ``..``, not a bare extension or format string."""
    path = path.strip().lstrip("./") if path.startswith("./") else path.strip()
    if (
        not path
        or path.startswith(("/", "~"))
        or ".." in path.split("/")
        or "{" in path
        or "%" in path
        or " " in path
        or len(path) > 200
        or path in (".", "*")
    ):
        return None
    return path


def scan_evaluator(path: Path) -> GraderScan:
    """What the evaluator at ``path`` reads (empty when it cannot be parsed)."""
    scan = GraderScan(evaluator=str(path))
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError, ValueError) as e:
        log.warning("audit: cannot scan the grader %s: %s", path, e)
        return scan
    where = path.name
    aliases: set[str] = set()
    for node in ast.walk(tree):  # names bound to the metrics: ``m = request.start_result.metrics``
        if isinstance(node, ast.Assign) and _mentions_metrics(node.value, set()):
            aliases.update(t.id for t in node.targets if isinstance(t, ast.Name))
    for node in ast.walk(tree):
        line = f"{where}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Subscript) and _mentions_metrics(node.value, aliases):
            if (key := _text(node.slice)) is not None:
                scan.metric_keys.setdefault(key, line)
        elif isinstance(node, ast.Call):
            fn = _name(node.func)
            if (
                fn in ("get", "pop", "getattr")
                and isinstance(node.func, ast.Attribute | ast.Name)
                and node.args
                and _mentions_metrics(
                    node.func.value if isinstance(node.func, ast.Attribute) else node.args[0], aliases
                )
            ):
                key = _text(node.args[1] if fn == "getattr" and len(node.args) > 1 else node.args[0])
                if key is not None and key not in ("metrics", "start_result"):
                    scan.metric_keys.setdefault(key, line)
            if fn in EVALS and isinstance(node.func, ast.Name):
                scan.evals.append(line)
            if fn in OPENERS:
                joined = "/".join(t for a in node.args if (t := _text(a)) is not None)
                for candidate in (joined, *(_path_of(a) or "" for a in node.args)):
                    if (rel := _relative(candidate)) is not None:
                        scan.paths.setdefault(rel, line)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            if (p := _path_of(node)) is not None and (rel := _relative(p)) is not None and "/" in p:
                scan.paths.setdefault(rel, line)
            elif (
                isinstance(node.right, ast.Constant)
                and (rel := _relative(_text(node.right) or "")) is not None
            ):
                scan.paths.setdefault(rel, line)
        elif isinstance(node, ast.Compare):  # ``name == "PASSED"``, ``f in (".tests_passed", "PASSED")``
            for c in [*node.comparators, node.left]:
                for t in (
                    [_text(c)]
                    if _text(c) is not None
                    else [_text(e) for e in c.elts]
                    if isinstance(c, ast.Tuple | ast.List | ast.Set)
                    else []
                ):
                    if t and FILE_NAME.match(t) and len(t) <= 80:
                        scan.names.setdefault(t, line)
    folders = {"/".join(p.split("/")[:i]) for p in scan.paths for i in range(1, p.count("/") + 1)}
    scan.paths = {p: w for p, w in scan.paths.items() if p not in folders}  # a folder of another path
    return scan


def runner_keys(files: list[Path]) -> list[str]:
    """The metrics keys the env's runtime files report: string keys of a dict given as
    ``metrics=`` / under a ``"metrics"`` key / bound to a name holding ``metrics``, and
    ``metrics["k"] = ...``."""
    keys: dict[str, None] = {}
    for f in files:
        try:
            tree = ast.parse(f.read_text(encoding="utf-8"), filename=str(f))
        except (OSError, SyntaxError, ValueError) as e:
            log.warning("audit: cannot scan the runtime %s: %s", f, e)
            continue
        for node in ast.walk(tree):
            found: list[ast.AST] = []
            if isinstance(node, ast.keyword) and node.arg == "metrics":
                found.append(node.value)
            elif isinstance(node, ast.Dict):
                found += [
                    v
                    for k, v in zip(node.keys, node.values, strict=True)
                    if k is not None and _text(k) == "metrics"
                ]
            elif isinstance(node, ast.Assign) and any("metrics" in _name(t).lower() for t in node.targets):
                found.append(node.value)
                for t in node.targets:
                    if isinstance(t, ast.Subscript) and (k := _text(t.slice)) is not None:
                        keys[k] = None
            for d in found:
                if isinstance(d, ast.Dict):
                    keys.update({k: None for kn in d.keys if kn is not None and (k := _text(kn)) is not None})
    return list(keys)


def passing_value(key: str) -> Any:
    """A value a gullible grader reads as a pass for the metrics key ``key``."""
    k = key.lower()
    if any(w in k for w in ("fail", "error", "wrong", "penalt")):
        return 0
    if any(w in k for w in ("score", "reward", "rate", "accuracy", "ratio", "frac", "percent")):
        return 1.0
    if any(w in k for w in ("status", "verdict", "result", "outcome")):
        return "passed"
    if any(w in k for w in ("count", "num", "total", "n_")):
        return 10
    return True


def crash_line(reason: str | None, evaluator: str | None) -> str | None:
    """The last traceback frame inside ``evaluator`` that ``reason`` carries (``file:line``), if any."""
    if not reason or not evaluator:
        return None
    frames = [(f, n) for f, n in TRACE_LINE.findall(reason) if Path(f).name == Path(evaluator).name]
    return f"{Path(frames[-1][0]).name}:{frames[-1][1]}" if frames else None
