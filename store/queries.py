"""Read-only queries of the trajectory viewer and the HTML report (docs/viewer.md); rows as plain
dicts. Tables newer versions add are read only when they exist (:meth:`optional_rows`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import and_, case, false, func, inspect, literal, literal_column, or_, select, text
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql import ColumnElement, Select

from store.models import (
    GatewaySession,
    JobEnvironment,
    JobLock,
    SessionAttempt,
    SessionClientScore,
    SessionStep,
    SessionWorkspace,
)
from store.session_result import COUNTED_EVAL_STATUSES, CUT_OFF_OUTCOMES, GRADER_BROKEN
from store.stepcodec import decode_rows

JE = JobEnvironment.__table__  # type: ignore[attr-defined]
_JL = JobLock.__table__  # type: ignore[attr-defined]
ST = SessionStep.__table__  # type: ignore[attr-defined]
GS = GatewaySession.__table__  # type: ignore[attr-defined]
CS = SessionClientScore.__table__  # type: ignore[attr-defined]
WS = SessionWorkspace.__table__  # type: ignore[attr-defined]
SA = SessionAttempt.__table__  # type: ignore[attr-defined]

VIEWER_INDEXES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("ix_viewer_job_order", "job_environments", ("job_id", "env_name", "case_id", "sample_index")),
    ("ix_viewer_job_reward", "job_environments", ("job_id", "reward")),
    ("ix_viewer_job_status", "job_environments", ("job_id", "status")),
)
"""(name, table, columns) of the indexes the viewer creates at start (paging a 100,000-session job
in its default order, by score and by status without a full sort)."""

OPTIONAL_TABLES = ("session_attempts", "session_workspaces")
"""Tables that newer versions add, shown on a session's page when present (any columns; rows
matched on ``env_id``, else ``session_id``; ordered by ``attempt`` when there is one)."""

SORTS: dict[str, tuple[ColumnElement[Any], ...]] = {
    "order": (JE.c.env_name, JE.c.case_id, JE.c.sample_index),
    "score": (JE.c.reward, JE.c.env_name, JE.c.case_id, JE.c.sample_index),
    "duration": (JE.c.duration_s,),
    "status": (JE.c.status,),
    "eval": (JE.c.eval_status,),
    "started": (JE.c.started_at,),
    "case": (JE.c.case_id, JE.c.sample_index),
    "env": (JE.c.env_name,),
}
"""Sort keys of the session list (``order``: env, case, sample)."""

JOBLESS_SORTS: dict[str, tuple[ColumnElement[Any], ...]] = {
    "created": (GS.c.created_at,),
    "updated": (GS.c.updated_at,),
    "steps": (GS.c.total_steps,),
    "status": (GS.c.status,),
    "route": (GS.c.route,),
}
"""Sort keys of the list of sessions without a job (``gateway_sessions`` columns)."""

PAGE_SIZE_MAX = 500


@dataclass(frozen=True)
class SessionFilter:
    """Filters of a job's session list; None means any. ``case_id`` matches exactly; scores are
    inclusive bounds (a bound excludes sessions without a score)."""

    env_name: str | None = None
    case_id: str | None = None
    llm_model: str | None = None
    status: str | None = None
    eval_status: str | None = None
    group_id: str | None = None
    score_min: float | None = None
    score_max: float | None = None

    def clauses(self) -> list[ColumnElement[bool]]:
        """The WHERE clauses of these filters."""
        out: list[ColumnElement[bool]] = []
        for name, column in (
            ("env_name", JE.c.env_name),
            ("case_id", JE.c.case_id),
            ("llm_model", JE.c.llm_model),
            ("status", JE.c.status),
            ("group_id", JE.c.group_id),
        ):
            value = getattr(self, name)
            if value is not None:
                out.append(column == value)
        if self.eval_status is not None:
            out.append(
                JE.c.eval_status.is_(None)
                if self.eval_status == "none"
                else JE.c.eval_status == self.eval_status
            )
        if self.score_min is not None:
            out.append(JE.c.reward >= self.score_min)
        if self.score_max is not None:
            out.append(JE.c.reward <= self.score_max)
        return out


@dataclass
class Page:
    """One page of rows, the number of rows matching overall, and the page's offset."""

    rows: list[dict[str, Any]]
    total: int
    offset: int
    limit: int
    extra: dict[str, Any] = field(default_factory=dict)


_LIST_COLUMNS = (
    JE.c.env_id,
    JE.c.job_id,
    JE.c.env_name,
    JE.c.case_id,
    JE.c.llm_model,
    JE.c.group_id,
    JE.c.sample_index,
    JE.c.status,
    JE.c.attempts,
    JE.c.reward,
    JE.c.eval_status,
    JE.c.eval_reason,
    JE.c.error_text,
    JE.c.duration_s,
    JE.c.finished,
    JE.c.started_at,
    JE.c.finished_at,
    JE.c.max_steps,
)


PASS_SCORE = 10 - 1e-9
"""A session passes when it is scored and its score is at least this (as ``rollout.results.report``)."""

OUTCOME_COUNTS = (
    "scored",
    "counted",
    "score_sum",
    "invalid",
    "grader_broken",
    "eval_error",
    "eval_timeout",
    "unevaluated",
    "rt_failed",
    "rt_errors",
    "rt_timeouts",
    "duration_sum",
    "duration_n",
)
"""What :meth:`ViewerQueries.case_outcomes` counts per case:
``scored`` (eval_status scored with a score); ``counted`` (a score, or a grading failure's 0: what
the mean is over, docs/trust-model.md) and ``score_sum`` over them; ``grader_broken``; ``invalid``,
``eval_error``, ``eval_timeout`` (eval_status invalid_reward | error | timeout), ``unevaluated``
(no eval_status, or skipped); runtime ``rt_failed``, ``rt_errors``, ``rt_timeouts`` (status
failed | error | timeout); ``duration_sum`` and ``duration_n`` over sessions with a duration."""


def _count(cond: ColumnElement[bool]) -> Any:
    return func.sum(case((cond, 1), else_=0))


def _scored() -> ColumnElement[bool]:
    return and_(JE.c.eval_status == "scored", JE.c.reward.is_not(None))


def _aware(at: datetime) -> datetime:
    """``at`` in UTC (SQLite gives naive datetimes back)."""
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def _counted() -> ColumnElement[bool]:
    return and_(JE.c.eval_status.in_(sorted(COUNTED_EVAL_STATUSES)), JE.c.reward.is_not(None))


def _passes() -> Any:
    return _count(and_(_scored(), JE.c.reward >= PASS_SCORE))


def _outcome_counts() -> list[Any]:
    return [
        func.count().label("n"),
        _passes().label("passes"),
        _count(_scored()).label("scored"),
        _count(_counted()).label("counted"),
        func.sum(case((_counted(), JE.c.reward), else_=None)).label("score_sum"),
        _count(JE.c.eval_status == GRADER_BROKEN).label("grader_broken"),
        _count(JE.c.eval_status == "invalid_reward").label("invalid"),
        _count(JE.c.eval_status == "error").label("eval_error"),
        _count(JE.c.eval_status == "timeout").label("eval_timeout"),
        _count(or_(JE.c.eval_status.is_(None), JE.c.eval_status == "skipped")).label("unevaluated"),
        _count(JE.c.status == "failed").label("rt_failed"),
        _count(JE.c.status == "error").label("rt_errors"),
        _count(JE.c.status == "timeout").label("rt_timeouts"),
        func.sum(JE.c.duration_s).label("duration_sum"),
        func.count(JE.c.duration_s).label("duration_n"),
    ]


def _index_names(conn: Any, table: str) -> set[str]:
    return {str(ix["name"]) for ix in inspect(conn).get_indexes(table)}


def _column_names(conn: Any, table: str) -> list[str]:
    return [str(c["name"]) for c in inspect(conn).get_columns(table)]


def _order(sort: str, descending: bool, *, backwards: bool = False) -> list[Any]:
    """The ORDER BY of the session list: :data:`SORTS` ``sort`` with NULLs last, then the session id
    (``backwards``: that order reversed). Raises KeyError for an unknown sort key."""
    order: list[Any] = []
    for k in SORTS[sort]:
        order.append(k.is_(None).desc() if backwards else k.is_(None))  # NULLs last
        order.append(k.desc() if descending != backwards else k.asc())
    order.append(JE.c.env_id.desc() if backwards else JE.c.env_id)
    return order


def _beyond(keys: list[tuple[Any, bool, Any]], session_id: str, *, before: bool) -> ColumnElement[bool]:
    """The rows of the session list sorted strictly before (``before``) or after the session whose
    sort keys hold these values: ``(column, descending, value)`` per key, as :func:`_order` sorts
    them (NULLs last either way, then the session id)."""
    terms: list[ColumnElement[bool]] = []
    equal: list[ColumnElement[bool]] = []
    for column, desc, value in keys:
        if value is None:  # only NULLs tie with it; values come before it, nothing after
            terms.append(and_(*equal, column.is_not(None) if before else false()))
            equal.append(column.is_(None))
            continue
        beyond = (column < value) if before != desc else (column > value)
        terms.append(and_(*equal, beyond if before else or_(beyond, column.is_(None))))
        equal.append(column == value)
    terms.append(and_(*equal, JE.c.env_id < session_id if before else JE.c.env_id > session_id))
    return or_(*terms)


class ViewerQueries:
    """The viewer's queries on one database (an async engine; the caller owns and disposes it)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self._tables: set[str] | None = None
        self._columns: dict[str, set[str]] = {}

    async def _all(self, stmt: Any) -> list[dict[str, Any]]:
        async with self.engine.connect() as conn:
            return [dict(r._mapping) for r in (await conn.execute(stmt)).all()]

    async def _one(self, stmt: Any) -> dict[str, Any] | None:
        rows = await self._all(stmt)
        return rows[0] if rows else None

    # ------------------------------------------------------------------ schema
    async def tables(self) -> set[str]:
        """The names of the tables of the database (read once)."""
        if self._tables is None:
            async with self.engine.connect() as conn:
                self._tables = set(await conn.run_sync(lambda c: inspect(c).get_table_names()))
        return self._tables

    async def columns(self, table: str) -> set[str]:
        """The column names of ``table`` as the database has them (read once per table)."""
        if table not in self._columns:
            async with self.engine.connect() as conn:
                self._columns[table] = set(await conn.run_sync(_column_names, table))
        return self._columns[table]

    async def _harness_column(self) -> list[Any]:
        """``[harness]`` when the store has that column (a store made before harnesses has not)."""
        return [JE.c.harness] if "harness" in await self.columns(JE.name) else []

    async def has_store(self) -> bool:
        """True when the database holds the launcher's tables."""
        return {JE.name, ST.name} <= await self.tables()

    async def ensure_indexes(self) -> list[str]:
        """Create the viewer's indexes that are missing (:data:`VIEWER_INDEXES`); returns their names.
        Only touches tables that exist."""
        tables = await self.tables()
        made: list[str] = []
        async with self.engine.begin() as conn:
            have: dict[str, set[str]] = {}
            for name, table, columns in VIEWER_INDEXES:
                if table not in tables:
                    continue
                if table not in have:
                    have[table] = await conn.run_sync(_index_names, table)
                if name in have[table]:
                    continue
                cols = ", ".join(f'"{c}"' for c in columns)
                await conn.execute(text(f'CREATE INDEX IF NOT EXISTS "{name}" ON "{table}" ({cols})'))
                made.append(name)
        return made

    # ------------------------------------------------------------------ jobs
    @staticmethod
    def _job_stats() -> Select[Any]:
        return select(
            JE.c.job_id,
            func.count().label("sessions"),
            func.sum(case((JE.c.finished.is_(True), 1), else_=0)).label("finished"),
            func.sum(case((JE.c.status == "running", 1), else_=0)).label("running"),
            func.sum(case((JE.c.status.in_(("error", "timeout")), 1), else_=0)).label("errors"),
            func.sum(case((JE.c.eval_status == "scored", 1), else_=0)).label("scored"),
            func.sum(case((JE.c.eval_status.isnot(None), 1), else_=0)).label("graded"),
            func.avg(case((_counted(), JE.c.reward), else_=None)).label("mean_score"),
            func.min(JE.c.created_at).label("created_at"),
            func.min(JE.c.started_at).label("started_at"),
            func.max(JE.c.finished_at).label("finished_at"),
        ).group_by(JE.c.job_id)

    async def jobs(self, job_id: str | None = None) -> list[dict[str, Any]]:
        """One row per job (only ``job_id``'s when given), newest first, with its counts, mean score
        (grading failures as their 0), times, envs and models."""
        stmt = self._job_stats().order_by(func.min(JE.c.created_at).desc())
        names_stmt = select(JE.c.job_id, JE.c.env_name, JE.c.llm_model).distinct()
        if job_id is not None:
            stmt = stmt.where(JE.c.job_id == job_id)
            names_stmt = names_stmt.where(JE.c.job_id == job_id)
        rows = await self._all(stmt)
        envs: dict[str, set[str]] = {}
        models: dict[str, set[str]] = {}
        for n in await self._all(names_stmt):
            envs.setdefault(n["job_id"], set()).add(n["env_name"])
            models.setdefault(n["job_id"], set()).add(n["llm_model"])
        for r in rows:
            r["envs"] = sorted(envs.get(r["job_id"], ()))
            r["models"] = sorted(models.get(r["job_id"], ()))
        return rows

    async def held_jobs(self, since: datetime) -> dict[str, tuple[str, int]]:
        """The jobs a launcher holds now, each with its holder's host and pid: a job lock whose
        heartbeat is not older than ``since``."""
        rows = await self._all(select(_JL.c.job_id, _JL.c.heartbeat_at, _JL.c.host, _JL.c.pid))
        return {r["job_id"]: (r["host"], int(r["pid"])) for r in rows if _aware(r["heartbeat_at"]) >= since}

    async def case_means(self) -> list[dict[str, Any]]:
        """Per (job, env, case): ``mean`` score over its counted sessions (the :meth:`jobs` mean's
        sessions; models merged), for the standard error of each job's mean score."""
        return await self._all(
            select(JE.c.job_id, JE.c.env_name, JE.c.case_id, func.avg(JE.c.reward).label("mean"))
            .where(_counted())
            .group_by(JE.c.job_id, JE.c.env_name, JE.c.case_id)
            .order_by(JE.c.job_id, JE.c.env_name, JE.c.case_id)
        )

    async def job(self, job_id: str) -> dict[str, Any] | None:
        """The :meth:`jobs` row of one job, or None."""
        rows = await self.jobs(job_id)
        return rows[0] if rows else None

    async def job_ids(self) -> list[str]:
        """Every job id, sorted."""
        return [r["job_id"] for r in await self._all(select(JE.c.job_id).distinct().order_by(JE.c.job_id))]

    async def status_counts(self, job_id: str) -> dict[str, int]:
        """Sessions of a job per ``status``."""
        rows = await self._all(
            select(JE.c.status, func.count().label("n")).where(JE.c.job_id == job_id).group_by(JE.c.status)
        )
        return {r["status"]: int(r["n"]) for r in rows}

    async def filter_values(self, job_id: str) -> dict[str, list[str]]:
        """The distinct env names, models, statuses and eval statuses of a job's sessions (for the
        filter menus; ``eval_status`` None is listed as ``none``)."""
        out: dict[str, list[str]] = {}
        for key, column in (
            ("env_name", JE.c.env_name),
            ("llm_model", JE.c.llm_model),
            ("status", JE.c.status),
            ("eval_status", JE.c.eval_status),
        ):
            rows = await self._all(select(column.label("v")).where(JE.c.job_id == job_id).distinct())
            out[key] = sorted("none" if r["v"] is None else str(r["v"]) for r in rows)
        return out

    async def session_page(
        self,
        job_id: str,
        flt: SessionFilter,
        *,
        sort: str = "order",
        descending: bool = False,
        offset: int = 0,
        limit: int = 50,
    ) -> Page:
        """One page of a job's sessions matching ``flt``, sorted by :data:`SORTS` ``sort`` then
        session id (NULLs last). KeyError for an unknown sort key."""
        order = _order(sort, descending)
        limit = max(1, min(limit, PAGE_SIZE_MAX))
        offset = max(0, offset)
        where = and_(JE.c.job_id == job_id, *flt.clauses())
        stmt: Select[Any] = (
            select(*_LIST_COLUMNS, *await self._harness_column())
            .where(where)
            .order_by(*order)
            .offset(offset)
            .limit(limit)
        )
        rows = await self._all(stmt)
        total = (await self._one(select(func.count().label("n")).select_from(JE).where(where)) or {"n": 0})[
            "n"
        ]
        if rows:
            counts = await self._all(
                select(
                    ST.c.session_id, func.count().label("steps"), func.sum(ST.c.total_tokens).label("tokens")
                )
                .where(ST.c.session_id.in_([r["env_id"] for r in rows]))
                .group_by(ST.c.session_id)
            )
            by_sid = {c["session_id"]: c for c in counts}
            for r in rows:
                c = by_sid.get(r["env_id"])
                r["steps"] = int(c["steps"]) if c else 0
                r["tokens"] = int(c["tokens"]) if c and c["tokens"] is not None else None
        return Page(rows=rows, total=int(total), offset=offset, limit=limit)

    async def neighbours(
        self,
        job_id: str,
        flt: SessionFilter,
        session_id: str,
        *,
        sort: str = "order",
        descending: bool = False,
    ) -> dict[str, Any] | None:
        """``position`` (from 1), ``total``, ``prev`` and ``next`` of ``session_id`` in
        :meth:`session_page`'s list; None when it is not in it."""
        keys = SORTS[sort]
        base = [JE.c.job_id == job_id, *flt.clauses()]
        cur = await self._one(
            select(*(k.label(f"k{i}") for i, k in enumerate(keys))).where(JE.c.env_id == session_id, *base)
        )
        if cur is None:
            return None
        values = [(k, descending, cur[f"k{i}"]) for i, k in enumerate(keys)]
        before, after = _beyond(values, session_id, before=True), _beyond(values, session_id, before=False)
        prev = await self._one(
            select(JE.c.env_id)
            .where(*base, before)
            .order_by(*_order(sort, descending, backwards=True))
            .limit(1)
        )
        nxt = await self._one(
            select(JE.c.env_id).where(*base, after).order_by(*_order(sort, descending)).limit(1)
        )
        counts = await self._one(
            select(_count(before).label("before"), func.count().label("total")).where(*base)
        )
        assert counts is not None
        return {
            "prev": prev["env_id"] if prev else None,
            "next": nxt["env_id"] if nxt else None,
            "position": int(counts["before"] or 0) + 1,
            "total": int(counts["total"]),
        }

    async def groups(self, job_id: str, *, offset: int = 0, limit: int = 50) -> Page:
        """The groups of a job by env, case and model, with their session counts, passes and mean
        score (grading failures as their 0)."""
        harness = await self._harness_column()
        keys = [JE.c.group_id, JE.c.env_name, JE.c.case_id, JE.c.llm_model, *harness]
        stmt = (
            select(
                *keys,
                func.count().label("n"),
                _count(JE.c.finished.is_(True)).label("finished"),
                _count(_scored()).label("scored"),
                _passes().label("passes"),
                func.avg(case((_counted(), JE.c.reward), else_=None)).label("mean_score"),
            )
            .where(JE.c.job_id == job_id)
            .group_by(*keys)
            .order_by(JE.c.env_name, JE.c.case_id, JE.c.llm_model, *harness, JE.c.group_id)
            .offset(max(0, offset))
            .limit(max(1, min(limit, PAGE_SIZE_MAX)))
        )
        rows = await self._all(stmt)
        for r in rows:
            r["passes"], r["scored"], r["finished"] = (
                int(r["passes"] or 0),
                int(r["scored"] or 0),
                int(r["finished"] or 0),
            )
        total = await self._one(
            select(func.count().label("n")).select_from(
                select(*keys).where(JE.c.job_id == job_id).group_by(*keys).subquery()
            )
        )
        return Page(rows=rows, total=int(total["n"]) if total else 0, offset=offset, limit=limit)

    async def group_scores(self, job_id: str, group_ids: Sequence[str]) -> dict[str, list[float]]:
        """The scores of the counted sessions (:meth:`groups`' ``mean_score``'s) of each of
        ``group_ids`` in a job, by sample index: ``{group_id: scores}`` (every id a key)."""
        out: dict[str, list[float]] = {gid: [] for gid in group_ids}
        if not group_ids:
            return out
        for r in await self._all(
            select(JE.c.group_id, JE.c.reward)
            .where(JE.c.job_id == job_id, JE.c.group_id.in_(list(group_ids)), _counted())
            .order_by(JE.c.group_id, JE.c.sample_index, JE.c.env_id)
        ):
            out[r["group_id"]].append(float(r["reward"]))
        return out

    async def workspace(self, session_id: str, *, archive: bool = True) -> dict[str, Any] | None:
        """The kept final workspace of a session (``archive`` bytes unless ``archive`` is false), or
        None (no row, or no table)."""
        if WS.name not in await self.tables():
            return None
        cols = [WS.c.status, WS.c.reason, WS.c.sha256, WS.c.file_count, WS.c.total_bytes, WS.c.manifest]
        row = await self._one(
            select(*cols, *([WS.c.archive] if archive else [])).where(WS.c.session_id == session_id)
        )
        if row is not None and isinstance(row.get("archive"), memoryview):
            row["archive"] = bytes(row["archive"])
        return row

    # ------------------------------------------------------------------ sessions without a job
    def _without_job(self) -> ColumnElement[bool]:
        return ~select(JE.c.env_id).where(JE.c.env_id == GS.c.session_id).exists()

    async def jobless_count(self) -> int:
        """How many gateway sessions have no launcher row (a client named the session by path or
        header: no job, never graded); 0 on a store without the gateway's table."""
        if GS.name not in await self.tables():
            return 0
        row = await self._one(select(func.count().label("n")).select_from(GS).where(self._without_job()))
        return int(row["n"]) if row else 0

    async def jobless_page(
        self, *, sort: str = "created", descending: bool = True, offset: int = 0, limit: int = 50
    ) -> Page:
        """One page of the gateway sessions without a launcher row, with ``steps`` and ``tokens``,
        sorted by :data:`JOBLESS_SORTS` ``sort``. KeyError for an unknown sort key."""
        if GS.name not in await self.tables():
            return Page(rows=[], total=0, offset=offset, limit=limit)
        offset, limit = max(0, offset), max(1, min(limit, PAGE_SIZE_MAX))
        order: list[Any] = []
        for k in JOBLESS_SORTS[sort]:
            order += [k.is_(None), k.desc() if descending else k.asc()]
        order.append(GS.c.session_id)
        rows = await self._all(
            select(GS).where(self._without_job()).order_by(*order).offset(offset).limit(limit)
        )
        if rows:
            counts = await self._all(
                select(
                    ST.c.session_id, func.count().label("steps"), func.sum(ST.c.total_tokens).label("tokens")
                )
                .where(ST.c.session_id.in_([r["session_id"] for r in rows]))
                .group_by(ST.c.session_id)
            )
            by_sid = {c["session_id"]: c for c in counts}
            for r in rows:
                c = by_sid.get(r["session_id"])
                r["steps"] = int(c["steps"]) if c else 0
                r["tokens"] = int(c["tokens"]) if c and c["tokens"] is not None else None
        return Page(rows=rows, total=await self.jobless_count(), offset=offset, limit=limit)

    # ------------------------------------------------------------------ one session
    async def session(self, session_id: str) -> dict[str, Any] | None:
        """The ``job_environments`` row of a session (every column), or None."""
        return await self._one(select(JE).where(JE.c.env_id == session_id))

    async def _steps(self, stmt: Any) -> list[dict[str, Any]]:
        """Step rows with every value in full (:func:`store.stepcodec.decode_rows`; a store made
        before the ``encoding`` column has nothing to rebuild)."""
        rows = await self._all(stmt)
        if rows and "encoding" in rows[0]:
            decode_rows(rows)
        return rows

    async def steps(self, session_id: str) -> list[dict[str, Any]]:
        """Every recorded step of a session (every column), in call order."""
        return await self._steps(select(ST).where(ST.c.session_id == session_id).order_by(ST.c.seq))

    async def step(self, session_id: str, seq: int) -> dict[str, Any] | None:
        """One recorded step (every column) by session id and ``seq``, or None."""
        row = await self._one(select(ST).where(ST.c.session_id == session_id, ST.c.seq == seq))
        if row is None or row.get("encoding") is None:
            return row
        rows = await self._steps(select(ST).where(ST.c.session_id == session_id))  # its bases too
        return next(r for r in rows if r["seq"] == seq)

    async def earlier_attempt_steps(self, session_id: str) -> list[dict[str, Any]]:
        """Steps of the session's earlier attempts (moved to ``<id>~a<n>`` when a job is resumed),
        ordered by that id, then ``seq``."""
        prefix = session_id.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "~a%"
        return await self._steps(
            select(ST).where(ST.c.session_id.like(prefix, escape="\\")).order_by(ST.c.session_id, ST.c.seq)
        )

    async def gateway_session(self, session_id: str) -> dict[str, Any] | None:
        """The gateway's state of a session (budget, steps used, close reason), or None."""
        if GS.name not in await self.tables():
            return None
        return await self._one(select(GS).where(GS.c.session_id == session_id))

    async def client_score(self, session_id: str) -> dict[str, Any] | None:
        """The score a client gave the session (``session_client_scores``: score, reason,
        provenance, recorded_at), or None; never a grader's reward."""
        if CS.name not in await self.tables():
            return None
        return await self._one(select(CS).where(CS.c.session_id == session_id))

    async def optional_rows(self, session_id: str) -> dict[str, list[dict[str, Any]]]:
        """Rows of :data:`OPTIONAL_TABLES` that exist and have a ``session_id`` column, for one
        session: ``{table: rows}`` (tables without rows are left out)."""
        out: dict[str, list[dict[str, Any]]] = {}
        present = await self.tables()
        for name in OPTIONAL_TABLES:
            if name not in present:
                continue
            cols = await self.columns(name)
            key = next((k for k in ("env_id", "session_id") if k in cols), None)
            if key is None:
                continue
            order = (
                ' ORDER BY "attempt"'
                if "attempt" in cols
                else (" ORDER BY rowid" if self.engine.dialect.name == "sqlite" else "")
            )
            async with self.engine.connect() as conn:
                res = await conn.execute(
                    text(f'SELECT * FROM "{name}" WHERE "{key}" = :sid{order}'), {"sid": session_id}
                )
                rows = [
                    {
                        k: f"({len(v)} bytes)" if isinstance(v, bytes | memoryview) else v
                        for k, v in r._mapping.items()
                    }
                    for r in res.all()
                ]  # no archive blobs in pages
            if rows:
                out[name] = rows
        return out

    async def group(self, group_id: str) -> list[dict[str, Any]]:
        """The sessions of a group (every column), by job then sample index."""
        return await self._all(
            select(JE).where(JE.c.group_id == group_id).order_by(JE.c.job_id, JE.c.sample_index)
        )

    async def steps_of(self, session_ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
        """Every step of several sessions: ``{session_id: steps in call order}``."""
        out: dict[str, list[dict[str, Any]]] = {sid: [] for sid in session_ids}
        if not session_ids:
            return out
        for row in await self._steps(
            select(ST).where(ST.c.session_id.in_(list(session_ids))).order_by(ST.c.session_id, ST.c.seq)
        ):
            out[row["session_id"]].append(row)
        return out

    async def progress(self, session_id: str) -> dict[str, Any] | None:
        """A session's status, finished flag and step count (what a live page polls), or None."""
        row = await self._one(
            select(JE.c.status, JE.c.finished, JE.c.reward).where(JE.c.env_id == session_id)
        )
        if row is None:
            return None
        n = await self._one(
            select(func.count().label("n")).select_from(ST).where(ST.c.session_id == session_id)
        )
        row["steps"] = int(n["n"]) if n else 0
        return row

    # ------------------------------------------------------------------ job-wide numbers (report, compare)
    async def finished_sessions(self, job_id: str) -> list[dict[str, Any]]:
        """The finished sessions of a job with their step count and token sums (None when no step
        reported usage), ordered by env, case, sample."""
        tokens = (
            select(
                ST.c.session_id,
                func.count().label("steps"),
                func.sum(ST.c.prompt_tokens).label("prompt_tokens"),
                func.sum(ST.c.completion_tokens).label("completion_tokens"),
                func.sum(ST.c.total_tokens).label("total_tokens"),
            )
            .where(ST.c.job_id == job_id)
            .group_by(ST.c.session_id)
            .subquery()
        )
        stmt = (
            select(
                *_LIST_COLUMNS,
                tokens.c.steps,
                tokens.c.prompt_tokens,
                tokens.c.completion_tokens,
                tokens.c.total_tokens,
            )
            .select_from(JE.outerjoin(tokens, tokens.c.session_id == JE.c.env_id))
            .where(JE.c.job_id == job_id, JE.c.finished.is_(True))
            .order_by(JE.c.env_name, JE.c.case_id, JE.c.sample_index)
        )
        return await self._all(stmt)

    async def case_outcomes(self, job_id: str) -> list[dict[str, Any]]:
        """The finished sessions of a job counted per (env_name, llm_model, case_id), in that order:
        :data:`OUTCOME_COUNTS` plus ``n`` (sessions) and ``passes`` (for comparing two jobs)."""
        stmt = (
            select(JE.c.env_name, JE.c.llm_model, JE.c.case_id, *_outcome_counts())
            .where(JE.c.job_id == job_id, JE.c.finished.is_(True))
            .group_by(JE.c.env_name, JE.c.llm_model, JE.c.case_id)
            .order_by(JE.c.env_name, JE.c.llm_model, JE.c.case_id)
        )
        return await self._all(stmt)

    async def summary_rows(self, job_id: str) -> list[dict[str, Any]]:
        """The finished sessions of a job with the columns the launcher's summary reads, ordered
        by env, case, sample."""
        cols = [
            JE.c.env_id,
            JE.c.job_id,
            JE.c.env_name,
            JE.c.case_id,
            JE.c.group_id,
            JE.c.llm_model,
            JE.c.sample_index,
            JE.c.status,
            JE.c.reward,
            JE.c.eval_status,
            JE.c.duration_s,
            JE.c.attempts,
        ]
        if "outcome" in await self.columns(JE.name):
            cols.append(literal_column('"outcome"').label("outcome"))
        if await self.columns(SA.name):  # retried: an earlier attempt failed (one a stop cut off is none)
            earlier = (
                (SA.c.env_id == JE.c.env_id)
                & (SA.c.attempt < JE.c.attempts)
                & SA.c.outcome.not_in(sorted(CUT_OFF_OUTCOMES))
            )
            cols.append(select(SA.c.env_id).where(earlier).exists().label("retried"))
        cols += await self._harness_column()
        stmt = (
            select(*cols)
            .select_from(JE)
            .where(JE.c.job_id == job_id, JE.c.finished.is_(True))
            .order_by(JE.c.env_name, JE.c.case_id, JE.c.sample_index)
        )
        return await self._all(stmt)

    async def step_timings(self, job_id: str, limit: int = 200_000) -> list[dict[str, Any]]:
        """Per-step ``env_name``, ``llm_model``, ``status``, ``latency_ms``, ``ttft_ms`` and token
        counts of a job's steps (at most ``limit`` rows, by insertion order)."""
        stmt = (
            select(
                ST.c.env_name,
                ST.c.llm_model,
                ST.c.status,
                ST.c.latency_ms,
                ST.c.ttft_ms,
                ST.c.prompt_tokens,
                ST.c.completion_tokens,
            )
            .where(ST.c.job_id == job_id)
            .limit(limit)
        )
        return await self._all(stmt)

    async def failure_reasons(self, job_id: str, limit: int = 50) -> list[dict[str, Any]]:
        """Why sessions of a job did not pass: one row per (env, eval_status, status, reason) with
        its count, an example session and the lowest score, most frequent first."""
        reason = func.coalesce(JE.c.eval_reason, JE.c.error_text, literal("(no reason given)"))
        stmt = (
            select(
                JE.c.env_name,
                JE.c.eval_status,
                JE.c.status,
                reason.label("reason"),
                func.count().label("n"),
                func.min(JE.c.env_id).label("example"),
                func.min(JE.c.reward).label("min_score"),
            )
            .where(
                JE.c.job_id == job_id,
                JE.c.finished.is_(True),
                or_(
                    JE.c.reward.is_(None),
                    JE.c.reward < 10 - 1e-9,
                    JE.c.eval_status != "scored",
                    JE.c.status.in_(("error", "timeout")),
                ),
            )
            .group_by(JE.c.env_name, JE.c.eval_status, JE.c.status, reason)
            .order_by(func.count().desc(), JE.c.env_name)
            .limit(limit)
        )
        return await self._all(stmt)

    async def worst_sessions(self, job_id: str, limit: int = 5) -> list[dict[str, Any]]:
        """The finished sessions of a job with the lowest scores (unscored ones first: they carry
        no score at all), each with its reason."""
        stmt = (
            select(*_LIST_COLUMNS)
            .where(JE.c.job_id == job_id, JE.c.finished.is_(True))
            .order_by(JE.c.reward.is_not(None), JE.c.reward, JE.c.env_name, JE.c.case_id, JE.c.sample_index)
            .limit(limit)
        )
        return await self._all(stmt)
