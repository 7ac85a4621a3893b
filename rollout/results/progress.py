"""What the launcher's progress display shows while a job runs (``ProgressState``): sessions done
per env out of its total, the running mean score of scored sessions, problem counts and
throughput. Pure state and formatting: no clock (the caller passes the elapsed time) and no I/O.
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
)

PROBLEM_KEYS = tuple(PROBLEM_LEGEND)
"""Problem counters, in display order: the summary table's ``problems`` abbreviations (truncated,
invalid reward, evaluator error / timeout, runtime error / timeout, retried, infrastructure
failure never recovered)."""


def record_problems(record: SessionRecord) -> list[str]:
    """The ``PROBLEM_KEYS`` that apply to one finished session."""
    hits = {
        "trunc": record.status == "truncated",
        "inval": record.eval_status == EVAL_INVALID_STATUS,
        "ev_err": record.eval_status == EVAL_ERROR_STATUS,
        "ev_t/o": record.eval_status == EVAL_TIMEOUT_STATUS,
        "rt_err": record.status == "error",
        "rt_t/o": record.status == "timeout",
        "retried": record.retried,
        "infra": is_infra(record),
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
        if record.eval_status == "scored" and record.score is not None and not is_infra(record):
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
        """Mean score (0..10) of the scored sessions so far, of one env or of all; None if none."""
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

        envs = [f"{e} {self.done[e]}/{max(self.totals.get(e, 0), self.done[e])} mean {fmt(self.mean_score(e))}"
                for e in self._envs()]
        probs = ", ".join(f"{k} {self.problems[k]}" for k in PROBLEM_KEYS if self.problems[k]) or "none"
        rate = f"{self.n_done / elapsed_s * 60:.1f}" if elapsed_s > 0 else "-"
        return " | ".join([*envs, f"mean {fmt(self.mean_score())}", f"problems {probs}", f"{rate} sessions/min"])
