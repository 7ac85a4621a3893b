"""The score rule (see docs/evaluation.md): turn an evaluator's
return value into a score.

``normalize_score(value)`` returns a ``ScoreCheck``: ``scored`` with a finite number clamped to
``SCORE_MIN``..``SCORE_MAX`` (0..10), or ``invalid_reward`` (score None) with why the value was
rejected. A dict result gives its score under the first of ``SCORE_KEYS`` present (Safactory's
order: ``normalized_score_10``, ``score``, ``reward``; all on the 0..10 scale), plus its ``reason``
and ``artifacts``; ``keys`` names every score key it carried. ``raw_repr`` keeps the ``repr`` of the whole value, cut to
``RAW_REPR_MAX_CHARS`` (``cut_text``). Nothing here raises, imports evaluators or runs them; what
is committed for an ``invalid_reward`` (score 0.0) is decided in ``rollout.grading.evaluation``. Stdlib only: the grader sandbox imports it.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from decimal import Decimal
from fractions import Fraction
from typing import Any, Literal

SCORE_MIN = 0.0
SCORE_MAX = 10.0
SCORE_KEYS: tuple[str, ...] = ("normalized_score_10", "score", "reward")
"""Keys read from a dict result, in this order (Safactory's); the first one present is the raw
score. Each is on the 0..10 scale: none is rescaled."""

RAW_REPR_MAX_CHARS = 1000
"""``raw_repr`` and ``reason`` are cut to this many characters (an evaluator may return a huge
string)."""


class ScoreCheck:
    """Result of ``normalize_score`` on one evaluator return value.

    - ``status``: ``scored`` (``score`` is a float in 0..10) or ``invalid_reward`` (``score`` is
      None: the raw value was not a finite number).
    - ``raw_repr``: ``repr`` of the raw value (the whole return value, dicts included), cut to
      ``RAW_REPR_MAX_CHARS``.
    - ``reason``: for ``scored`` the evaluator's own ``reason`` from a dict result (else None); for
      ``invalid_reward`` why the value was rejected.
    - ``artifacts``: the ``artifacts`` dict of a dict result, else None.
    - ``keys``: the ``SCORE_KEYS`` a dict result carried (more than one: the first won).
    """

    __slots__ = ("status", "score", "raw_repr", "reason", "artifacts", "keys")

    def __init__(
        self,
        status: Literal["scored", "invalid_reward"],
        score: float | None,
        raw_repr: str,
        reason: str | None = None,
        artifacts: dict[str, Any] | None = None,
        keys: tuple[str, ...] = (),
    ) -> None:
        self.status = status
        self.score = score
        self.raw_repr = raw_repr
        self.reason = reason
        self.artifacts = artifacts
        self.keys = keys


def cut_text(text: str) -> str:
    """``text`` cut to ``RAW_REPR_MAX_CHARS`` characters (ending in ``...`` when cut)."""
    if len(text) <= RAW_REPR_MAX_CHARS:
        return text
    return text[: RAW_REPR_MAX_CHARS - 3] + "..."


def _safe_repr(value: Any) -> str:
    try:
        return cut_text(repr(value))
    except Exception as exc:  # a user object whose __repr__ raises
        return f"<{type(value).__name__} with failing repr: {type(exc).__name__}>"


def _clamp(x: float) -> float:
    # x is known finite here; never called with NaN.
    if x < SCORE_MIN:
        return SCORE_MIN
    if x > SCORE_MAX:
        return SCORE_MAX
    return float(x)


def _number_to_score(value: Any) -> tuple[float | None, str | None]:
    """(score, None) for a finite number, (None, why) otherwise. Never raises."""
    type_name = type(value).__name__
    if value is None:
        return None, "evaluator returned None"
    if isinstance(value, bool) or (getattr(getattr(value, "dtype", None), "kind", None) == "b"):
        return None, f"a boolean ({type_name}) is not a score"
    if isinstance(value, str | bytes | bytearray):
        return None, f"a {type_name} is not a score (strings are never parsed)"
    if isinstance(value, Decimal):
        if not value.is_finite():
            return None, f"Decimal {value} is not finite"
        return _clamp(float(min(max(value, Decimal(0)), Decimal(10)))), None
    if isinstance(value, int):  # exact for ints too large for a float
        return float(min(max(value, 0), 10)), None
    if isinstance(value, Fraction):
        return float(min(max(value, Fraction(0)), Fraction(10))), None
    if isinstance(value, numbers.Complex) and not isinstance(value, numbers.Real):
        return None, f"a complex number ({type_name}) is not a score"
    if getattr(value, "ndim", 0) != 0:
        return None, f"an array ({type_name} with ndim={value.ndim}) is not a score"
    if isinstance(value, numbers.Real) or hasattr(type(value), "__float__"):
        try:
            x = float(value)
        except (TypeError, ValueError, OverflowError) as exc:
            return None, f"{type_name} cannot be converted to float: {type(exc).__name__}: {exc}"
        if math.isnan(x):
            return None, "NaN is not a score"
        if math.isinf(x):
            return None, f"{'+' if x > 0 else '-'}inf is not a score"
        return _clamp(x), None
    return None, f"a {type_name} is not a number"


def normalize_score(value: Any) -> ScoreCheck:
    """Apply the documented score rule to an evaluator's return value.

    Rule:
    - A number that is finite is cast to ``float`` and clamped to 0..10: ``int`` (exact, any size),
      ``float``, ``Fraction``, ``Decimal``, numpy scalars (via ``numbers.Real``, or any non-str,
      non-bool object with ``__float__`` and no array shape). Examples: -3 -> 0.0, 12.5 -> 10.0,
      numpy.float32(11) -> 10.0, 1e308 -> 10.0, Decimal("5") -> 5.0.
    - A dict (any ``Mapping``) uses the value of the first key present among
      ``normalized_score_10``, ``score``, ``reward`` (checked by the rule above; a nested dict is invalid) and
      keeps ``reason`` (as str) and ``artifacts`` (if it is a dict).
    - Invalid (``status="invalid_reward"``, ``score=None``): NaN, +inf, -inf, None, strings and
      bytes (even ``"7"``), booleans (Python and numpy), complex numbers, arrays, a dict with none of
      the keys, anything else.

    Clamping never sees NaN (``min(max(nan, 0), 10)`` would return NaN). ``raw_repr`` always keeps
    ``repr(value)`` (cut to ``RAW_REPR_MAX_CHARS``). Never raises.
    """
    raw_repr = _safe_repr(value)
    try:
        return _normalize(value, raw_repr)
    except Exception as exc:  # a hostile object (e.g. a Mapping whose .get raises)
        return ScoreCheck(
            status="invalid_reward",
            score=None,
            raw_repr=raw_repr,
            reason=f"cannot read the result: {type(exc).__name__}: {exc}",
        )


def _normalize(value: Any, raw_repr: str) -> ScoreCheck:
    if isinstance(value, Mapping):
        keys = tuple(k for k in SCORE_KEYS if k in value)
        present = keys[0] if keys else None
        reason_value = value.get("reason")
        own_reason = None if reason_value is None else cut_text(str(reason_value))
        artifacts_value = value.get("artifacts")
        artifacts = (
            {str(k): v for k, v in artifacts_value.items()} if isinstance(artifacts_value, Mapping) else None
        )
        if present is None:
            return ScoreCheck(
                status="invalid_reward",
                score=None,
                raw_repr=raw_repr,
                reason=f"dict result has none of the keys {', '.join(SCORE_KEYS)}",
                artifacts=artifacts,
            )
        inner = value[present]
        score: float | None
        why: str | None
        if isinstance(inner, Mapping):
            score, why = None, f"a nested dict under {present!r} is not a score"
        else:
            score, why = _number_to_score(inner)
        if score is None:
            return ScoreCheck(
                status="invalid_reward",
                score=None,
                raw_repr=raw_repr,
                reason=f"{present!r}: {why}",
                artifacts=artifacts,
                keys=keys,
            )
        return ScoreCheck(
            status="scored", score=score, raw_repr=raw_repr, reason=own_reason, artifacts=artifacts, keys=keys
        )

    score, why = _number_to_score(value)
    if score is None:
        return ScoreCheck(status="invalid_reward", score=None, raw_repr=raw_repr, reason=why)
    return ScoreCheck(status="scored", score=score, raw_repr=raw_repr)
