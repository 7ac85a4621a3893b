"""The trajectory store: SQLModel tables, engines and every SQL statement: the writers behind
``Store``, the readers in ``store.queries``, ``store.feed`` and ``store.search``. Used by the
gateway and the launcher; knows nothing about HTTP. Tables, who writes them and the step
format: docs/storage.md.
"""

from store.batch_writer import SessionRow, StepRow
from store.engine import DbUrlError, hide_secrets, json_dumps, parse_db_url, redact_url
from store.gateway_sessions import SessionContext
from store.models import (
    JOB_ID_PATTERN,
    MAX_INT,
    GatewaySession,
    GatewaySessionStatus,
    JobEnvironment,
    JobLock,
    SessionAttempt,
    SessionClientScore,
    SessionStep,
    SessionWorkspace,
    attempt_session_id,
    new_record_id,
    step_record,
    utcnow,
)
from store.repo import Store, StoreUnavailable, is_unavailable
from store.schema import SchemaError
from store.session_result import (
    COUNTED_EVAL_STATUSES,
    GRADER_BROKEN,
    GRADING_FAILURES,
    FinalStatus,
    SessionResult,
)

__all__ = [
    "COUNTED_EVAL_STATUSES",
    "GRADER_BROKEN",
    "GRADING_FAILURES",
    "JOB_ID_PATTERN",
    "MAX_INT",
    "DbUrlError",
    "GatewaySession",
    "JobEnvironment",
    "JobLock",
    "SchemaError",
    "SessionAttempt",
    "SessionContext",
    "SessionResult",
    "FinalStatus",
    "SessionRow",
    "GatewaySessionStatus",
    "SessionStep",
    "SessionClientScore",
    "SessionWorkspace",
    "StepRow",
    "StoreUnavailable",
    "Store",
    "attempt_session_id",
    "hide_secrets",
    "is_unavailable",
    "json_dumps",
    "new_record_id",
    "parse_db_url",
    "redact_url",
    "step_record",
    "utcnow",
]
