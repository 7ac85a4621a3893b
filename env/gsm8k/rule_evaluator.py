"""Rule evaluator for the gsm8k env: 10 when the number of the model's last reply equals the number
after ``####`` in the case's ``answer`` (``numbers_equal``), else 0. Standard library only (loaded
by path); the runtime imports ``extract_answer`` so both sides read answers alike."""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any

# An optional sign and/or dollar sign, then either comma-grouped thousands or plain digits, then an
# optional fraction. "18." yields "18" (a sentence's full stop is not a decimal point).
_NUMBER_RE = re.compile(r"(?:-\$?|\$-?)?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|(?:-\$?|\$-?)?\.\d+")
_MARK = "####"
REL_TOL = 1e-6


def normalize_number(token: str) -> str | None:
    """Canonical text of a number token: ``"$1,234.50"`` -> ``"1234.50"``, ``"-$5"`` -> ``"-5"``,
    ``"18."`` -> ``"18"``. Returns None when ``token`` is not a number after stripping ``$``, ``,``
    and a trailing ``.``."""
    text = token.strip().replace("$", "").replace(",", "").rstrip(".")
    try:
        float(text)
    except ValueError:
        return None
    return text if math.isfinite(float(text)) else None


def _first_number(text: str) -> str | None:
    match = _NUMBER_RE.search(text)
    return normalize_number(match.group(0)) if match else None


def _last_number(text: str) -> str | None:
    matches = _NUMBER_RE.findall(text)
    return normalize_number(matches[-1]) if matches else None


def extract_answer(text: str | None) -> str | None:
    """The model's answer in ``text``: the first number after the last ``####`` if there is one,
    else the last number anywhere in the text; normalized by ``normalize_number``. None when the
    text holds no number."""
    if not text:
        return None
    if _MARK in text:
        found = _first_number(text.rsplit(_MARK, 1)[1])
        if found is not None:
            return found
    return _last_number(text)


def reference_answer(answer: str) -> str:
    """The normalized number after ``####`` in a GSM8K ``answer``; ValueError when there is none (a
    malformed case: an evaluator error, not a 0)."""
    if not isinstance(answer, str) or _MARK not in answer:
        raise ValueError(f"malformed gsm8k case: answer has no '{_MARK} <number>' line: {answer!r:.200}")
    found = _first_number(answer.rsplit(_MARK, 1)[1])
    if found is None:
        raise ValueError(f"malformed gsm8k case: no number after '{_MARK}': {answer!r:.200}")
    return found


def numbers_equal(a: str, b: str) -> bool:
    """Numeric equality of two normalized numbers: whole numbers exactly (a tolerance would accept
    1450001 for 1450000), others within ``REL_TOL``."""
    x, y = Decimal(a), Decimal(b)
    if x == x.to_integral_value() and y == y.to_integral_value():
        return x == y
    return math.isclose(float(x), float(y), rel_tol=REL_TOL)


def _model_answer(trajectory: Any) -> str | None:
    """The answer in the model's last reply as the gateway recorded it (``trajectory.final_response``).
    The runtime's result line (its ``metrics``) is never read: it is the agent's words, not the model's
    recorded answer."""
    return extract_answer(getattr(trajectory, "final_response", None) or "")


def evaluate(request: Any, spec: Any, trajectory: Any) -> dict[str, Any]:
    """Score one session: 10 or 0 with ``"expected N, got M"`` and artifacts; the model's answer is
    the recorded last reply, never the runtime's words. ValueError for a malformed case."""
    expected = reference_answer(request.env_params["dataset"]["answer"])
    got = _model_answer(trajectory)
    artifacts = {"expected": expected, "got": got, "source": "final_response" if got is not None else None}
    if got is None:
        steps = len(getattr(trajectory, "steps", None) or [])
        return {
            "score": 0,
            "reason": f"expected {expected}, got no number ({steps} steps)",
            "artifacts": artifacts,
        }
    score = 10 if numbers_equal(expected, got) else 0
    return {"score": score, "reason": f"expected {expected}, got {got}", "artifacts": artifacts}
