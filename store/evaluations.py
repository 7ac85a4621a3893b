"""The one write of a session's evaluation. A reward lives in two tables: the launcher's session
row (``job_environments.reward``, with ``eval_status``, ``eval_reason``, ``eval_detail``: what the
report, the viewer and the feed read) and the session's last step (``session_steps.reward`` and
``step_reward``, the outcome in ``meta_json["evaluation"]``: what a trainer reads with the
trajectory). Both the end of a session in a job (:meth:`store.Store.finish_job_session`) and a
regrade (:meth:`store.Store.record_regrade`) write it through :func:`write_evaluation`, so the two
tables never disagree (docs/storage.md, "Who writes which table")."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection, Table, bindparam, select

from store.models import JobEnvironment, SessionStep, utcnow

_JE: Table = JobEnvironment.__table__  # type: ignore[attr-defined]
_ST: Table = SessionStep.__table__  # type: ignore[attr-defined]

_SESSION = (select(_JE.c.reward, _JE.c.eval_status, _JE.c.eval_reason, _JE.c.eval_detail, _JE.c.eval_history)
            .where(_JE.c.env_id == bindparam("b_sid")).with_for_update())
_LAST_STEP = (select(_ST.c.record_id, _ST.c.meta_json).where(_ST.c.session_id == bindparam("b_sid"))
              .order_by(_ST.c.seq.desc()).limit(1))
_UPDATE_STEP = _ST.update().where(_ST.c.record_id == bindparam("b_rid"))
_UPDATE_SESSION = _JE.update().where(_JE.c.env_id == bindparam("b_sid"))


def write_evaluation(conn: Connection, session_id: str, *, reward: float | None, eval_meta: dict[str, Any] | None,
                     columns: Mapping[str, Any], step_columns: Mapping[str, Any] | None = None,
                     keep_previous: bool = False) -> dict[str, Any] | None:
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
            previous = {"eval_status": row.eval_status, "reward": row.reward, "eval_reason": row.eval_reason,
                        "eval_detail": row.eval_detail, "replaced_at": utcnow().isoformat()}
            history.append(previous)
        values["eval_history"] = history or None
    last = conn.execute(_LAST_STEP, key).one_or_none()
    if last is not None:
        meta = dict(last.meta_json or {})
        if keep_previous and "evaluation" in meta:
            meta["evaluation_history"] = [*meta.get("evaluation_history", []), meta["evaluation"]]
        if eval_meta is not None:
            meta["evaluation"] = eval_meta
        conn.execute(_UPDATE_STEP, {**(step_columns or {}), "reward": reward, "step_reward": reward,
                                    "meta_json": meta, "b_rid": last.record_id})
    conn.execute(_UPDATE_SESSION, {**values, "b_sid": session_id})
    return previous
