"""``SessionResult``: how one session ended, the one typed value every end of a session builds.

The launcher builds it (a graded session, an infrastructure failure, a retry that could not start,
a launcher error), ``Store.finish_job_session`` writes it, and ``SessionResult.of_row`` reads it back
for the JSONL, the report, the feed and the viewer. Its fields are the ``job_environments``
columns a finished session sets (docs/storage.md).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from store.models import JobEnvironment

FinalStatus = Literal["succeeded", "failed", "truncated", "timeout", "error", "cancelled"]
"""A finished session's ``status``: the runtime's status, ``error`` when the launcher could not run it."""

GRADING_FAILURES = frozenset({"invalid_reward", "error", "timeout"})
"""``eval_status`` of a grading that failed on the session and whose control graded: the agent's 0,
counted like a score (docs/trust-model.md, "Failure attribution")."""
COUNTED_EVAL_STATUSES = frozenset({"scored", *GRADING_FAILURES})
"""``eval_status`` values whose committed reward counts in the mean, pass@k, the feed and training."""
CUT_OFF_OUTCOMES = frozenset({"cancelled", "interrupted"})
"""Outcomes of an attempt a stop, a Ctrl-C or a killed launcher cut off: the session run again
after one was not retried (``retried`` counts an earlier attempt with another outcome)."""
GRADER_BROKEN = "grader_broken"
"""``eval_status`` of a session whose grader failed on it and on the case's control too: the grader
is broken, the session carries no reward and is not counted."""


class SessionResult(BaseModel):
    """The end of one session.

    ``status``: see ``FinalStatus``; ``outcome``: how its last attempt ended (a task outcome or an
    infrastructure failure class, docs/outcomes.md); ``attempts``: attempts started; ``error``: why
    the runtime or the launcher failed; ``runtime_result``: the runtime's result line (its words,
    never trusted for the outcome); ``sandbox``: how the runtime ran (``bwrap`` | ``none``);
    ``reward``: the committed score 0..10, None when not graded; ``eval_status`` / ``eval_reason`` /
    ``eval_detail``: the evaluation (``eval_detail`` keeps ``raw_repr``, ``artifacts`` and the grader's
    ``isolation``); ``evaluation``: the whole evaluation, written into the last step's
    ``meta_json["evaluation"]``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    status: FinalStatus
    outcome: str | None = None
    attempts: int = 0
    error: str | None = None
    duration_s: float | None = None
    runtime_result: dict[str, Any] | None = None
    sandbox: str | None = None
    reward: float | None = None
    eval_status: str | None = None
    eval_reason: str | None = None
    eval_detail: dict[str, Any] | None = None
    evaluation: dict[str, Any] | None = Field(default=None, exclude=True)

    @property
    def grader_isolation(self) -> str | None:
        """Where the evaluator ran (``bwrap`` | ``none``), None when none ran."""
        return (self.eval_detail or {}).get("isolation")

    @property
    def verifier_container(self) -> str | None:
        """Where the task's tests ran: ``fresh`` (a new copy of the image or the host's tools) or
        ``same`` (on the agent's own copy-on-write layer); None when no verifier ran."""
        return (self.eval_detail or {}).get("verifier_container")

    def columns(self) -> dict[str, Any]:
        """The ``job_environments`` columns this result sets (``finished``/``finished_at`` aside)."""
        return {
            "status": self.status,
            "outcome": self.outcome,
            "attempts": self.attempts,
            "error_text": self.error,
            "duration_s": self.duration_s,
            "result": self.runtime_result,
            "sandbox": self.sandbox,
            "reward": self.reward,
            "eval_status": self.eval_status,
            "eval_reason": self.eval_reason,
            "eval_detail": self.eval_detail,
        }

    @classmethod
    def of_row(cls, row: JobEnvironment) -> SessionResult:
        """The result a finished ``job_environments`` row holds."""
        return cls(
            status=row.status,  # type: ignore[arg-type]
            outcome=row.outcome,
            attempts=row.attempts,
            error=row.error_text,
            duration_s=row.duration_s,
            runtime_result=row.result,
            sandbox=row.sandbox,
            reward=row.reward,
            eval_status=row.eval_status,
            eval_reason=row.eval_reason,
            eval_detail=row.eval_detail,
        )
