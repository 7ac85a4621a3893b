"""store.queries on a real SQLite store filled through ``Store``: paging, filters, sorts, indexes,
earlier attempts, optional tables, failure reasons; and the report on a job without evaluation."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from rollout.results.records import job_records
from rollout.results.report import summarize
from rollout.servers.viewer.db import ViewerError, open_queries
from rollout.servers.viewer.report import build_report
from rollout.servers.viewer.stats import pass_curves, records_of, summary
from store import JobEnvironment, Store, step_record
from store.models import SessionAttempt
from store.queries import SessionFilter, ViewerQueries

N = 1200


async def filled(db: Path) -> Store:
    store = Store(f"sqlite://{db}")
    await store.init()
    rows = [
        JobEnvironment(
            session_id=f"s{i:05d}",
            job_id="big",
            env_name=("a", "b")[i % 2],
            case_id=f"c{i // 4}",
            llm_model="m",
            group_id=f"g{i // 4}",
            sample_index=i % 4,
        )
        for i in range(N)
    ]
    await store.add_job_sessions(rows)
    for i in range(0, N, 3):  # every third finished: scores 0..9, every 30th an evaluator error
        ev = "error" if i % 30 == 0 else "scored"
        await store.update_job_session(
            f"s{i:05d}",
            finished=True,
            status="succeeded" if i % 2 else "failed",
            reward=None if ev == "error" else float(i % 10),
            eval_status=ev,
            eval_reason="boom" if ev == "error" else f"r{i % 10}",
        )
    await store.write_batch(
        [
            step_record(
                session_id="s00003",
                seq=k,
                step_id=k,
                llm_model="m",
                endpoint="chat.completions",
                job_id="big",
                env_name="b",
                total_tokens=10,
            )
            for k in (1, 2)
        ]
        + [
            step_record(
                session_id="s00003~a1",
                seq=1,
                step_id=1,
                llm_model="m",
                endpoint="chat.completions",
                job_id="big",
                is_trainable=False,
            )
        ],
        [],
    )
    return store


@pytest.fixture
async def q(tmp_path: Path):  # type: ignore[no-untyped-def]
    db = tmp_path / "t.db"
    store = await filled(db)
    await store.close()
    engine, queries = await open_queries(f"sqlite://{db}")
    yield queries
    await engine.dispose()


async def test_pages_cover_every_matching_session_once(q: ViewerQueries) -> None:
    seen: list[str] = []
    page = await q.session_page("big", SessionFilter(env_name="a"), offset=0, limit=100)
    assert page.total == N // 2
    while page.rows:
        seen += [r["env_id"] for r in page.rows]
        page = await q.session_page("big", SessionFilter(env_name="a"), offset=len(seen), limit=100)
    assert len(seen) == len(set(seen)) == N // 2
    assert seen == sorted(seen, key=lambda s: (f"c{int(s[1:]) // 4}", int(s[1:]) % 4))  # env, case, sample


async def test_filters_and_sorts(q: ViewerQueries) -> None:
    flt = SessionFilter(score_min=7, score_max=9)
    page = await q.session_page("big", flt, sort="score", descending=True, limit=500)
    expected = sorted(
        (i for i in range(0, N, 3) if i % 30 and 7 <= i % 10 <= 9),
        reverse=True,
        key=lambda i: (i % 10, ("a", "b")[i % 2], f"c{i // 4}", i % 4),
    )  # ties: env, case, sample
    assert [r["env_id"] for r in page.rows] == [f"s{i:05d}" for i in expected]
    assert page.total == len(expected)
    nulls_last = await q.session_page("big", SessionFilter(), sort="score", limit=500, offset=N - 500)
    assert all(r["reward"] is None for r in nulls_last.rows)
    errors = await q.session_page("big", SessionFilter(eval_status="error"))
    assert errors.total == len(range(0, N, 30))
    pending = await q.session_page("big", SessionFilter(eval_status="none", status="pending"))
    assert pending.total == N - len(range(0, N, 3))
    one = await q.session_page("big", SessionFilter(case_id="c0", group_id="g0", llm_model="m"))
    assert [r["env_id"] for r in one.rows] == ["s00000", "s00002", "s00001", "s00003"]  # env a first
    assert one.rows[3]["steps"] == 2 and one.rows[3]["tokens"] == 20 and one.rows[0]["steps"] == 0
    with pytest.raises(KeyError):
        await q.session_page("big", SessionFilter(), sort="nope")


async def test_indexes_created_once(q: ViewerQueries, tmp_path: Path) -> None:
    assert await q.ensure_indexes() == ["ix_viewer_job_order", "ix_viewer_job_reward", "ix_viewer_job_status"]
    assert await q.ensure_indexes() == []
    con = sqlite3.connect(tmp_path / "t.db")
    plan = " ".join(
        r[3]
        for r in con.execute(
            "explain query plan select env_id from job_environments where job_id='big' "
            "order by env_name, case_id, sample_index limit 50"
        )
    )
    con.close()
    assert "ix_viewer_job_order" in plan and "TEMP B-TREE" not in plan


async def test_session_details(q: ViewerQueries, tmp_path: Path) -> None:
    assert [s["seq"] for s in await q.steps("s00003")] == [1, 2]
    assert [s["session_id"] for s in await q.earlier_attempt_steps("s00003")] == ["s00003~a1"]
    assert await q.earlier_attempt_steps("s0000") == []
    assert await q.optional_rows("s00003") == {}
    con = sqlite3.connect(tmp_path / "t.db")
    con.executemany(
        "insert into session_attempts (env_id, attempt, job_id, status, outcome, infra, step_count) "
        "values (?, ?, 'big', ?, ?, ?, 0)",
        [
            ("s00003", 2, "succeeded", "succeeded", 0),
            ("s00003", 1, "error", "gateway_unreachable", 1),
            ("s00004", 1, "failed", "failed", 0),
        ],
    )
    con.execute(
        "insert into session_workspaces (session_id, job_id, env_name, status, max_bytes, file_count, "
        "total_bytes, archive_bytes, archive, created_at) "
        "values ('s00003', 'big', 'e', 'kept', 100, 1, 5, 3, x'1f8b08', '2026-01-01')"
    )
    con.commit()
    con.close()
    q._tables = None  # a new viewer start reads the schema again
    rows = await q.optional_rows("s00003")
    assert [(a["attempt"], a["outcome"]) for a in rows["session_attempts"]] == [
        (1, "gateway_unreachable"),
        (2, "succeeded"),
    ]
    [ws] = rows["session_workspaces"]
    assert (ws["status"], ws["archive"]) == ("kept", "(3 bytes)")  # the archive itself is not shown
    assert await q.session("nope") is None and await q.gateway_session("s00003") is None
    assert [r["env_id"] for r in await q.group("g1")] == ["s00004", "s00005", "s00006", "s00007"]


async def test_job_numbers(q: ViewerQueries) -> None:
    job = await q.job("big")
    assert job is not None
    finished = len(range(0, N, 3))
    assert (job["sessions"], job["finished"], job["envs"], job["models"]) == (N, finished, ["a", "b"], ["m"])
    assert await q.job("nope") is None
    reasons = await q.failure_reasons("big", 100)
    assert reasons[0]["reason"] == "boom" and reasons[0]["n"] == len(range(0, N, 30))
    assert sum(r["n"] for r in reasons) == finished  # no score reaches 10 in this job
    worst = await q.worst_sessions("big", 3)
    assert [w["eval_status"] for w in worst] == ["error"] * 3
    rows = await q.finished_sessions("big")
    assert len(rows) == finished and next(r for r in rows if r["env_id"] == "s00003")["total_tokens"] == 20
    assert await q.filter_values("big") == {
        "env_name": ["a", "b"],
        "llm_model": ["m"],
        "status": ["failed", "pending", "succeeded"],
        "eval_status": ["error", "none", "scored"],
    }


async def test_report_of_a_job(q: ViewerQueries) -> None:
    html = await build_report(q, "big", viewer_url="http://v:1", inline_js=False)
    assert 'id="plot-scores"' in html and 'href="http://v:1/sessions/s' in html
    with pytest.raises(ViewerError, match="no job 'nope'"):
        await build_report(q, "nope")


async def test_open_refuses_what_is_not_a_store(tmp_path: Path) -> None:
    with pytest.raises(ViewerError, match="no trajectory store"):
        await open_queries(f"sqlite://{tmp_path / 'missing.db'}")
    assert not (tmp_path / "missing.db").exists()
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("create table t (x int)").connection.close()
    with pytest.raises(ViewerError, match="not a trajectory store"):
        await open_queries(f"sqlite://{other}")
    with pytest.raises(ViewerError, match="unsupported storage URL"):
        await open_queries("mysql://x")


async def test_summary_from_case_counts_equals_the_launchers_table(q: ViewerQueries, tmp_path: Path) -> None:
    store = Store(f"sqlite://{tmp_path / 't.db'}")
    try:
        for i in range(
            1, 40, 3
        ):  # a few more outcomes: passes, runtime errors, invalid rewards, no evaluation
            await store.update_job_session(
                f"s{i:05d}",
                finished=True,
                status=("error", "timeout", "succeeded")[i % 3],
                reward=10.0 if i % 2 else None,
                duration_s=float(i),
                eval_status=("scored", "invalid_reward", None)[i % 3],
            )
        # two sessions of two attempts: one cut off by a stop (no retry), one after an outage (retried)
        for sid, earlier in (
            ("s00001", "interrupted"),
            ("s00007", "cancelled"),
            ("s00004", "upstream_unavailable"),
        ):
            await store.update_job_session(sid, attempts=2)
            for n, outcome in ((1, earlier), (2, "succeeded")):
                await store.record_attempt(
                    SessionAttempt(session_id=sid, attempt=n, job_id="big", status="x", outcome=outcome)
                )
        records = await job_records(store, "big")
    finally:
        await store.close()
    expected = summarize(records)
    light = records_of(await q.summary_rows("big"))
    got = summary(light)
    assert len(got) == len(expected) == 2
    for g, e in zip(got, expected, strict=True):
        assert g.model_dump() == pytest.approx(e.model_dump())
    assert sum(e.retried for e in expected) == 1
    curve = pass_curves(light)[("a", "m")]
    assert [k for k, _ in curve] == list(range(1, expected[0].k + 1))
    assert curve[0][1] == pytest.approx(expected[0].pass_at_1) and curve[-1][1] == pytest.approx(
        expected[0].pass_at_k
    )
    assert sum(int(c["n"]) for c in await q.case_outcomes("big")) == sum(e.sessions for e in expected)


async def test_neighbours_agree_with_the_pages_in_every_order(q: ViewerQueries) -> None:
    from store.queries import SORTS

    for flt in (SessionFilter(), SessionFilter(env_name="b", score_max=6)):
        for sort in SORTS:
            for descending in (False, True):
                listed: list[str] = []
                while True:
                    page = await q.session_page(
                        "big", flt, sort=sort, descending=descending, offset=len(listed), limit=500
                    )
                    listed += [r["env_id"] for r in page.rows]
                    if len(listed) >= page.total:
                        break
                for i in sorted({0, len(listed) - 1, *range(0, len(listed), 97)}):
                    got = await q.neighbours("big", flt, listed[i], sort=sort, descending=descending)
                    assert got == {
                        "prev": listed[i - 1] if i else None,
                        "next": listed[i + 1] if i + 1 < len(listed) else None,
                        "position": i + 1,
                        "total": len(listed),
                    }, (flt, sort, descending, i)
    assert await q.neighbours("big", SessionFilter(env_name="b"), "s00000") is None  # env a
