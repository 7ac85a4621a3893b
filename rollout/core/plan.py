"""The plan of a job: envs x cases x harnesses x models x samples -> one ``job_environments`` row
per session (its group, its case row), written as they are made; a resumed job's rows to run
again; the rows read back a page at a time."""

from __future__ import annotations

import difflib
import logging
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence

from pydantic import BaseModel, ConfigDict

from rollout.core.envs import Case, EnvConfig, case_of
from rollout.core.outcomes import INFRA_CLASSES
from rollout.core.session_ids import SessionIds
from rollout.core.setup import SetupError
from store import JobEnvironment, SessionAttempt, Store

log = logging.getLogger(__name__)


async def plan_sessions(
    store: Store,
    job_id: str,
    models: list[str],
    envs: list[tuple[EnvConfig, list[Case]]],
    harnesses: list[str | None] | None = None,
    *,
    resume: bool = False,
    group_size: int | None = None,
    max_steps: int | None = None,
    rerun_launcher_errors: bool = False,
) -> list[JobEnvironment]:
    """The session rows to run: a new job's rows (inserted: every env x case x harness x model x
    sample, ``harnesses`` None or ``[None]`` meaning the env's own runtime), or with ``resume`` the rows of an
    existing job that are unfinished or ended in an infrastructure failure (reopened; the
    launcher archives their last attempt's steps before the next attempt, whose number goes on
    from the attempts already used); one that ended in ``launcher_error`` only with
    ``rerun_launcher_errors``. Raises SetupError for a resume of an unknown job, or a new
    job whose id is taken."""
    if resume:
        return await _resume_rows(store, job_id, envs, rerun_launcher_errors)
    await _check_new(store, job_id)
    rows = session_rows(job_id, models, envs, group_size, max_steps, harnesses or [None])
    await store.add_job_sessions(rows)
    return rows


class PlannedJob(BaseModel):
    """The sessions a job runs, without their rows: their ids in run order (``SessionIds``),
    sessions per env, and the routes and harnesses they use."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    ids: SessionIds
    per_env: dict[str, int]
    models: list[str]
    harnesses: list[str]


async def plan_job(
    store: Store,
    job_id: str,
    models: list[str],
    envs: list[tuple[EnvConfig, list[Case]]],
    harnesses: list[str | None],
    *,
    resume: bool = False,
    group_size: int | None = None,
    max_steps: int | None = None,
    rerun_launcher_errors: bool = False,
    graded: bool | None = None,
) -> PlannedJob:
    """``plan_sessions`` for ``run_job``: a new job's rows are written as they are made (one
    transaction) and only their ids are kept, so planning 100k sessions holds no 100k rows.
    Same rows, order and errors as ``plan_sessions``. ``graded`` False: a resume of a job whose
    sessions were graded is refused (its new sessions would go ungraded)."""
    ids = SessionIds()
    per_env: Counter[str] = Counter()
    used_models: dict[str, None] = {}
    used_harnesses: dict[str, None] = {}

    def note(r: JobEnvironment) -> JobEnvironment:
        ids.append(r.session_id)
        per_env[r.env_name] += 1
        used_models[r.llm_model] = None
        if r.harness is not None:
            used_harnesses[r.harness] = None
        return r

    if resume:
        for r in await _resume_rows(
            store, job_id, envs, rerun_launcher_errors, graded, group_size, max_steps
        ):
            note(r)
    else:
        await _check_new(store, job_id)
        await store.add_job_sessions(
            note(r) for r in iter_session_rows(job_id, models, envs, group_size, max_steps, harnesses)
        )
    return PlannedJob(
        ids=ids, per_env=dict(per_env), models=list(used_models), harnesses=list(used_harnesses)
    )


def _id_like(key: str) -> bool:
    """A row field named as an id would be (``id``, ``task_id``, ``uid``, ``name``)."""
    k = key.lower()
    return k in ("id", "uid", "name") or k.endswith(("_id", "-id"))


def select_cases(
    envs: list[tuple[EnvConfig, list[Case]]], case_ids: Sequence[str]
) -> list[tuple[EnvConfig, list[Case]]]:
    """Only the cases named by ``case_ids`` (``--case``: ids of any env; empty: every case), envs
    left without a case left out. Raises SetupError naming each unknown id and the nearest ids."""
    if not case_ids:
        return envs
    wanted = set(case_ids)
    picked = [(cfg, [c for c in cases if c.case_id in wanted]) for cfg, cases in envs]
    known = sorted({c.case_id for _, cases in envs for c in cases})
    missing = [i for i in dict.fromkeys(case_ids) if i not in set(known)]
    if missing:

        def near(i: str) -> str:
            close = difflib.get_close_matches(i, known, n=3, cutoff=0.5)
            return f"{i!r} (nearest: {', '.join(close)})" if close else repr(i)

        def by_field(i: str) -> str | None:
            """A hint when ``i`` is a row's own field value of an env whose cases are numbered."""
            for cfg, cases in envs:
                if cfg.dataset.id_field is None:
                    field = next(
                        (k for c in cases for k, v in c.row.items() if _id_like(k) and str(v) == i), None
                    )
                    if field is not None:
                        return (
                            f"; env {cfg.name} numbers its cases by line: its rows' {field!r} is not "
                            f"their id unless its env.yaml says dataset.id_field: {field}"
                        )
            return None

        names = ", ".join(cfg.name for cfg, _ in envs)
        hint = next((h for h in map(by_field, missing) if h), "")
        raise SetupError(f"--case: no such case {'; '.join(map(near, missing))} in env(s) {names}{hint}")
    return [(cfg, cases) for cfg, cases in picked if cases]


async def _check_new(store: Store, job_id: str) -> None:
    if await store.job_exists(job_id):
        raise SetupError(
            f"job {job_id!r} already exists in {store.identity()}: "
            "add --resume to finish it, or choose another --job-id"
        )


async def _resume_rows(
    store: Store,
    job_id: str,
    envs: list[tuple[EnvConfig, list[Case]]],
    rerun_launcher_errors: bool = False,
    graded: bool | None = None,
    group_size: int | None = None,
    max_steps: int | None = None,
) -> list[JobEnvironment]:
    """The rows a resume runs: unfinished, or finished in an infrastructure failure; one finished
    in ``launcher_error`` (a bug of ours, which would repeat) only with ``rerun_launcher_errors``,
    and the log says which. A ``group_size`` or ``max_steps`` given that is not the job's own is
    a SetupError (a resume runs the job as it was planned)."""
    existing = await store.job_sessions(job_id)
    if not existing:
        raise SetupError(f"--resume: no job {job_id!r} in {store.identity()}")
    sizes = set(Counter(r.group_id for r in existing).values())
    for flag, given, own in (
        ("--rl-group-size", group_size, sizes),
        ("--max-steps", max_steps, {r.max_steps for r in existing}),
    ):
        if given is not None and own != {given}:
            raise SetupError(
                f"--resume runs job {job_id} as it was planned: its sessions have {flag} "
                f"{', '.join(sorted(map(str, own)))}, not {given} (leave {flag} out, or start a new job)"
            )
    if graded is False and any(r.finished and r.eval_status is not None for r in existing):
        raise SetupError(
            f"--resume: the sessions of {job_id} were graded: add --enable-evaluation, so the sessions "
            "it runs now are graded too"
        )
    cases = {(c.env_name, c.case_id) for _, cs in envs for c in cs}
    bugs = sum(1 for r in existing if r.finished and r.outcome == "launcher_error")
    if bugs and rerun_launcher_errors:
        log.warning(
            "--resume: running again %d session(s) of job %s that ended in launcher_error "
            "(--rerun-launcher-errors)",
            bugs,
            job_id,
        )
    elif bugs:
        log.warning(
            "--resume: %d session(s) of job %s ended in launcher_error (a launcher bug): kept as they "
            "ended, not run again (--rerun-launcher-errors runs them again)",
            bugs,
            job_id,
        )
    rows = [
        r
        for r in existing
        if not r.finished
        or (r.outcome in INFRA_CLASSES and (r.outcome != "launcher_error" or rerun_launcher_errors))
    ]
    unknown = {(r.env_name, r.case_id) for r in rows} - cases
    if unknown:
        raise SetupError(
            f"--resume: sessions of {job_id} refer to envs/cases not loaded now: {sorted(unknown)[:5]}"
        )
    for r in rows:
        if r.finished:  # an infrastructure failure: run it again, never graded
            await store.update_job_session(
                r.session_id,
                finished=False,
                finished_at=None,
                reward=None,
                eval_status=None,
                eval_reason=None,
                eval_detail=None,
            )
            r.finished = False
    return rows


def group_id(
    job_id: str, env_name: str, case_id: str, harness: str | None = None, model: str | None = None
) -> str:
    """The group of a case's samples: uuid5 of job/env/case, and of job/env/case/harness/model in a
    matrix (a harness, or several models); 16 hex digits."""
    key = (
        f"{job_id}/{env_name}/{case_id}"
        if harness is None and model is None
        else f"{job_id}/{env_name}/{case_id}/{harness or ''}/{model or ''}"
    )
    return uuid.uuid5(uuid.NAMESPACE_URL, key).hex[:16]


def session_rows(
    job_id: str,
    model: str | Sequence[str],
    envs: list[tuple[EnvConfig, list[Case]]],
    group_size: int | None,
    max_steps: int | None,
    harnesses: Sequence[str | None] = (None,),
) -> list[JobEnvironment]:
    """One ``job_environments`` row per (env, case, harness, model, sample): the matrix. The samples
    of one (case, harness, model) share a ``group_id`` (``group_id``: with one model and no
    harness, uuid5 of job, env and case as before); ``harness`` None is the env's own runtime.
    ``group_size`` None: each env's own ``group_size``. Session ids are random uuid4 hex."""
    return list(iter_session_rows(job_id, model, envs, group_size, max_steps, harnesses))


def iter_session_rows(
    job_id: str,
    model: str | Sequence[str],
    envs: list[tuple[EnvConfig, list[Case]]],
    group_size: int | None,
    max_steps: int | None,
    harnesses: Sequence[str | None] = (None,),
) -> Iterator[JobEnvironment]:
    """The rows of ``session_rows``, one at a time, in the same order."""
    models = [model] if isinstance(model, str) else list(model)
    matrix = len(models) > 1 or any(h is not None for h in harnesses)
    for cfg, cases in envs:
        for case in cases:
            for harness in harnesses:
                for m in models:
                    group = (
                        group_id(job_id, cfg.name, case.case_id, harness, m)
                        if matrix
                        else group_id(job_id, cfg.name, case.case_id)
                    )
                    for k in range(group_size or cfg.group_size):
                        yield JobEnvironment(
                            session_id=uuid.uuid4().hex,
                            job_id=job_id,
                            env_name=cfg.name,
                            case_id=case.case_id,
                            llm_model=m,
                            harness=harness,
                            group_id=group,
                            sample_index=k,
                            env_params={**cfg.params, "dataset": case.row},
                            status="pending",
                            max_steps=max_steps if max_steps is not None else cfg.max_steps,
                        )


Page = tuple[list[JobEnvironment], Mapping[str, list[SessionAttempt]]]
"""Session rows in run order, with the earlier attempts of those sessions (session id -> attempts)."""


class RowSource:
    """The rows a pool runs: ``total`` of them, read a page at a time by ``pages()`` (an
    async iterator of ``Page``), so a job of any size never holds all its rows at once."""

    def __init__(self, total: int, pages: Callable[[], AsyncIterator[Page]]) -> None:
        self.total = total
        self.pages = pages

    @classmethod
    def of(
        cls, rows: list[JobEnvironment], prior: Mapping[str, list[SessionAttempt]] | None = None
    ) -> RowSource:
        """Rows already in memory, as one page with their earlier attempts ``prior``."""

        async def pages() -> AsyncIterator[Page]:
            yield rows, prior or {}

        return cls(len(rows), pages)

    @classmethod
    def from_store(cls, store: Store, ids: SessionIds, page: int = 256) -> RowSource:
        """The rows of the sessions ``ids`` (in that order), read from ``store`` ``page`` at a
        time with their earlier attempts."""

        async def pages() -> AsyncIterator[Page]:
            for i in range(0, len(ids), page):
                chunk = ids[i : i + page]
                yield await store.job_sessions_by_id(chunk), await store.session_attempts(chunk)

        return cls(len(ids), pages)


def session_case(cfg: EnvConfig, row: JobEnvironment) -> Case:
    """The case a session row was planned with (its ``env_params["dataset"]``). Raises ValueError
    for a row that does not keep one (not written by this launcher)."""
    dataset = (row.env_params or {}).get("dataset")
    if not isinstance(dataset, dict):
        raise ValueError(f"session {row.session_id}: its row keeps no dataset row (env_params.dataset)")
    return case_of(cfg, row.case_id, dataset)
