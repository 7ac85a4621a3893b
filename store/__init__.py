"""The trajectory store: SQLModel tables, the engines and every SQL statement.

Used by both the gateway and the launcher; knows nothing about HTTP (module map:
docs/architecture.md).
"""

from store.engine import DbUrlError, json_dumps, parse_db_url
from store.models import (
    GatewaySession,
    JobEnvironment,
    SessionStatus,
    SessionStep,
    StepStatus,
    new_record_id,
    step_record,
    utcnow,
)
from store.repo import SessionRow, StepRow, Store, is_unavailable

__all__ = [
    "DbUrlError",
    "GatewaySession",
    "JobEnvironment",
    "SessionRow",
    "SessionStatus",
    "SessionStep",
    "StepRow",
    "StepStatus",
    "Store",
    "is_unavailable",
    "json_dumps",
    "new_record_id",
    "parse_db_url",
    "step_record",
    "utcnow",
]
