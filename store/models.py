"""SQLModel tables of the trajectory store.

Table names follow Safactory where a trainer may already read them: ``job_environments`` (one row
per session), ``session_steps`` (one row per model call) and ``gateway_sessions`` (the gateway's
per-session state, persisted so that a gateway restart keeps step budgets).

JSON columns hold the exact decoded JSON; text columns escape a lone surrogate or NUL
(:class:`ColumnText`); timestamps are timezone-aware UTC datetimes.
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
    """Current time as an aware UTC datetime."""
    return datetime.now(UTC)


def new_record_id() -> str:
    """A globally unique step record id: 128 random bits from the OS as 22 URL-safe base64
    characters (``A-Z a-z 0-9 - _``; the randomness of a uuid4, without building a UUID object on
    the hot path); stable across gateway restarts, never reused. Rows of earlier versions keep
    their 32 hex digits: a reader takes the id as an opaque string."""
    return base64.urlsafe_b64encode(os.urandom(16))[:22].decode("ascii")


MAX_INT = 2**63 - 1
"""The largest integer an INTEGER / BIGINT column holds (SQLite and PostgreSQL): the bound of
every integer a user gives that is stored (policy versions, budgets, cursors)."""

JOB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
"""A job id: letters, digits, ``.``, ``_``, ``-`` (it names files and folders: ``runs/logs/<job id>/``)."""


class ColumnText(TypeDecorator[str]):
    """A text column (``VARCHAR``, as SQLModel's ``str`` fields): every value bound to it, stored
    or compared, goes through :func:`wire.text.column_text` (a lone surrogate or NUL escaped), so
    no text a session writes can fail its row on SQLite or PostgreSQL."""

    impl = AutoString
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        return None if value is None else column_text(value)


def _ts(**kw: Any) -> Any:
    return Field(default_factory=utcnow, sa_column=Column(DateTime(timezone=True), **kw))


def _json(nullable: bool = True) -> Any:
    return Field(default=None, sa_column=Column(JSON, nullable=nullable))


def _json_or_null() -> Any:
    """A JSON column where None is SQL NULL (not the JSON text ``null``), so ``IS NULL`` finds
    the unknown values."""
    return Field(default=None, sa_column=Column(JSON(none_as_null=True), nullable=True))


class JobEnvironment(SQLModel, table=True):
    """One session of a job: (case, sample) of an env run against one model route.

    ``session_id`` (column ``env_id``, Safactory's name) is the session id. ``status`` is one of
    pending | running | retrying | succeeded | failed | truncated | timeout | error | cancelled. ``reward`` is the clamped score (0..10) or NULL
    when not evaluated; ``eval_status`` tells scored | invalid_reward | error | timeout | skipped |
    infra_error apart, so an evaluator crash is never mistaken for a real 0. ``attempts`` counts
    the attempts started; ``outcome`` is how the last one ended (``rollout.core.outcomes``: a task
    outcome, or an infrastructure failure class). ``sandbox`` is how its runtime ran: ``bwrap``
    (isolated) or ``none`` (NULL: not run yet, or by an older version). ``harness`` names the harness
    that ran the session (``rollout.harness``), NULL when it was the env's own runtime. ``eval_history``: the
    evaluations a regrade replaced, oldest first (``{"eval_status", "reward", "eval_reason",
    "eval_detail", "replaced_at"}``), NULL when the session was never regraded.
    """

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
    """One model call recorded by the gateway.

    ``request`` is the body as sent upstream (secrets removed), ``response`` the answer as received
    (a streamed answer assembled into one completion object), ``messages`` the request conversation.
    ``step_id`` increases per (session, model) from 1; ``seq`` increases per session across models
    and orders the trajectory. ``status`` is ok | error | truncated | timeout |
    client_disconnected | empty (a stream with no chunk before ``[DONE]``). Token counts are NULL when the upstream did not report usage (never a fake 0).
    Latencies are milliseconds.

    Training columns (NULL always means unknown, never zero or empty): ``prompt_token_ids`` and
    ``completion_token_ids`` (JSON lists of ints, as the upstream returned them),
    ``completion_logprobs`` (JSON list, one logprob per completion token; an entry is null
    where the upstream sent a non-finite number), ``policy_version`` (the gateway's policy
    version when the call was admitted) and ``extends_prefix`` (true when this step's prompt
    extends the previous step's prompt + completion, false when it does not, NULL for a
    session's first step or when unknown). See docs/tokens.md.

    ``encoding`` (NULL: every column holds its value in full) says how ``messages``, ``request``
    and ``prompt_token_ids`` are rebuilt from an earlier step of the session
    (:mod:`store.stepcodec`, docs/storage.md); every read of the store rebuilds them, so readers
    see full values and ``encoding`` NULL. ``packed`` (format 3, NULL otherwise): the row's
    ``messages``, ``request``, ``response`` and token columns as one zlib stream, those columns
    then NULL; every read unpacks it and returns it NULL.
    """

    __tablename__ = "session_steps"
    __table_args__ = (
        UniqueConstraint("session_id", "llm_model", "step_id", name="uq_step_session_model_step"),
        Index("ix_steps_session_seq", "session_id", "seq"),
    )

    record_id: str = Field(default_factory=new_record_id, primary_key=True, max_length=64, sa_type=ColumnText(64))
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


STEP_COLUMNS: tuple[str, ...] = tuple(c.name for c in SessionStep.__table__.columns)  # type: ignore[attr-defined]
_STEP_DEFAULTS: dict[str, Any] = {
    name: (None if f.default_factory is not None or f.is_required() else f.default)
    for name, f in SessionStep.model_fields.items()
}


def step_record(**values: Any) -> dict[str, Any]:
    """A ``session_steps`` row as a plain dict of every column, for the gateway's hot path
    (``Store.write_batch`` takes it as it takes a :class:`SessionStep`, at a fraction of the
    cost of building the SQLModel object, which goes through SQLAlchemy instrumentation).

    ``values`` are column values; the others get the model's defaults (``record_id`` a new
    :func:`new_record_id`, ``created_at`` :func:`utcnow`). Raises TypeError for a name that is
    not a column, and for a missing required column (``session_id``, ``seq``, ``step_id``,
    ``llm_model``, ``endpoint``)."""
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
    """The gateway's state of one session: status (active | closed | truncated | interrupted: left
    active by a gateway process that ended, set at the next gateway start, active again at the
    session's next call), the step budget
    and the steps used, per model (``step_counts``: route key -> last step_id) and in total.
    ``refunded_steps``: how many of the ``total_steps`` rows are calls that failed before reaching
    the model (connect failure, upstream 429) and so use no budget: the budget check is
    ``max_steps <= total_steps - refunded_steps``. ``route``: the route key the session is bound
    to (its launcher row's ``llm_model``, else the route of its first call); every call of the
    session must name it (NULL: not bound yet). ``in_flight`` and the status ``closing`` (a
    close waits for the calls in flight) are kept here only by gateways that share sessions
    (docs/scale-out.md): reserved steps whose row is not committed yet, on any gateway."""

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
    """One attempt of a launcher session (every attempt is kept, retried or not).

    ``attempt`` counts from 1 per session. ``outcome`` is a task outcome or an infrastructure
    failure class (``rollout.core.outcomes``), ``infra`` whether it is the latter, ``status`` the
    runtime status, ``reason`` why it ended so. ``retry_in_s``: the backoff before the next
    attempt (NULL when none followed). The attempt's steps stay in ``session_steps`` under
    session id ``<session_id>~a<attempt>`` (not trainable) once a later attempt ran, else under
    ``session_id``. Times are UTC; ``duration_s`` seconds."""

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
    """The session id under which an earlier attempt's steps are kept: ``<session_id>~a<attempt>``."""
    return f"{session_id}~a{attempt}"


class SessionWorkspace(SQLModel, table=True):
    """What was kept of a session's final workspace for a later regrade (one row per session; a
    new attempt replaces it).

    ``status``: kept (``archive`` holds a gzip'd tar of ``paths``, None = the whole workspace) |
    too_large (over ``max_bytes``: nothing kept) | failed (could not be read) | disabled (the env
    keeps nothing); ``reason`` says why for the last three. ``total_bytes``: bytes of the regular
    files kept (uncompressed); ``archive_bytes``: size of ``archive``; ``sha256``: its hex digest.
    ``manifest``: ``{"skipped": [...], "missing": [...]}`` entries not kept (special files, links
    out of the workspace) and configured paths absent from the workspace.
    """

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
    """The score a client gave one session (``POST {base}/{sid}/score``, an admin key): ``score``
    0..10 (a ``reward`` 0..1 is stored times 10), its ``reason``, ``provenance`` ``client``. Kept
    apart from a grader's reward (``job_environments.reward``): never read as one, never trained on.
    A later score of the same session replaces it."""

    __tablename__ = "session_client_scores"

    session_id: str = Field(primary_key=True, max_length=128, sa_type=ColumnText(128))
    score: float
    reason: str | None = Field(default=None, sa_type=ColumnText())
    provenance: str = Field(default="client", max_length=32, sa_type=ColumnText(32))
    recorded_at: datetime = _ts()


class FeedGroup(SQLModel, table=True):
    """One entry of a job's feed: a group became ready (all its sessions finished and graded, or
    finished as infrastructure failures). ``ready_seq`` counts from 1 per job in the order groups
    became ready: the feed's durable cursor. ``revision`` is 1, or n when the group became ready
    again after ``--resume`` reran some of its sessions (a new entry; earlier ones are kept).
    ``n_samples``: the group's sessions at that moment."""

    __tablename__ = "feed_groups"
    __table_args__ = (
        UniqueConstraint("job_id", "group_id", "revision", name="uq_feed_group_revision"),
    )

    job_id: str = Field(primary_key=True, max_length=128, sa_type=ColumnText(128))
    ready_seq: int = Field(primary_key=True)
    group_id: str = Field(max_length=128, sa_type=ColumnText(128))
    revision: int = 1
    n_samples: int = 0
    ready_at: datetime = _ts()


class JobLock(SQLModel, table=True):
    """Which launcher runs a job now (one row per job, while it runs): ``owner`` a random token of
    the holder, ``pid`` and ``host`` its process, ``started_at`` when it took the job,
    ``heartbeat_at`` refreshed while it runs. A second launcher on the job is refused while the
    row is live; a holder whose heartbeat is stale, or whose process is gone from its host, is
    taken over (``rollout.jobs.lease``)."""

    __tablename__ = "job_locks"

    job_id: str = Field(primary_key=True, max_length=128)
    owner: str = Field(max_length=64)
    pid: int = 0
    host: str = Field(default="", max_length=255)
    started_at: datetime = _ts()
    heartbeat_at: datetime = _ts()
