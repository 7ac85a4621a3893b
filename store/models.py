"""SQLModel tables of the trajectory store (table names as Safactory's where a trainer may read them).

Text columns escape a lone surrogate or NUL (:class:`ColumnText`); timestamps are aware UTC.
Columns: docs/storage.md, docs/tokens.md, docs/outcomes.md.
"""

from __future__ import annotations

import base64
import os
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import JSON, Column, DateTime, Dialect, Index, LargeBinary, UniqueConstraint
from sqlalchemy.types import TypeDecorator
from sqlmodel import Field, SQLModel
from sqlmodel.sql.sqltypes import AutoString

from wire.text import column_text


class GatewaySessionStatus(StrEnum):
    """The ``gateway_sessions.status`` of a session."""

    ACTIVE = "active"
    TRUNCATED = "truncated"
    INTERRUPTED = "interrupted"
    CLOSING = "closing"
    CLOSED = "closed"


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_record_id() -> str:
    """A unique step record id: 128 random bits as 22 URL-safe base64 characters (older rows: 32
    hex digits; readers take it as opaque)."""
    return base64.urlsafe_b64encode(os.urandom(16))[:22].decode("ascii")


MAX_INT = 2**63 - 1
"""The largest INTEGER / BIGINT value: the bound of every stored user-given integer."""

JOB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
"""A job id: letters, digits, ``.``, ``_``, ``-`` (it names files and folders: ``runs/logs/<job id>/``)."""


class ColumnText(TypeDecorator[str]):
    """A text column whose bound values go through :func:`wire.text.column_text` (lone surrogate
    or NUL escaped), so no session text can fail its row."""

    impl = AutoString
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        return None if value is None else column_text(value)


def _ts(**kw: Any) -> Any:
    return Field(default_factory=utcnow, sa_column=Column(DateTime(timezone=True), **kw))


def _json(nullable: bool = True) -> Any:
    return Field(default=None, sa_column=Column(JSON, nullable=nullable))


def _json_or_null() -> Any:
    """A JSON column where None is SQL NULL (not JSON ``null``)."""
    return Field(default=None, sa_column=Column(JSON(none_as_null=True), nullable=True))


class JobEnvironment(SQLModel, table=True):
    """One session of a job (column ``env_id`` is ``session_id``). ``status``: pending | running |
    retrying | succeeded | failed | truncated | timeout | error | cancelled. ``reward``: the 0..10
    score or NULL; ``eval_status`` tells an evaluator crash from a real 0; ``outcome``: how the last
    attempt ended (``rollout.core.outcomes``); ``sandbox``: bwrap | none; ``harness``: NULL for the
    env's own runtime; ``eval_history``: evaluations a regrade replaced, oldest first."""

    __tablename__ = "job_environments"
    __table_args__ = (Index("ix_job_env_job_status", "job_id", "finished"),)

    session_id: str = Field(sa_column=Column("env_id", ColumnText(128), primary_key=True))
    job_id: str = Field(index=True, max_length=128, sa_type=ColumnText(128))
    env_name: str = Field(max_length=128, sa_type=ColumnText(128))
    case_id: str = Field(max_length=256, sa_type=ColumnText(256))
    llm_model: str = Field(max_length=256, sa_type=ColumnText(256))
    harness: str | None = Field(default=None, max_length=128, sa_type=ColumnText(128))
    group_id: str = Field(index=True, max_length=128, sa_type=ColumnText(128))
    sample_index: int = 0
    env_params: dict[str, Any] | None = _json()
    max_steps: int | None = None
    status: str = Field(default="pending", max_length=32, sa_type=ColumnText(32))
    attempts: int = 0
    reward: float | None = None
    eval_status: str | None = Field(default=None, max_length=32, sa_type=ColumnText(32))
    eval_reason: str | None = Field(default=None, sa_type=ColumnText())
    eval_detail: dict[str, Any] | None = _json()
    eval_history: list[dict[str, Any]] | None = _json()
    result: dict[str, Any] | None = _json()
    error_text: str | None = Field(default=None, sa_type=ColumnText())
    duration_s: float | None = None
    sandbox: str | None = Field(default=None, max_length=16, sa_type=ColumnText(16))
    outcome: str | None = Field(default=None, max_length=32, sa_type=ColumnText(32))
    finished: bool = False
    created_at: datetime = _ts()
    started_at: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True)))
    finished_at: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True)))


class SessionStep(SQLModel, table=True):
    """One model call recorded by the gateway. ``seq`` orders the session's trajectory; ``step_id``
    counts per (session, model) from 1. Token counts and training columns are NULL when unknown,
    never a fake 0 (docs/tokens.md). ``encoding`` and ``packed``: how a row is stored as a delta,
    compressed (:mod:`store.stepcodec`, docs/storage.md); every read returns full values, both NULL."""

    __tablename__ = "session_steps"
    __table_args__ = (
        UniqueConstraint("session_id", "llm_model", "step_id", name="uq_step_session_model_step"),
        Index("ix_steps_session_seq", "session_id", "seq"),
    )

    record_id: str = Field(
        default_factory=new_record_id, primary_key=True, max_length=64, sa_type=ColumnText(64)
    )
    session_id: str = Field(max_length=128, sa_type=ColumnText(128))
    seq: int
    step_id: int
    env_name: str | None = Field(default=None, max_length=128, sa_type=ColumnText(128))
    llm_model: str = Field(max_length=256, sa_type=ColumnText(256))
    group_id: str | None = Field(default=None, max_length=128, sa_type=ColumnText(128))
    job_id: str | None = Field(default=None, index=True, max_length=128, sa_type=ColumnText(128))
    endpoint: str = Field(max_length=64, sa_type=ColumnText(64))
    is_stream: bool = False
    status: str = Field(default="ok", max_length=32, sa_type=ColumnText(32))
    status_code: int | None = None
    messages: Any = _json_or_null()
    request: Any = _json_or_null()
    response: Any = _json_or_null()
    finish_reason: str | None = Field(default=None, max_length=64, sa_type=ColumnText(64))
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    latency_ms: float | None = None
    ttft_ms: float | None = None
    step_reward: float | None = None
    reward: float | None = None
    meta_json: dict[str, Any] | None = _json()
    is_terminal: bool = False
    is_truncated: bool = False
    is_session_completed: bool = False
    is_trainable: bool = True
    created_at: datetime = _ts()
    prompt_token_ids: list[int] | None = _json_or_null()
    completion_token_ids: list[int] | None = _json_or_null()
    completion_logprobs: list[float | None] | None = _json_or_null()
    policy_version: int | None = None
    extends_prefix: bool | None = None
    encoding: list[Any] | None = _json_or_null()
    packed: bytes | None = Field(default=None, sa_column=Column(LargeBinary, nullable=True))


_STEP_DEFAULTS: dict[str, Any] = {
    name: (None if f.default_factory is not None or f.is_required() else f.default)
    for name, f in SessionStep.model_fields.items()
}


def step_record(**values: Any) -> dict[str, Any]:
    """A ``session_steps`` row as a plain dict of every column (the gateway's hot path; cheaper than
    a :class:`SessionStep`), defaults filled in. TypeError for an unknown or missing required column."""
    unknown = values.keys() - _STEP_DEFAULTS.keys()
    if unknown:
        raise TypeError(f"not columns of session_steps: {sorted(unknown)}")
    row = dict(_STEP_DEFAULTS)
    row.update(values)
    if row["record_id"] is None:
        row["record_id"] = new_record_id()
    if row["created_at"] is None:
        row["created_at"] = utcnow()
    missing = [n for n in _REQUIRED_STEP_COLUMNS if row[n] is None]
    if missing:
        raise TypeError(f"session_steps row without {missing}")
    return row


_REQUIRED_STEP_COLUMNS = ("session_id", "seq", "step_id", "llm_model", "endpoint")


class GatewaySession(SQLModel, table=True):
    """The gateway's state of one session: status, step budget and steps used per route
    (``step_counts``) and in total. The budget check is ``max_steps <= total_steps - refunded_steps``
    (refunded: calls that never reached the model). ``route``: the route key every call must name
    (NULL: not bound yet). ``in_flight`` and ``closing``: gateways sharing sessions only
    (docs/scale-out.md)."""

    __tablename__ = "gateway_sessions"

    session_id: str = Field(primary_key=True, max_length=128, sa_type=ColumnText(128))
    status: str = Field(default="active", max_length=32, sa_type=ColumnText(32))
    max_steps: int = -1
    total_steps: int = 0
    refunded_steps: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    in_flight: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    step_counts: dict[str, int] | None = _json()
    route: str | None = Field(default=None, max_length=256, sa_type=ColumnText(256))
    job_id: str | None = Field(default=None, max_length=128, sa_type=ColumnText(128))
    env_name: str | None = Field(default=None, max_length=128, sa_type=ColumnText(128))
    group_id: str | None = Field(default=None, max_length=128, sa_type=ColumnText(128))
    close_reason: str | None = Field(default=None, sa_type=ColumnText())
    completion_mode: str | None = Field(default=None, max_length=32, sa_type=ColumnText(32))
    created_at: datetime = _ts()
    updated_at: datetime = _ts()
    closed_at: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True)))


class SessionAttempt(SQLModel, table=True):
    """One attempt of a launcher session, every one kept; ``attempt`` counts from 1. Its steps stay
    under ``attempt_session_id(session_id, attempt)`` once a later attempt ran."""

    __tablename__ = "session_attempts"

    session_id: str = Field(sa_column=Column("env_id", ColumnText(128), primary_key=True))
    attempt: int = Field(primary_key=True)
    job_id: str = Field(index=True, max_length=128, sa_type=ColumnText(128))
    status: str = Field(max_length=32, sa_type=ColumnText(32))
    outcome: str = Field(max_length=32, sa_type=ColumnText(32))
    infra: bool = False
    reason: str | None = Field(default=None, sa_type=ColumnText())
    step_count: int = 0
    retry_in_s: float | None = None
    started_at: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True)))
    finished_at: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True)))
    duration_s: float | None = None


def attempt_session_id(session_id: str, attempt: int) -> str:
    return f"{session_id}~a{attempt}"


class SessionWorkspace(SQLModel, table=True):
    """A session's kept final workspace for a regrade (one per session; docs/regrade.md). ``status``:
    kept | too_large | failed | disabled; ``archive``: a gzip'd tar of ``paths`` (None: all)."""

    __tablename__ = "session_workspaces"

    session_id: str = Field(primary_key=True, max_length=128, sa_type=ColumnText(128))
    job_id: str = Field(index=True, max_length=128, sa_type=ColumnText(128))
    env_name: str = Field(max_length=128, sa_type=ColumnText(128))
    status: str = Field(max_length=32, sa_type=ColumnText(32))
    reason: str | None = Field(default=None, sa_type=ColumnText())
    paths: list[str] | None = _json()
    max_bytes: int = 0
    file_count: int = 0
    total_bytes: int = 0
    archive_bytes: int = 0
    sha256: str | None = Field(default=None, max_length=64, sa_type=ColumnText(64))
    manifest: dict[str, Any] | None = _json()
    archive: bytes | None = Field(default=None, sa_column=Column(LargeBinary, nullable=True))
    created_at: datetime = _ts()


class SessionClientScore(SQLModel, table=True):
    """A client's score 0..10 of a session, provenance ``client``: never read as a reward, never
    trained on; a later score replaces it."""

    __tablename__ = "session_client_scores"

    session_id: str = Field(primary_key=True, max_length=128, sa_type=ColumnText(128))
    score: float
    reason: str | None = Field(default=None, sa_type=ColumnText())
    provenance: str = Field(default="client", max_length=32, sa_type=ColumnText(32))
    recorded_at: datetime = _ts()


class FeedGroup(SQLModel, table=True):
    """A feed entry: a group became ready. ``ready_seq`` (from 1 per job) is the feed's cursor;
    ``revision`` > 1 when ``--resume`` made it ready again (docs/feed.md)."""

    __tablename__ = "feed_groups"
    __table_args__ = (UniqueConstraint("job_id", "group_id", "revision", name="uq_feed_group_revision"),)

    job_id: str = Field(primary_key=True, max_length=128, sa_type=ColumnText(128))
    ready_seq: int = Field(primary_key=True)
    group_id: str = Field(max_length=128, sa_type=ColumnText(128))
    revision: int = 1
    n_samples: int = 0
    ready_at: datetime = _ts()


class JobLock(SQLModel, table=True):
    """Which launcher runs a job now: a live holder refuses a second launcher; a stale or gone one
    is taken over (``rollout.jobs.lease``)."""

    __tablename__ = "job_locks"

    job_id: str = Field(primary_key=True, max_length=128)
    owner: str = Field(max_length=64)
    pid: int = 0
    host: str = Field(default="", max_length=255)
    started_at: datetime = _ts()
    heartbeat_at: datetime = _ts()
