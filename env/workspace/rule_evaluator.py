"""Rule evaluator for the workspace env: ``outputs/answer.json`` against the task's expected.json,
on the workspace's final state whatever the runtime reported. Standard library only. Matching
(``first_mismatch``): numbers within relative 1e-6 (never bool), strings after ``strip()``, bools
and null exactly, lists element-wise, dicts on every expected key (extra keys ignored)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

ANSWER_PATH = "outputs/answer.json"
REL_TOL = 1e-6
MAX_ANSWER_BYTES = 1024 * 1024
"""A larger answer file scores 0 unread (parsing a huge one could exceed the grader's memory)."""


def _show(value: Any) -> str:
    """``value`` as JSON for a reason, cut to 200 characters (``...`` for one nested too deeply to print)."""
    try:
        text = json.dumps(value)
    except (RecursionError, ValueError):
        return "..."
    return text if len(text) <= 200 else text[:199] + "…"


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def first_mismatch(expected: Any, actual: Any, path: str = "answer") -> str | None:
    """None when ``actual`` matches ``expected`` (rules in the module docstring), else a reason
    naming the first mismatched key path, e.g. ``"answer.totals.North: expected 12.5, got 12"``."""
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return f"{path}: expected an object, got {_show(actual)}"
        for key, value in expected.items():
            if key not in actual:
                return f"{path}.{key}: missing"
            found = first_mismatch(value, actual[key], f"{path}.{key}")
            if found:
                return found
        return None
    if isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            return f"{path}: expected {_show(expected)}, got {_show(actual)}"
        for i, (exp, act) in enumerate(zip(expected, actual, strict=True)):
            found = first_mismatch(exp, act, f"{path}[{i}]")
            if found:
                return found
        return None
    if _is_number(expected):
        ok = _is_number(actual) and math.isclose(expected, actual, rel_tol=REL_TOL)
    elif isinstance(expected, str):
        ok = isinstance(actual, str) and actual.strip() == expected.strip()
    else:  # bool or None
        ok = type(actual) is type(expected) and actual == expected
    return None if ok else f"{path}: expected {json.dumps(expected)}, got {json.dumps(actual)}"


def load_answer(workspace: str | None) -> tuple[Any, str | None]:
    """(answer, None) from ``<workspace>/outputs/answer.json``, or (None, reason) when there is no
    workspace, no file, a file over ``MAX_ANSWER_BYTES`` or nested too deeply to parse, or the
    file is not a JSON object."""
    if not workspace:
        return None, "no workspace to grade"
    path = Path(workspace) / ANSWER_PATH
    try:
        size = path.stat().st_size
        if size > MAX_ANSWER_BYTES:
            return None, f"{ANSWER_PATH} is too large ({size} bytes, over {MAX_ANSWER_BYTES})"
        answer = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, f"{ANSWER_PATH} is missing"
    except RecursionError:
        return None, f"{ANSWER_PATH} is nested too deeply"
    except (OSError, ValueError) as exc:
        return None, f"{ANSWER_PATH} is not valid JSON: {exc}"
    if not isinstance(answer, dict):
        return None, f"{ANSWER_PATH} is not a JSON object"
    return answer, None


def evaluate(request: Any, spec: Any, trajectory: Any) -> dict[str, Any]:
    """10 when every key of ``env_params["dataset"]["expected"]`` matches the answer file, else 0 with
    a reason (a missing or unparseable file too); KeyError when the row has no ``expected``."""
    expected = request.env_params["dataset"]["expected"]
    answer, problem = load_answer(getattr(request, "workspace", None))
    if problem:
        return {"score": 0, "reason": problem, "artifacts": {"answer": None}}
    mismatch = first_mismatch(expected, answer)
    if mismatch:
        return {"score": 0, "reason": f"mismatch at {mismatch}", "artifacts": {"answer": answer}}
    return {
        "score": 10,
        "reason": f"all {len(expected)} expected keys match",
        "artifacts": {"answer": answer},
    }
