"""The feed's SQL: marking a group ready (in the launcher's finishing transaction) and the reads that
serve ready groups and exports (docs/feed.md). Step columns an older store lacks read as None.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Connection, Result, bindparam, case, func, select
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import Session
from sqlalchemy.sql import ColumnElement

from store.models import FeedGroup, GatewaySession, JobEnvironment, SessionClientScore, SessionStep, utcnow
from store.stepcodec import decode_rows

JE = JobEnvironment.__table__  # type: ignore[attr-defined]
ST = SessionStep.__table__  # type: ignore[attr-defined]
FG = FeedGroup.__table__  # type: ignore[attr-defined]
GS = GatewaySession.__table__  # type: ignore[attr-defined]
CS = SessionClientScore.__table__  # type: ignore[attr-defined]

TOKEN_COLUMNS = (
    "prompt_token_ids",
    "completion_token_ids",
    "completion_logprobs",
    "policy_version",
    "extends_prefix",
)
"""Step columns a trainer needs beyond the conversation; None when the store has no such column."""

_FINISHED = case((JE.c.finished.is_(True), 1), else_=0)
_IN_CHUNK = 500  # ids per IN (...) list, well under every backend's parameter limit

_SESSION_COLUMNS = (
    "env_id",
    "job_id",
    "group_id",
    "env_name",
    "case_id",
    "llm_model",
    "harness",
    "sample_index",
    "status",
    "outcome",
    "attempts",
    "reward",
    "eval_status",
    "eval_reason",
    "error_text",
    "duration_s",
    "finished",
    "started_at",
    "finished_at",
)
_STEP_COLUMNS = (
    "session_id",
    "seq",
    "step_id",
    "llm_model",
    "endpoint",
    "status",
    "status_code",
    "messages",
    "response",
    "finish_reason",
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
    "latency_ms",
    "ttft_ms",
    "is_trainable",
    "created_at",
)


# A step may be stored as a delta on an earlier step of its session (column ``encoding``,
# ``store.stepcodec``): every read takes these columns and rebuilds the full values.
_CODEC_COLUMNS = (
    "session_id",
    "seq",
    "encoding",
    "packed",
    "messages",
    "request",
    "response",
    "prompt_token_ids",
    "completion_token_ids",
    "completion_logprobs",
)


def _rebuild(rows: list[dict[str, Any]], *, keep_messages: bool, keep_request: bool) -> None:
    """Rebuild delta-stored steps in place (all of a session's steps are among ``rows``), then
    drop the columns read only for that."""
    decode_rows(rows)
    for row in rows:
        row.pop("encoding", None)
        row.pop("packed", None)
        if not keep_messages:
            row.pop("messages", None)
        if not keep_request:
            row.pop("request", None)


def _dicts(result: Result[Any]) -> list[dict[str, Any]]:
    """The rows of ``result`` as dicts (the keys built once, not per row)."""
    keys = list(result.keys())
    return [dict(zip(keys, row, strict=True)) for row in result.all()]


def _present(table: Any, names: Iterable[str]) -> list[ColumnElement[Any]]:
    return [table.c[n] for n in names if n in table.c]


_GROUP_OF = select(JE.c.job_id, JE.c.group_id, JE.c.finished).where(JE.c.env_id == bindparam("sid"))
_GROUP_COUNTS = select(func.count(), func.sum(_FINISHED)).where(
    JE.c.job_id == bindparam("job"), JE.c.group_id == bindparam("grp")
)
_LAST_READY = select(func.max(FG.c.ready_seq)).where(FG.c.job_id == bindparam("job"))
_REVISIONS = select(func.count()).where(FG.c.job_id == bindparam("job"), FG.c.group_id == bindparam("grp"))
_APPEND = FG.insert()
# built once: each finished session runs these (building a statement costs more than running it)


def unfinished_group(s: Session | Connection, session_id: str) -> tuple[str, str] | None:
    """``(job_id, group_id)`` of a session that is not finished yet, None when it is finished or
    unknown. Read in the finishing transaction before the session is marked finished."""
    row = s.execute(_GROUP_OF, {"sid": session_id}).one_or_none()
    return None if row is None or row.finished else (row.job_id, row.group_id)


def append_if_ready(s: Session | Connection, job_id: str, group_id: str) -> int | None:
    """In the caller's write transaction (sync): when every session of the group is finished,
    append its feed entry (next ``ready_seq``, next ``revision``) and return the ``ready_seq``; None
    while some are unfinished. On PostgreSQL a concurrent writer fails on the primary key."""
    key = {"job": job_id, "grp": group_id}
    total, finished = s.execute(_GROUP_COUNTS, key).one()
    if not total or int(finished or 0) < int(total):
        return None
    last = s.execute(_LAST_READY, key).scalar()
    revisions = s.execute(_REVISIONS, key).scalar()
    seq = int(last or 0) + 1
    s.execute(
        _APPEND,
        {
            "job_id": job_id,
            "ready_seq": seq,
            "group_id": group_id,
            "revision": int(revisions or 0) + 1,
            "n_samples": int(total),
            "ready_at": utcnow(),
        },
    )
    return seq


def backfill(s: Session, job_id: str) -> int:
    """In the caller's write transaction (sync): a revision-1 entry for every complete group of
    ``job_id`` without one (jobs recorded before the feed), in finishing order; returns how many."""
    have = set(s.execute(select(FG.c.group_id).where(FG.c.job_id == job_id)).scalars())
    done = s.execute(
        select(JE.c.group_id, func.max(JE.c.finished_at), func.count())
        .where(JE.c.job_id == job_id)
        .group_by(JE.c.group_id)
        .having(func.sum(_FINISHED) == func.count())
    ).all()
    todo = sorted(
        ((last, gid, n) for gid, last, n in done if gid not in have),
        key=lambda t: (t[0] is None, t[0] or 0, t[1]),
    )
    last_seq = s.execute(select(func.max(FG.c.ready_seq)).where(FG.c.job_id == job_id)).scalar()
    seq = int(last_seq or 0)
    for _, gid, n in todo:
        seq += 1
        s.execute(
            FG.insert().values(
                job_id=job_id, ready_seq=seq, group_id=gid, revision=1, n_samples=int(n), ready_at=utcnow()
            )
        )
    return len(todo)


class FeedQueries:
    """Read-only queries of the feed and of exports, on a reader engine."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def ready_after(self, job_id: str, after: int, limit: int) -> list[dict[str, Any]]:
        """Feed entries of a job with ``ready_seq > after``, oldest first, at most ``limit``."""
        q = (
            select(FG)
            .where(FG.c.job_id == job_id, FG.c.ready_seq > after)
            .order_by(FG.c.ready_seq)
            .limit(limit)
        )
        async with self.engine.connect() as conn:
            return _dicts(await conn.execute(q))

    async def progress(self, job_id: str) -> dict[str, int]:
        """``{"sessions", "finished", "groups", "groups_ready"}`` of a job (``groups_ready``:
        distinct groups with a feed entry)."""
        async with self.engine.connect() as conn:
            row = (
                await conn.execute(
                    select(func.count(), func.sum(_FINISHED), func.count(func.distinct(JE.c.group_id))).where(
                        JE.c.job_id == job_id
                    )
                )
            ).one()
            ready = (
                await conn.execute(
                    select(func.count(func.distinct(FG.c.group_id))).where(FG.c.job_id == job_id)
                )
            ).scalar()
        return {
            "sessions": int(row[0] or 0),
            "finished": int(row[1] or 0),
            "groups": int(row[2] or 0),
            "groups_ready": int(ready or 0),
        }

    async def sessions_of_groups(self, job_id: str, group_ids: Sequence[str]) -> list[dict[str, Any]]:
        """The session rows of these groups (``env_id`` is the session id), by group and sample."""
        out: list[dict[str, Any]] = []
        cols = _present(JE, _SESSION_COLUMNS)
        async with self.engine.connect() as conn:
            for i in range(0, len(group_ids), _IN_CHUNK):
                q = (
                    select(*cols)
                    .where(JE.c.job_id == job_id, JE.c.group_id.in_(group_ids[i : i + _IN_CHUNK]))
                    .order_by(JE.c.group_id, JE.c.sample_index, JE.c.env_id)
                )
                out.extend(_dicts(await conn.execute(q)))
        return out

    async def steps_of_sessions(
        self, session_ids: Sequence[str], *, with_messages: bool = True, with_request: bool = False
    ) -> dict[str, list[dict[str, Any]]]:
        """Every recorded step of these sessions (session id -> steps in ``seq`` order), with the
        token columns the table has; ``messages`` only when ``with_messages``, ``request`` only
        when ``with_request``."""
        names = (
            *(c for c in _STEP_COLUMNS if with_messages or c != "messages"),
            *TOKEN_COLUMNS,
            *(("request",) if with_request else ()),
        )
        names = (*names, *(c for c in _CODEC_COLUMNS if c not in names))  # to rebuild a step from its base
        cols = _present(ST, names)
        out: dict[str, list[dict[str, Any]]] = {sid: [] for sid in session_ids}
        async with self.engine.connect() as conn:
            for i in range(0, len(session_ids), _IN_CHUNK):
                q = (
                    select(*cols)
                    .where(ST.c.session_id.in_(session_ids[i : i + _IN_CHUNK]))
                    .order_by(ST.c.session_id, ST.c.seq)
                )
                rows = _dicts(await conn.execute(q))
                _rebuild(rows, keep_messages=with_messages, keep_request=with_request)
                for row in rows:
                    out[row["session_id"]].append(row)
        return out

    async def policy_versions(self, session_ids: Sequence[str]) -> dict[str, list[int]]:
        """The distinct policy versions stamped on each session's steps, ascending (a session
        without any is absent; every session is absent when the table has no such column)."""
        if "policy_version" not in ST.c:
            return {}
        out: dict[str, list[int]] = {}
        async with self.engine.connect() as conn:
            for i in range(0, len(session_ids), _IN_CHUNK):
                q = (
                    select(ST.c.session_id, ST.c.policy_version)
                    .distinct()
                    .where(
                        ST.c.session_id.in_(session_ids[i : i + _IN_CHUNK]), ST.c.policy_version.is_not(None)
                    )
                    .order_by(ST.c.session_id, ST.c.policy_version)
                )
                for sid, version in (await conn.execute(q)).all():
                    out.setdefault(sid, []).append(int(version))
        return out

    async def unversioned_sessions(self, session_ids: Sequence[str]) -> set[str]:
        """The sessions among these with at least one step without a policy version (made before
        any version was set; every session with steps when the table has no such column)."""
        out: set[str] = set()
        async with self.engine.connect() as conn:
            for i in range(0, len(session_ids), _IN_CHUNK):
                q = (
                    select(ST.c.session_id)
                    .distinct()
                    .where(ST.c.session_id.in_(session_ids[i : i + _IN_CHUNK]))
                )
                if "policy_version" in ST.c:
                    q = q.where(ST.c.policy_version.is_(None))
                out.update((await conn.execute(q)).scalars())
        return out

    async def latest_policy_version(self, job_id: str) -> int | None:
        """The newest policy version stamped on any step of the job's sessions (None when none
        is, or the table has no such column)."""
        if "policy_version" not in ST.c:
            return None
        async with self.engine.connect() as conn:
            value = (
                await conn.execute(
                    select(func.max(ST.c.policy_version)).where(
                        ST.c.session_id.in_(select(JE.c.env_id).where(JE.c.job_id == job_id))
                    )
                )
            ).scalar()
        return None if value is None else int(value)

    async def step_routes(self, session_ids: Sequence[str]) -> dict[str, list[str]]:
        """The distinct routes (``llm_model``) of each session's steps, sorted (a session without
        steps is absent)."""
        out: dict[str, list[str]] = {}
        async with self.engine.connect() as conn:
            for i in range(0, len(session_ids), _IN_CHUNK):
                q = (
                    select(ST.c.session_id, ST.c.llm_model)
                    .distinct()
                    .where(ST.c.session_id.in_(session_ids[i : i + _IN_CHUNK]))
                    .order_by(ST.c.session_id, ST.c.llm_model)
                )
                for sid, route in (await conn.execute(q)).all():
                    out.setdefault(sid, []).append(str(route))
        return out

    async def group_ids(self, job_id: str) -> list[str]:
        """Every group of a job, ordered by env, case and group id (exports)."""
        q = (
            select(JE.c.group_id, func.min(JE.c.env_name), func.min(JE.c.case_id))
            .where(JE.c.job_id == job_id)
            .group_by(JE.c.group_id)
            .order_by(func.min(JE.c.env_name), func.min(JE.c.case_id), JE.c.group_id)
        )
        async with self.engine.connect() as conn:
            return [r[0] for r in (await conn.execute(q)).all()]

    async def ready_entries(self, job_id: str) -> dict[str, dict[str, Any]]:
        """The latest feed entry of each ready group of a job (group id -> entry)."""
        q = select(FG).where(FG.c.job_id == job_id).order_by(FG.c.ready_seq)
        async with self.engine.connect() as conn:
            return {r["group_id"]: r for r in _dicts(await conn.execute(q))}

    async def jobless_sessions(self, session_ids: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """The ``gateway_sessions`` rows without a launcher row (a client named the session: no
        job, never graded), all of them or those of ``session_ids``, by first call then id."""
        cond = ~select(JE.c.env_id).where(JE.c.env_id == GS.c.session_id).exists()
        out: list[dict[str, Any]] = []
        async with self.engine.connect() as conn:
            if session_ids is None:
                return _dicts(
                    await conn.execute(select(GS).where(cond).order_by(GS.c.created_at, GS.c.session_id))
                )
            for i in range(0, len(session_ids), _IN_CHUNK):
                q = select(GS).where(cond, GS.c.session_id.in_(session_ids[i : i + _IN_CHUNK]))
                out.extend(_dicts(await conn.execute(q)))
        return sorted(out, key=lambda r: (r["created_at"], r["session_id"]))

    async def client_scores(self, session_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Session id -> its ``session_client_scores`` row (a client's own score, never a reward)."""
        out: dict[str, dict[str, Any]] = {}
        async with self.engine.connect() as conn:
            for i in range(0, len(session_ids), _IN_CHUNK):
                q = select(CS).where(CS.c.session_id.in_(session_ids[i : i + _IN_CHUNK]))
                out.update({r["session_id"]: r for r in _dicts(await conn.execute(q))})
        return out

    async def jobs_newest_first(self) -> list[str]:
        """Every job id, the most recently created first (by its first session's ``created_at``)."""
        q = (
            select(JE.c.job_id)
            .group_by(JE.c.job_id)
            .order_by(func.min(JE.c.created_at).desc(), JE.c.job_id.desc())
        )
        async with self.engine.connect() as conn:
            return [str(j) for j in (await conn.execute(q)).scalars()]

    async def jobs_of_sessions(self, session_ids: Sequence[str]) -> dict[str, str]:
        """Session id -> job id, for those of ``session_ids`` that have a launcher row."""
        out: dict[str, str] = {}
        async with self.engine.connect() as conn:
            for i in range(0, len(session_ids), _IN_CHUNK):
                q = select(JE.c.env_id, JE.c.job_id).where(JE.c.env_id.in_(session_ids[i : i + _IN_CHUNK]))
                out.update({str(a): str(b) for a, b in (await conn.execute(q)).all()})
        return out
