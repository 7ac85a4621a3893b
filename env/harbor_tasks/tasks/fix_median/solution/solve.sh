#!/bin/bash
# The reference fix: sort a copy, average the two middle values for an even length.
cat > stats.py <<'PY'
"""Small statistics helpers."""


def median(values):
    """The median of a non-empty list of numbers."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2
PY
