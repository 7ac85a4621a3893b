"""Grading: the final workspace as data, the grader sandbox, verifiers (docs/grading.md)."""
