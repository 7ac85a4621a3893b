"""The viewer's query parameters: which each page takes, and their values read and checked (a bad
one is a 400 naming it)."""

from __future__ import annotations

import math

from starlette.exceptions import HTTPException
from starlette.requests import Request

from rollout.servers.listener import bad_query_param

PAGE_SIZE = 50
COMPARE_PAGE = 100
SEARCH_PAGE = 50
MAX_PAGE = 10**9

LIST_PARAMS = ("env", "case", "model", "status", "eval", "group", "score_min", "score_max", "sort", "dir")
"""The filters and order of a session list; a session page opened from a list carries them (its
previous / next session are that list's)."""
SESSION_PARAMS = (*LIST_PARAMS, "page")
SEARCH_PARAMS = ("q", "job", "page")
JOBLESS_PARAMS = ("sort", "dir", "page")
WORKSPACE_PARAMS = ("path",)
GROUP_PARAMS = ("page",)
CASE_PARAMS = ("a", "b", "env", "case")
COMPARE_PARAMS = ("a", "b", "changed", "page")
SESSION_STATUSES = (
    "pending",
    "running",
    "retrying",
    "succeeded",
    "failed",
    "truncated",
    "timeout",
    "error",
    "cancelled",
)
"""``job_environments.status`` values (store.models.JobEnvironment)."""
EVAL_STATUSES = (
    "scored",
    "invalid_reward",
    "error",
    "timeout",
    "grader_broken",
    "skipped",
    "infra_error",
    "none",
)
"""``job_environments.eval_status`` values; ``none``: not evaluated."""


def check_params(request: Request, known: tuple[str, ...]) -> None:
    """400 for a query parameter not in ``known`` (a typo would otherwise be ignored silently) or
    given twice."""
    bad = bad_query_param(request.query_params.multi_items(), known)
    if bad is not None:
        kind, name = bad
        raise HTTPException(
            400,
            f"unknown parameter {name!r} (known: {', '.join(known)})"
            if kind == "unknown"
            else f"parameter {name!r} is given more than once",
        )


def opt_float(request: Request, name: str) -> float | None:
    """The finite number ``name`` (None when absent), else 400."""
    raw = request.query_params.get(name, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise HTTPException(400, f"{name}={raw!r} is not a number") from None
    if not math.isfinite(value):
        raise HTTPException(400, f"{name}={raw!r} is not a finite number")
    return value


def opt_str(request: Request, name: str) -> str | None:
    """The stripped value of ``name``, None when absent or empty."""
    raw = request.query_params.get(name, "").strip()
    return raw or None


def one_of(request: Request, name: str, allowed: list[str]) -> str | None:
    """The value of ``name`` when it is one of ``allowed`` (None when absent), else 400."""
    value = opt_str(request, name)
    if value is not None and value not in allowed:
        raise HTTPException(400, f"{name}={value!r}: use one of {', '.join(allowed)}")
    return value


def page_number(request: Request) -> int:
    """``page``, 1 to :data:`MAX_PAGE` (1 when absent), else 400."""
    raw = request.query_params.get("page", "1").strip() or "1"
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_PAGE:
        raise HTTPException(400, f"page={raw[:40]!r} is not a page number (1 to {MAX_PAGE})")
    return int(raw)


def page_count(total: int, n: int, size: int = PAGE_SIZE) -> int:
    """The pages of ``total`` rows; 404 when page ``n`` is past the last."""
    pages = max(1, math.ceil(total / size))
    if n > pages:
        raise HTTPException(404, f"page {n} of {pages}: no such page")
    return pages


def list_args(request: Request) -> dict[str, str]:
    """The non-empty :data:`LIST_PARAMS` of a request, in that order."""
    return {k: v for k in LIST_PARAMS if (v := request.query_params.get(k, "").strip())}
