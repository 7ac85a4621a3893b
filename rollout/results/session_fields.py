"""The fields every per-session output shares (the launcher's JSONL and ``launcher.py export``),
built in one place from a session's ``job_environments`` row and its step rows (docs/output.md,
"One record per session")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, FiniteFloat

SCHEMA_VERSION = 2
"""Bumped whenever a shared field is renamed, removed or changes meaning."""


class UsageTotals(BaseModel):
    """Token counts summed over a session's steps (steps with unknown counts add 0)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class StepTiming(BaseModel):
    """One step's ``latency_ms`` (request to full answer) and ``ttft_ms`` (to the first token of a
    streamed answer), None when unknown."""

    seq: int
    latency_ms: FiniteFloat | None = None
    ttft_ms: FiniteFloat | None = None


class SessionFields(BaseModel):
    """The shared per-session fields (documented in docs/output.md)."""

    schema_version: int = SCHEMA_VERSION
    session_id: str
    job_id: str | None = None
    env_name: str | None = None
    case_id: str | None = None
    group_id: str | None = None
    model: str | None = None
    harness: str | None = None
    sample_index: int | None = None
    status: str
    outcome: str | None = None
    score: FiniteFloat | None = None
    reward: FiniteFloat | None = None
    eval_status: str | None = None
    eval_reason: str | None = None
    error: str | None = None
    duration_s: FiniteFloat | None = None
    started_at: str | None = None
    finished_at: str | None = None
    usage: UsageTotals | None = None
    step_count: int = 0
    step_timings: list[StepTiming] = []


def utc_text(t: datetime | None) -> str | None:
    """``t`` as UTC ISO text (SQLite gives back naive datetimes: the store writes UTC)."""
    if t is None:
        return None
    return (t if t.tzinfo is not None else t.replace(tzinfo=UTC)).isoformat()


def usage_of(steps: Sequence[Mapping[str, Any]]) -> UsageTotals | None:
    """Token counts summed over the steps that reported any; None when none did."""
    keys = ("prompt_tokens", "completion_tokens", "total_tokens")
    known = [s for s in steps if any(s.get(k) is not None for k in keys)]
    if not known:
        return None
    return UsageTotals(**{k: sum(int(s.get(k) or 0) for s in known) for k in keys})


def session_fields(row: Mapping[str, Any], steps: Sequence[Mapping[str, Any]]) -> SessionFields:
    """The shared fields of one session: ``row`` has the ``job_environments`` column names
    (``env_id``, ``llm_model``, ``reward`` (0..10), ``error_text``, ...), ``steps`` its step rows
    in ``seq`` order (``seq``, token counts, ``latency_ms``, ``ttft_ms``)."""
    score = row.get("reward")
    return SessionFields(
        session_id=row["env_id"],
        job_id=row.get("job_id"),
        env_name=row.get("env_name"),
        case_id=row.get("case_id"),
        group_id=row.get("group_id"),
        model=row.get("llm_model"),
        harness=row.get("harness"),
        sample_index=row.get("sample_index"),
        status=row["status"],
        outcome=row.get("outcome"),
        score=score,
        reward=None if score is None else score / 10,
        eval_status=row.get("eval_status"),
        eval_reason=row.get("eval_reason"),
        error=row.get("error_text"),
        duration_s=row.get("duration_s"),
        started_at=utc_text(row.get("started_at")),
        finished_at=utc_text(row.get("finished_at")),
        usage=usage_of(steps),
        step_count=len(steps),
        step_timings=[
            StepTiming(seq=s["seq"], latency_ms=s.get("latency_ms"), ttft_ms=s.get("ttft_ms")) for s in steps
        ],
    )
