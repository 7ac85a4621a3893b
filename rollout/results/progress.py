"""What the launcher's progress display shows while a job runs (``ProgressState``): sessions done
per env out of its total, the running mean score of scored sessions, problem counts and
throughput; ``render_progress`` its lines fitted to a terminal width. Pure state and formatting:
no clock (the caller passes the elapsed time and the width) and no I/O.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from rollout.results.report import (
    EVAL_ERROR_STATUS,
    EVAL_INVALID_STATUS,
    EVAL_TIMEOUT_STATUS,
    PROBLEM_LEGEND,
    SessionRecord,
    is_infra,
    is_runtime_error,
)
from store import COUNTED_EVAL_STATUSES, GRADER_BROKEN

PROBLEM_KEYS = tuple(PROBLEM_LEGEND)
"""Problem counters, in display order: the summary table's ``problems`` abbreviations (truncated,
invalid reward, evaluator error / timeout, runtime error / timeout, retried, infrastructure
failure never recovered, grader broken)."""


def record_problems(record: SessionRecord) -> list[str]:
    """The ``PROBLEM_KEYS`` that apply to one finished session."""
    hits = {
        "trunc": record.status == "truncated",
        "inval": record.eval_status == EVAL_INVALID_STATUS,
        "ev_err": record.eval_status == EVAL_ERROR_STATUS,
        "ev_t/o": record.eval_status == EVAL_TIMEOUT_STATUS,
        "rt_err": is_runtime_error(record),
        "rt_t/o": record.status == "timeout",
        "retried": record.retried,
        "infra": is_infra(record),
        "broken": record.eval_status == GRADER_BROKEN,
    }
    return [k for k in PROBLEM_KEYS if hits[k]]


@dataclass
class ProgressState:
    """Counts of the sessions finished so far. ``totals``: planned sessions per env (an env seen
    in ``update`` but not planned gets a total of what is done)."""

    totals: Mapping[str, int]
    done: Counter[str] = field(default_factory=Counter)
    score_sum: dict[str, float] = field(default_factory=dict)
    scored: Counter[str] = field(default_factory=Counter)
    problems: Counter[str] = field(default_factory=Counter)

    def update(self, record: SessionRecord) -> None:
        """Count one finished session."""
        self.done[record.env_name] += 1
        if record.eval_status in COUNTED_EVAL_STATUSES and record.score is not None and not is_infra(record):
            self.score_sum[record.env_name] = self.score_sum.get(record.env_name, 0.0) + record.score
            self.scored[record.env_name] += 1
        self.problems.update(record_problems(record))

    @property
    def n_done(self) -> int:
        return sum(self.done.values())

    @property
    def n_total(self) -> int:
        return sum(max(self.totals.get(e, 0), self.done[e]) for e in self._envs())

    def _envs(self) -> list[str]:
        return sorted(set(self.totals) | set(self.done))

    def mean_score(self, env: str | None = None) -> float | None:
        """Mean score (0..10) of the counted sessions so far (grading failures as 0), of one env or
        of all; None if none."""
        envs = [env] if env is not None else self._envs()
        n = sum(self.scored[e] for e in envs)
        return math.fsum(self.score_sum.get(e, 0.0) for e in envs) / n if n else None

    def describe(self, elapsed_s: float) -> str:
        """One line: ``<env> done/total mean <score>`` per env, then the overall mean score, the
        non-zero problem counts (``problems none`` when there are none) and sessions per minute
        over ``elapsed_s`` seconds (``-`` before any time has passed). Scores with 2 decimals,
        ``-`` when nothing is scored yet."""

        def fmt(v: float | None) -> str:
            return "-" if v is None else f"{v:.2f}"

        envs = [
            f"{e} {self.done[e]}/{max(self.totals.get(e, 0), self.done[e])} mean {fmt(self.mean_score(e))}"
            for e in self._envs()
        ]
        probs = ", ".join(f"{k} {self.problems[k]}" for k in PROBLEM_KEYS if self.problems[k]) or "none"
        rate = f"{self.n_done / elapsed_s * 60:.1f}" if elapsed_s > 0 else "-"
        return " | ".join(
            [*envs, f"mean {fmt(self.mean_score())}", f"problems {probs}", f"{rate} sessions/min"]
        )


BAR_WIDTH = 12
"""Cells of the progress bar when the terminal has room for it."""


def clock(seconds: float) -> str:
    """``m:ss``, or ``h:mm:ss`` from an hour on."""
    s = max(0, int(seconds))
    h, rest = divmod(s, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


def fit(text: str, width: int) -> str:
    """``text`` cut to ``width`` columns (ending ``...`` when cut)."""
    if len(text) <= width:
        return text
    return text[: max(0, width - 3)] + "..." if width > 3 else text[: max(0, width)]


def render_progress(state: ProgressState, elapsed_s: float, width: int) -> list[str]:
    """The progress display: one line (sessions done of planned, a bar, the clock and the time
    left, the mean score, the problem counts, sessions per minute), and a second one with each
    env's counts when the job has several envs. Each line is shorter than ``width`` columns (a
    line filling the last column would wrap): parts are dropped, then the line cut, to fit."""
    room = max(1, width - 1)
    done, total = state.n_done, state.n_total
    eta = clock(elapsed_s / done * (total - done)) if done and total >= done else "?"
    filled = BAR_WIDTH * done // total if total else 0
    probs = ", ".join(f"{k} {state.problems[k]}" for k in PROBLEM_KEYS if state.problems[k])
    mean = state.mean_score()
    parts = {
        "count": f"{done}/{total} sessions",
        "bar": f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}]",
        "clock": f"{clock(elapsed_s)} elapsed, {eta} left",
        "mean": f"mean {'-' if mean is None else f'{mean:.2f}'}",
        "problems": f"problems {probs}" if probs else "",
        "rate": f"{done / elapsed_s * 60:.1f}/min" if elapsed_s > 0 and done else "",
    }
    for drop in ((), ("rate",), ("rate", "bar"), ("rate", "bar", "problems")):
        head = parts["count"] + ("" if "bar" in drop else " " + parts["bar"])
        line = " | ".join(
            [head, *(parts[k] for k in ("clock", "mean", "problems", "rate") if parts[k] and k not in drop)]
        )
        if len(line) <= room:
            break
    lines = [fit(line, room)]
    envs = sorted(set(state.totals) | set(state.done))
    if len(envs) > 1:
        cells = [
            f"{e} {state.done[e]}/{max(state.totals.get(e, 0), state.done[e])}"
            + (f" mean {m:.2f}" if (m := state.mean_score(e)) is not None else "")
            for e in envs
        ]
        lines.append(fit("  " + " | ".join(cells), room))
    return lines
