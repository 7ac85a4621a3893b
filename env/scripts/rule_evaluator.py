"""Rule evaluator for the scripts env: ``outputs/answer.json`` against the case's hidden
``expected`` (the generator's answer, computed from the data before the agent ran; never read from
the workspace's data or script, which the agent can change). The workspace env's grading: every
expected key must match; 10 or 0."""

from env.workspace.rule_evaluator import evaluate

__all__ = ["evaluate"]
