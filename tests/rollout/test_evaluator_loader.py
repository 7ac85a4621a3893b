"""Tests for rollout.grading.evaluator_loader: discovery, export names, load errors (also as
``run_evaluation`` outcomes), module naming and the load cache."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rollout.grading.evaluator_loader import (
    EvaluatorLoadError,
    discover_evaluator,
    evaluator_for,
    load_evaluator,
)
from tests.rollout.evaluator_helpers import FAST, evaluate_file, write_evaluator

pytestmark = pytest.mark.usefixtures("no_leaked_threads")


def test_discover_present_and_missing(tmp_path: Path) -> None:
    path = write_evaluator(tmp_path, "math", FAST)
    assert discover_evaluator(tmp_path, "math") == path
    assert discover_evaluator(tmp_path, "other") is None
    (tmp_path / "dironly" / "rule_evaluator.py").mkdir(parents=True)
    assert discover_evaluator(tmp_path, "dironly") is None  # a directory is not a file


def test_evaluator_for_prefers_the_agent_root_then_the_envs_own_folder(tmp_path: Path) -> None:
    root, elsewhere = tmp_path / "env", tmp_path / "mine"
    for folder in (root / "a", elsewhere / "a", elsewhere / "b"):
        folder.mkdir(parents=True)
        (folder / "rule_evaluator.py").write_text("def evaluate(*a): return 1\n")
    assert evaluator_for(root, "a", elsewhere / "a") == root / "a" / "rule_evaluator.py"
    assert evaluator_for(root, "b", elsewhere / "b") == elsewhere / "b" / "rule_evaluator.py"
    assert evaluator_for(root, "b") is None
    assert evaluator_for(root, "c", elsewhere / "c") is None


@pytest.mark.parametrize(
    "body, expected",
    [
        ("def evaluate(request, spec, trajectory):\n    return 7\n", 7.0),
        ("def evaluate_rule(request, spec, trajectory):\n    return 6\n", 6.0),
        (
            "class RuleEvaluator:\n"
            "    def __init__(self):\n        self.bonus = 1\n"
            "    def evaluate(self, request, spec, trajectory):\n        return 4 + self.bonus\n",
            5.0,
        ),
        # precedence (Safactory's): RuleEvaluator before evaluate_rule before evaluate
        (
            "def evaluate_rule(r, s, t):\n    return 1\n"
            "def evaluate(r, s, t):\n    return 2\n"
            "class RuleEvaluator:\n    def evaluate(self, r, s, t):\n        return 3\n",
            3.0,
        ),
        (
            "def evaluate_rule(r, s, t):\n    return 1\ndef evaluate(r, s, t):\n    return 2\n",
            1.0,
        ),
    ],
    ids=["evaluate", "evaluate_rule", "RuleEvaluator", "precedence-evaluate", "precedence-evaluate_rule"],
)
async def test_export_names(tmp_path: Path, body: str, expected: float) -> None:
    path = write_evaluator(tmp_path, "env", body)
    outcome = await evaluate_file(path)
    assert outcome.status == "scored"
    assert outcome.score == expected


async def test_module_with_no_export_is_an_error(tmp_path: Path) -> None:
    path = write_evaluator(tmp_path, "env", "def grade(r, s, t):\n    return 10\n")
    with pytest.raises(EvaluatorLoadError, match="exports none of RuleEvaluator, evaluate_rule, evaluate"):
        load_evaluator(path)
    outcome = await evaluate_file(path)
    assert outcome.status == "error"
    assert outcome.score == 0.0
    assert outcome.reason is not None and outcome.reason.startswith("EvaluatorLoadError: ")
    assert "exports none of" in outcome.reason


@pytest.mark.parametrize(
    "body, needle",
    [
        ("def evaluate(r, s, t)\n    return 1\n", "SyntaxError"),
        ("import no_such_module_for_rollout_tests\n", "ModuleNotFoundError: No module named"),
        ("raise RuntimeError('boom at import')\n", "RuntimeError: boom at import"),
        ("evaluate = 5\n", "'evaluate' is not callable"),
        (
            "class RuleEvaluator:\n    def __init__(self, x):\n        pass\n",
            "RuleEvaluator() failed: TypeError",
        ),
    ],
    ids=["syntax", "import", "raise-at-import", "not-callable", "ctor-args"],
)
async def test_load_errors_are_error_outcomes(tmp_path: Path, body: str, needle: str) -> None:
    path = write_evaluator(tmp_path, "env", body)
    with pytest.raises(EvaluatorLoadError) as info:
        load_evaluator(path)
    assert needle in str(info.value)
    outcome = await evaluate_file(path)
    assert outcome.status == "error"
    assert outcome.score == 0.0
    assert needle in (outcome.reason or "")


def test_same_file_name_in_two_envs_does_not_collide(tmp_path: Path) -> None:
    a = write_evaluator(tmp_path, "alpha", "NAME = 'alpha'\ndef evaluate(r, s, t):\n    return 1\n")
    b = write_evaluator(tmp_path, "beta", "NAME = 'beta'\ndef evaluate(r, s, t):\n    return 2\n")
    fa, fb = load_evaluator(a), load_evaluator(b)
    assert fa.__globals__["NAME"] == "alpha"
    assert fb.__globals__["NAME"] == "beta"
    assert fa.__module__ != fb.__module__
    assert "rule_evaluator" not in sys.modules


def test_cache_per_path_and_mtime(tmp_path: Path) -> None:
    path = write_evaluator(tmp_path, "env", "def evaluate(r, s, t):\n    return 1\n")
    first = load_evaluator(path)
    assert load_evaluator(path) is first
    old_module = first.__module__
    path.write_text("def evaluate(r, s, t):\n    return 2  # changed\n", encoding="utf-8")
    second = load_evaluator(path)
    assert second is not first
    assert second(None, None, None) == 2
    assert old_module not in sys.modules  # the replaced module is dropped
