"""Rule evaluator for the basics env: the workspace env's grading (``outputs/answer.json`` against the
task's expected.json, every expected key must match; 10 or 0, nothing in between)."""

from env.workspace.rule_evaluator import evaluate

__all__ = ["evaluate"]
