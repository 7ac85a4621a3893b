"""The base of rollout/'s errors (it imports nothing of ours, so every layer may use it)."""

from __future__ import annotations

__all__ = ["RolloutError"]


class RolloutError(Exception):
    """An error of the rollout factory that a caller can act on: its message says what to fix."""
