"""Finding and loading an env's evaluator (see docs/evaluation.md).

1. ``discover_evaluator(agent_root, env_name)`` gives ``<agent_root>/<env_name>/rule_evaluator.py``
   (``EVALUATOR_FILE_NAME``) or None; None means the env has no evaluation.
2. ``load_evaluator(path)`` imports the file under a unique module name and returns the evaluator
   callable (the first of ``EXPORT_NAMES``, Safactory's order: ``RuleEvaluator().evaluate``,
   ``evaluate_rule``, ``evaluate``), cached per (path, mtime, size); failures raise
   ``EvaluatorLoadError``. ``cached_evaluator(path)`` reads that cache without importing anything.
3. ``call_arguments(fn, request, spec, trajectory)``: the arguments to call it with, by keyword
   when its parameters take ``request``, ``spec`` and ``trajectory`` by name (Safactory calls
   ``evaluate_rule(*, request, spec, trajectory)`` so), else by position.

Loading is synchronous and has no timeout of its own: ``rollout.grading.evaluation`` runs a first load in a
daemon thread under the session's deadline. Nothing here runs an evaluator or scores its result. Light imports only: the grader sandbox
imports it for every evaluation.
"""

from __future__ import annotations

import importlib.util
import itertools
import sys
import threading
import zlib
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from rollout.errors import RolloutError

if TYPE_CHECKING:
    from rollout.core.envs import EnvConfig

EVALUATOR_FILE_NAME = "rule_evaluator.py"
"""The file an env drops into ``<agent_root>/<env_name>/`` to be evaluated."""

EXPORT_NAMES: tuple[str, ...] = ("RuleEvaluator", "evaluate_rule", "evaluate")
"""Names looked up in an evaluator module, in this order (Safactory's: a module with a class
``RuleEvaluator`` and a helper named ``evaluate`` is graded by the class)."""


class EvaluatorLoadError(RolloutError):
    """The evaluator file could not be imported, or exports none of ``EXPORT_NAMES`` as a
    callable (or ``RuleEvaluator()`` failed). The message names the file and, for import
    failures, the original exception as ``ExcType: message``."""


def discover_evaluator(agent_root: Path, env_name: str) -> Path | None:
    """Return ``<agent_root>/<env_name>/rule_evaluator.py`` if it is a regular file, else None.

    None means "no evaluation for this env" (not an error). The path is returned as given (not
    resolved); ``load_evaluator`` resolves it.
    """
    candidate = Path(agent_root) / env_name / EVALUATOR_FILE_NAME
    return candidate if candidate.is_file() else None


def evaluator_for(agent_root: Path, env_name: str, env_dir: Path | None = None) -> Path | None:
    """The evaluator a job uses for an env: ``<agent_root>/<env_name>/rule_evaluator.py``, else the
    one in the folder holding ``env_dir`` (an env given by ``--agent-config`` outside the agent
    root), else None (the env is not graded)."""
    found = discover_evaluator(agent_root, env_name)
    if found is None and env_dir is not None:
        found = discover_evaluator(env_dir.parent, env_name)
    return found


def env_evaluator(agent_root: Path, cfg: EnvConfig) -> Path | None:
    """The evaluator a job uses for ``cfg``: None for an env that says ``evaluation: none``, a
    ``--tasks`` env's own, else ``evaluator_for`` its name."""
    if cfg.evaluation == "none":
        return None
    if cfg.from_tasks_flag:
        return cfg.own_evaluator
    return evaluator_for(agent_root, cfg.name, cfg.env_dir)


class _CacheEntry:
    __slots__ = ("key", "fn", "module_name")

    def __init__(self, key: tuple[int, int], fn: Callable[..., Any], module_name: str) -> None:
        self.key = key
        self.fn = fn
        self.module_name = module_name


_cache: dict[Path, _CacheEntry] = {}
_cache_lock = threading.Lock()
_path_locks: dict[Path, threading.Lock] = {}
_module_counter = itertools.count(1)


def _file_key(path: Path) -> tuple[int, int]:
    st = path.stat()
    return (st.st_mtime_ns, st.st_size)


def cached_evaluator(path: Path) -> Callable[..., Any] | None:
    """The cached evaluator for ``path`` if the file is unchanged since it was loaded, else None.
    Never imports anything (cheap enough to call on the event loop)."""
    try:
        resolved = Path(path).resolve()
        key = _file_key(resolved)
    except OSError:
        return None
    with _cache_lock:
        entry = _cache.get(resolved)
    return entry.fn if entry is not None and entry.key == key else None


def _module_name_for(path: Path) -> str:
    digest = f"{zlib.crc32(str(path).encode('utf-8')):08x}"
    env_part = "".join(ch if ch.isalnum() else "_" for ch in path.parent.name)
    return f"_rollout_evaluator_{env_part}_{digest}_{next(_module_counter)}"


def _pick_callable(module: ModuleType, path: Path) -> Callable[..., Any]:
    for name in EXPORT_NAMES:
        if not hasattr(module, name):
            continue
        obj = getattr(module, name)
        if name == "RuleEvaluator":
            if not isinstance(obj, type):
                raise EvaluatorLoadError(f"{path}: RuleEvaluator is not a class ({type(obj).__name__})")
            try:
                instance = obj()
            except Exception as exc:
                raise EvaluatorLoadError(
                    f"{path}: RuleEvaluator() failed: {type(exc).__name__}: {exc}"
                ) from exc
            method = getattr(instance, "evaluate", None)
            if not callable(method):
                raise EvaluatorLoadError(f"{path}: RuleEvaluator has no callable 'evaluate' method")
            return method
        if not callable(obj):
            raise EvaluatorLoadError(f"{path}: '{name}' is not callable ({type(obj).__name__})")
        return obj
    raise EvaluatorLoadError(
        f"{path}: exports none of {', '.join(EXPORT_NAMES)} "
        "(define class RuleEvaluator with evaluate(request, spec, trajectory), evaluate_rule(...) or evaluate(...))"
    )


def load_evaluator(path: Path) -> Callable[..., Any]:
    """Import ``path`` and return its evaluator callable ``fn(request, spec, trajectory)``.

    Looks up, in order, class ``RuleEvaluator`` (instantiated once per load with no arguments; its
    bound ``evaluate`` is returned and shared by all the sessions of that env, so it must be safe
    to call from several threads), ``evaluate_rule``, ``evaluate``.

    The file is imported with ``importlib`` under a unique module name
    (``_rollout_evaluator_<dir>_<crc32(path)>_<n>``), so two envs' ``rule_evaluator.py`` never
    share a module; ``sys.path`` is not touched (an evaluator cannot import sibling files as
    top-level modules). The module is registered in ``sys.modules`` under that unique name only
    (dataclasses and pickling need it); a reload replaces the old entry. Results are cached per
    (resolved path, mtime_ns, size): editing the file reloads it. Failures are not cached.
    Thread-safe: concurrent first loads of one file import it once.

    Raises:
        EvaluatorLoadError: the file is missing or fails to import (message includes the original
            ``ExcType: message``), or it exports no usable callable.
    """
    resolved = Path(path).resolve()
    with _cache_lock:
        path_lock = _path_locks.setdefault(resolved, threading.Lock())
    with path_lock:
        try:
            key = _file_key(resolved)
        except OSError as exc:
            raise EvaluatorLoadError(
                f"{resolved}: cannot read evaluator: {type(exc).__name__}: {exc}"
            ) from exc
        with _cache_lock:
            entry = _cache.get(resolved)
        if entry is not None and entry.key == key:
            return entry.fn

        module_name = _module_name_for(resolved)
        spec = importlib.util.spec_from_file_location(module_name, resolved)
        if spec is None or spec.loader is None:
            raise EvaluatorLoadError(f"{resolved}: not importable as a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
            fn = _pick_callable(module, resolved)
        except EvaluatorLoadError:
            sys.modules.pop(module_name, None)
            raise
        except (Exception, SystemExit) as exc:  # SyntaxError, ImportError, sys.exit() at import, ...
            sys.modules.pop(module_name, None)
            raise EvaluatorLoadError(f"{resolved}: import failed: {type(exc).__name__}: {exc}") from exc

        with _cache_lock:
            old = _cache.get(resolved)
            _cache[resolved] = _CacheEntry(key, fn, module_name)
        if old is not None:
            sys.modules.pop(old.module_name, None)
        return fn


def call_arguments(
    fn: Callable[..., Any], request: Any, spec: Any, trajectory: Any
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``(args, kwargs)`` to call the evaluator ``fn`` with: by keyword when its signature takes
    ``request``, ``spec`` and ``trajectory`` by name (keyword-only parameters included), else by
    position (``def evaluate(req, spec, traj)``, ``*args``, a callable without a signature)."""
    import inspect  # noqa: PLC0415  (only here: the sandbox child imports this module for every evaluation)

    kwargs = {"request": request, "spec": spec, "trajectory": trajectory}
    try:
        inspect.signature(fn).bind(**kwargs)
    except (TypeError, ValueError):
        return (request, spec, trajectory), {}
    return (), kwargs
