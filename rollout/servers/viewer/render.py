"""Formatting helpers and the Jinja2 environment shared by the viewer's pages and the report."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape

from rollout.servers.viewer.trajectory_view import pretty

HERE = Path(__file__).resolve().parent


def _aware(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def fmt_dt(value: datetime | None) -> str:
    """UTC time as ``YYYY-MM-DD HH:MM:SS``, ``-`` for None."""
    v = _aware(value)
    return "-" if v is None else v.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def fmt_num(value: float | None, digits: int = 2) -> str:
    return (
        "-"
        if value is None or (isinstance(value, float) and not math.isfinite(value))
        else f"{value:.{digits}f}"
    )


def fmt_dur(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min"


def fmt_ms(ms: float | None) -> str:
    """A latency in milliseconds as read: ``734 ms``, ``12.3 s``, ``3 min 5 s`` (``-``: unknown)."""
    if ms is None or not math.isfinite(ms):
        return "-"
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    minutes, seconds = divmod(round(ms / 1000), 60)
    return f"{minutes} min {seconds} s"


def job_duration(job: dict[str, Any]) -> float | None:
    """Seconds from the first session start to the last finish (to now while it runs)."""
    start = _aware(job.get("started_at") or job.get("created_at"))
    if start is None:
        return None
    end = _aware(job.get("finished_at")) if job["finished"] >= job["sessions"] else datetime.now(UTC)
    return None if end is None else max(0.0, (end - start).total_seconds())


def templates() -> Environment:
    """The Jinja2 environment of the viewer's and the report's templates."""
    env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(["html"]))
    env.filters.update(
        dt=fmt_dt, num=fmt_num, dur=fmt_dur, ms=fmt_ms, pretty=pretty, short=lambda s: (s or "")[:8]
    )
    env.globals["job_duration"] = job_duration
    return env
