"""Bundled envs (an env is ``env/<name>/`` with ``env.yaml``, a runtime, its
data and ``rule_evaluator.py``), plus ``runtime_kit``, the small helper their runtimes share."""
