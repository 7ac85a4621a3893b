"""The launcher's rows: its sessions (``job_environments``), their attempts (``session_attempts``)
and kept workspaces (``session_workspaces``), a session's steps moved aside for a retry, the
evaluation written back (:func:`write_evaluation`: both tables, one function), and the reads of a job. Called by ``rollout``
(the job, its attempts, the regrade, the records) through :class:`store.Store`.

SQL: every write is SQLAlchemy Core on the tables, run as an operation of the group commit
(``store.group``: many sessions' writes, one transaction). Reads that give whole rows select the
SQLModel classes (``select(JobEnvironment)``), the others Core columns.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Table, bindparam, insert, inspect
from sqlalchemy import select as sa_select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session
from sqlmodel import SQLModel, col, select

from store.connections import Connections
from store.feed import append_if_ready, backfill, unfinished_group
from store.models import (
    GatewaySession,
    JobEnvironment,
    SessionAttempt,
    SessionStep,
    SessionWorkspace,
    attempt_session_id,
    utcnow,
)
from store.session_result import SessionResult
from store.stepcodec import decode_rows

_JE: Table = JobEnvironment.__table__  # type: ignore[attr-defined]
_SA: Table = SessionAttempt.__table__  # type: ignore[attr-defined]
_SW: Table = SessionWorkspace.__table__  # type: ignore[attr-defined]
_ST: Table = SessionStep.__table__  # type: ignore[attr-defined]
_GS: Table = GatewaySession.__table__  # type: ignore[attr-defined]

# built once (the columns an UPDATE sets are the keys of the parameters it is run with; ``b_*``
# are the WHERE values)
_UPDATE_JE = _JE.update().where(_JE.c.env_id == bindparam("b_sid"))
_MOVE_STEPS = _ST.update().where(_ST.c.session_id == bindparam("b_sid"))
_DROP_GATEWAY_SESSION = _GS.delete().where(_GS.c.session_id == bindparam("b_sid"))
_TRAJECTORY = (
    select(SessionStep)
    .where(col(SessionStep.session_id) == bindparam("b_sid"))
    .order_by(col(SessionStep.seq))
)
_POLICY_VERSIONS = select(_ST.c.policy_version).where(_ST.c.session_id == bindparam("b_sid")).distinct()
_COLUMN_OF: dict[type, tuple[tuple[str, str], ...]] = {}


# The one write of a session's evaluation. A reward lives in two tables: the session row
# (job_environments.reward, eval_status, eval_reason, eval_detail: what the report, the viewer and
# the feed read) and the session's last step (session_steps.reward and step_reward, the outcome in
# meta_json["evaluation"]: what a trainer reads with the trajectory). The end of a session in a job
# and a regrade both write it through write_evaluation, so the two tables never disagree.
_SESSION = (
    sa_select(_JE.c.reward, _JE.c.eval_status, _JE.c.eval_reason, _JE.c.eval_detail, _JE.c.eval_history)
    .where(_JE.c.env_id == bindparam("b_sid"))
    .with_for_update()
)
_LAST_STEP = (
    sa_select(_ST.c.record_id, _ST.c.meta_json)
    .where(_ST.c.session_id == bindparam("b_sid"))
    .order_by(_ST.c.seq.desc())
    .limit(1)
)
_UPDATE_STEP = _ST.update().where(_ST.c.record_id == bindparam("b_rid"))


def write_evaluation(
    conn: Connection,
    session_id: str,
    *,
    reward: float | None,
    eval_meta: dict[str, Any] | None,
    columns: Mapping[str, Any],
    step_columns: Mapping[str, Any] | None = None,
    keep_previous: bool = False,
) -> dict[str, Any] | None:
    """Write an evaluation of ``session_id`` to BOTH tables, in the caller's write transaction.

    ``job_environments`` (the session row, locked first): ``reward`` and ``columns`` (the other
    ``job_environments`` columns to set, e.g. ``eval_status``). The session's last step (by
    ``seq``), when it has one: ``reward`` and ``step_reward`` = ``reward``, ``eval_meta`` as
    ``meta_json["evaluation"]`` (left as it was when None) and ``step_columns``.

    ``keep_previous`` (a regrade): the session's previous evaluation (``eval_status``, ``reward``,
    ``eval_reason``, ``eval_detail``, with ``replaced_at`` in ISO UTC) is appended to
    ``eval_history`` unless it was never evaluated, and the step's previous
    ``meta_json["evaluation"]`` to ``meta_json["evaluation_history"]``. Returns that previous
    entry (None when there was none, always None without ``keep_previous``). Raises KeyError for a
    session without a ``job_environments`` row (nothing written then)."""
    key = {"b_sid": session_id}
    row = conn.execute(_SESSION, key).one_or_none()
    if row is None:
        raise KeyError(f"no session {session_id!r}")
    values = {**columns, "reward": reward}
    previous: dict[str, Any] | None = None
    if keep_previous:
        history = list(row.eval_history or [])
        if row.eval_status is not None or row.reward is not None:
            previous = {
                "eval_status": row.eval_status,
                "reward": row.reward,
                "eval_reason": row.eval_reason,
                "eval_detail": row.eval_detail,
                "replaced_at": utcnow().isoformat(),
            }
            history.append(previous)
        values["eval_history"] = history or None
    last = conn.execute(_LAST_STEP, key).one_or_none()
    if last is not None:
        meta = dict(last.meta_json or {})
        if keep_previous and "evaluation" in meta:
            meta["evaluation_history"] = [*meta.get("evaluation_history", []), meta["evaluation"]]
        if eval_meta is not None:
            meta["evaluation"] = eval_meta
        conn.execute(
            _UPDATE_STEP,
            {
                **(step_columns or {}),
                "reward": reward,
                "step_reward": reward,
                "meta_json": meta,
                "b_rid": last.record_id,
            },
        )
    conn.execute(_UPDATE_JE, {**values, "b_sid": session_id})
    return previous


def _column_values(obj: SQLModel) -> dict[str, Any]:
    """Column name -> value of a table model instance (``session_id`` is the column ``env_id``
    of some tables): what an ORM flush of ``obj`` would write."""
    names = _COLUMN_OF.get(type(obj))
    if names is None:
        names = tuple((a.key, a.columns[0].name) for a in inspect(type(obj)).mapper.column_attrs)
        _COLUMN_OF[type(obj)] = names
    return {c: getattr(obj, k) for k, c in names}


def _check_columns(values: Mapping[str, Any]) -> None:
    """ValueError naming the keys that are not columns of ``job_environments`` (an UPDATE run
    with them would skip them silently)."""
    if unknown := sorted(k for k in values if k not in _JE.c or k == "env_id"):
        raise ValueError(f"job_environments has no column {', '.join(unknown)} (values: {sorted(values)})")


def _insert_new(conn: Connection, rows: list[dict[str, Any]]) -> int:
    """Insert the ``job_environments`` rows (column dicts) whose ``env_id`` is not taken; returns how many."""
    have = set(
        conn.execute(select(_JE.c.env_id).where(_JE.c.env_id.in_([r["env_id"] for r in rows]))).scalars()
    )
    new = [r for r in rows if r["env_id"] not in have]
    if new:
        conn.execute(insert(_JE), new)
    return len(new)


def _versions(found: Iterable[int | None]) -> list[int | None]:
    """Distinct policy versions, None first, then ascending."""
    vs = set(found)
    return ([None] if None in vs else []) + sorted(v for v in vs if v is not None)


class LauncherRows:
    """The launcher's statements, run on one store's connections (writes through its group
    commit)."""

    def __init__(self, db: Connections) -> None:
        self._db = db
        self._upserts: dict[tuple[str, bool], Any] = {}

    def _upsert(self, table: Table, *, replace: bool) -> Any:
        """``INSERT`` of every column of ``table`` that replaces the row with the same primary
        key (``replace``) or leaves it (else); built once per table."""
        key = (table.name, replace)
        stmt = self._upserts.get(key)
        if stmt is None:
            ins = (sqlite_insert if self._db.kind == "sqlite" else pg_insert)(table)
            pk = [c.name for c in table.primary_key.columns]
            stmt = (
                ins.on_conflict_do_update(
                    index_elements=pk,
                    set_={c.name: ins.excluded[c.name] for c in table.columns if c.name not in pk},
                )
                if replace
                else ins.on_conflict_do_nothing(index_elements=pk)
            )
            self._upserts[key] = stmt
        return stmt

    # ------------------------------------------------------------------ writes
    async def add_job_sessions(self, rows: Iterable[JobEnvironment], chunk: int = 500) -> int:
        """Insert the rows whose session does not exist yet, in one transaction of their own
        (``chunk`` rows per statement batch; ``rows`` never held whole); returns how many."""
        inserted = 0
        async with self._db.write_lock, self._db.writer.begin() as conn:
            batch: list[dict[str, Any]] = []
            for row in rows:
                batch.append(_column_values(row))
                if len(batch) >= chunk:
                    inserted += await conn.run_sync(_insert_new, batch)
                    batch = []
            if batch:
                inserted += await conn.run_sync(_insert_new, batch)
        return inserted

    async def attach_sessions(self, rows: Sequence[JobEnvironment]) -> None:
        """Make sessions recorded without a job sessions of one: their ``job_environments`` rows
        and their steps stamped, in one transaction. ValueError for one with a launcher row."""
        values = [_column_values(r) for r in rows]

        def op(conn: Connection) -> None:
            taken = conn.execute(
                sa_select(_JE.c.env_id, _JE.c.job_id).where(_JE.c.env_id.in_([v["env_id"] for v in values]))
            ).first()
            if taken is not None:
                raise ValueError(f"session {taken[0]!r} is already in job {taken[1]!r}")
            conn.execute(insert(_JE), values)
            for v in values:
                conn.execute(
                    _MOVE_STEPS,
                    {
                        "b_sid": v["env_id"],
                        "job_id": v["job_id"],
                        "env_name": v["env_name"],
                        "group_id": v["group_id"],
                    },
                )

        async with self._db.write_lock, self._db.writer.begin() as conn:
            await conn.run_sync(op)

    async def reset_for_retry(self, session_id: str, attempt: int) -> int:
        """Move the session's steps to ``attempt_session_id(session_id, attempt)`` (not trainable)
        and drop its gateway row (call once the gateway answered the close); returns how many moved."""

        def op(s: Session) -> int:
            conn = s.connection()
            res = conn.execute(
                _MOVE_STEPS,
                {
                    "b_sid": session_id,
                    "session_id": attempt_session_id(session_id, attempt),
                    "is_trainable": False,
                },
            )
            conn.execute(_DROP_GATEWAY_SESSION, {"b_sid": session_id})
            return int(res.rowcount or 0)

        return await self._db.group.run(op)

    async def record_attempt(self, attempt: SessionAttempt, *, if_missing: bool = False) -> bool:
        """Write one attempt row (replace, or with ``if_missing`` only insert); whether written."""
        values = _column_values(attempt)
        stmt = self._upsert(_SA, replace=not if_missing)

        def op(s: Session) -> bool:
            return bool(s.connection().execute(stmt, values).rowcount)

        return await self._db.group.run(op)

    async def update_job_session(self, session_id: str, **values: Any) -> None:
        """Set columns of one ``job_environments`` row (ValueError for a key that is not one)."""
        _check_columns(values)
        params = {**values, "b_sid": session_id}

        def op(s: Session) -> None:
            s.connection().execute(_UPDATE_JE, params)

        await self._db.group.run(op)

    async def finish_job_session(self, session_id: str, result: SessionResult) -> None:
        """In one transaction: ``result`` as the evaluation
        (:func:`write_evaluation`; the last step also marked terminal and
        session-completed) with the result's other columns plus ``finished`` and ``finished_at``
        on the session row, and the group's feed entry when this finishes its last unfinished
        session (:func:`store.feed.append_if_ready`). KeyError for an unknown session."""

        def op(s: Session) -> None:
            conn = s.connection()
            group = unfinished_group(conn, session_id)
            write_evaluation(
                conn,
                session_id,
                reward=result.reward,
                eval_meta=result.evaluation,
                columns={**result.columns(), "finished": True, "finished_at": utcnow()},
                step_columns={"is_terminal": True, "is_session_completed": True},
            )
            if group is not None:
                append_if_ready(conn, *group)

        await self._db.group.run(op)

    async def record_regrade(
        self,
        session_id: str,
        *,
        reward: float | None,
        eval_status: str,
        eval_reason: str | None,
        eval_detail: dict[str, Any] | None,
        eval_meta: dict[str, Any],
    ) -> dict[str, Any] | None:
        """A new evaluation in one transaction, the previous one kept
        (:func:`write_evaluation` with ``keep_previous``); returns the previous
        entry or None, raises KeyError for an unknown session."""
        columns = {"eval_status": eval_status, "eval_reason": eval_reason, "eval_detail": eval_detail}

        def op(s: Session) -> dict[str, Any] | None:
            return write_evaluation(
                s.connection(),
                session_id,
                reward=reward,
                eval_meta=eval_meta,
                columns=columns,
                keep_previous=True,
            )

        return await self._db.group.run(op)

    async def backfill_feed(self, job_id: str) -> int:
        """:func:`store.feed.backfill` in one transaction; returns how many entries."""
        return int(await self._db.group.run(lambda s: backfill(s, job_id)))

    async def save_workspace_archive(self, row: SessionWorkspace) -> None:
        """Insert the kept workspace of ``row.session_id``, replacing an earlier one."""
        values, stmt = _column_values(row), self._upsert(_SW, replace=True)

        def op(s: Session) -> None:
            s.connection().execute(stmt, values)

        await self._db.group.run(op)

    # ------------------------------------------------------------------ reads
    async def job_attempts(self, job_id: str) -> dict[str, list[SessionAttempt]]:
        """Every attempt row of a job: session id -> its attempts in order."""
        q = (
            select(SessionAttempt)
            .where(col(SessionAttempt.job_id) == job_id)
            .order_by(col(SessionAttempt.session_id), col(SessionAttempt.attempt))
        )
        out: dict[str, list[SessionAttempt]] = {}
        async with self._db.read_session() as s:
            for a in (await s.execute(q)).scalars().all():
                out.setdefault(a.session_id, []).append(a)
        return out

    async def job_sessions(self, job_id: str, *, unfinished_only: bool = False) -> list[JobEnvironment]:
        """The session rows of a job, ordered by env, case, sample."""
        q = select(JobEnvironment).where(col(JobEnvironment.job_id) == job_id)
        if unfinished_only:
            q = q.where(col(JobEnvironment.finished).is_(False))
        q = q.order_by(
            col(JobEnvironment.env_name), col(JobEnvironment.case_id), col(JobEnvironment.sample_index)
        )
        async with self._db.read_session() as s:
            return list((await s.execute(q)).scalars().all())

    async def job_exists(self, job_id: str) -> bool:
        """Whether the job has any session row."""
        q = select(_JE.c.env_id).where(_JE.c.job_id == job_id).limit(1)
        async with self._db.reader.connect() as conn:
            return (await conn.execute(q)).first() is not None

    async def job_session_ids(self, job_id: str, *, finished_only: bool = False) -> AsyncIterator[str]:
        """The session ids of a job in the order of :meth:`job_sessions`, streamed."""
        q = select(_JE.c.env_id).where(_JE.c.job_id == job_id)
        if finished_only:
            q = q.where(_JE.c.finished.is_(True))
        q = q.order_by(_JE.c.env_name, _JE.c.case_id, _JE.c.sample_index)
        async with self._db.reader.connect() as conn:
            result = await conn.stream(q)
            async for (sid,) in result:
                yield sid

    async def job_sessions_by_id(self, session_ids: Sequence[str]) -> list[JobEnvironment]:
        """The session rows of ``session_ids`` (unknown ones left out), in that order."""
        rows: dict[str, JobEnvironment] = {}
        async with self._db.read_session() as s:
            for i in range(0, len(session_ids), 500):
                q = select(JobEnvironment).where(col(JobEnvironment.session_id).in_(session_ids[i : i + 500]))
                rows.update((r.session_id, r) for r in (await s.execute(q)).scalars().all())
        return [rows[sid] for sid in session_ids if sid in rows]

    async def session_attempts(self, session_ids: Sequence[str]) -> dict[str, list[SessionAttempt]]:
        """The attempt rows of ``session_ids``: session id -> its attempts in order."""
        out: dict[str, list[SessionAttempt]] = {}
        async with self._db.read_session() as s:
            for i in range(0, len(session_ids), 500):
                q = (
                    select(SessionAttempt)
                    .where(col(SessionAttempt.session_id).in_(session_ids[i : i + 500]))
                    .order_by(col(SessionAttempt.session_id), col(SessionAttempt.attempt))
                )
                for a in (await s.execute(q)).scalars().all():
                    out.setdefault(a.session_id, []).append(a)
        return out

    async def trajectory(self, session_id: str) -> list[SessionStep]:
        """Every step of a session in ``seq`` order, every value in full
        (:func:`store.stepcodec.decode_rows`); on SQLite read in the group commit's thread."""
        q, key = _TRAJECTORY, {"b_sid": session_id}
        reader = self._db.sync_reader
        if reader is not None:

            def read() -> list[SessionStep]:
                with Session(reader, expire_on_commit=False) as s:  # closing it ends the read transaction
                    return list(s.execute(q, key).scalars().all())

            rows = await asyncio.get_running_loop().run_in_executor(self._db.group_executor(), read)
        else:
            async with self._db.read_session() as s:
                rows = list((await s.execute(q, key)).scalars().all())
        decode_rows(rows)
        return rows

    async def policy_versions(self, session_id: str) -> list[int | None]:
        """The distinct ``policy_version`` values of a session's steps, None first."""
        return _versions(
            await self._db.read_sync(
                lambda c: c.execute(_POLICY_VERSIONS, {"b_sid": session_id}).scalars().all()
            )
        )

    async def policy_version_spans(self, job_id: str) -> dict[str, list[int | None]]:
        """The sessions of a job whose steps span more than one policy version."""
        q = select(_ST.c.session_id, _ST.c.policy_version).where(_ST.c.job_id == job_id).distinct()
        by_sid: dict[str, set[int | None]] = {}
        async with self._db.reader.connect() as conn:
            for sid, version in (await conn.execute(q)).all():
                by_sid.setdefault(sid, set()).add(version)
        return {sid: _versions(vs) for sid, vs in sorted(by_sid.items()) if len(vs) > 1}

    async def workspace_archive(self, session_id: str) -> SessionWorkspace | None:
        """The kept workspace of a session (archive bytes included), or None."""
        async with self._db.read_session() as s:
            return await s.get(SessionWorkspace, session_id)
