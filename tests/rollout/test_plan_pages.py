"""Planning a job without holding its rows: the compact session ids, the rows written from a
generator, read back a page at a time in run order; the records rebuilt a page at a time."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from rollout.core.plan import RowSource, plan_job, plan_sessions
from rollout.core.session_ids import SessionIds
from rollout.core.setup import SetupError
from rollout.jobs.options import JobContext, JobOptions
from rollout.jobs.pool import Pool
from rollout.jobs.prepare import load_envs
from rollout.results.records import iter_job_records, job_records
from store import SessionResult, Store
from tests.rollout.test_attempts import make_env, options


def test_session_ids_pack_hex_ids_and_keep_any_others_in_order() -> None:
    hexes = [uuid.uuid4().hex for _ in range(5)]
    ids = SessionIds()
    for sid in hexes:
        ids.append(sid)
    assert len(ids) == 5 and ids[0:5] == hexes and ids[1:3] == hexes[1:3] and ids[4:99] == hexes[4:]
    assert len(ids._packed) == 5 * 16 and ids._other is None  # 16 bytes each
    for odd in ("s-1", hexes[0].upper(), " " + hexes[1][1:]):  # not lowercase 32-hex: kept as given
        ids.append(odd)
    assert ids[0:99] == [*hexes, "s-1", hexes[0].upper(), " " + hexes[1][1:]] and len(ids) == 8


async def test_planned_rows_are_read_back_in_run_order_a_page_at_a_time(tmp_path: Path) -> None:
    make_env(
        tmp_path / "envs", [{"id": f"c{i}", "q": "hi"} for i in (3, 1, 10, 2)]
    )  # dataset order, not sorted
    db = tmp_path / "t.db"
    opts = options(tmp_path, tmp_path / "unused.yaml", db, rl_group_size=2)
    envs = load_envs(opts)
    store = Store(f"sqlite://{db}")
    await store.init()
    try:
        plan = await plan_job(store, "jp", ["fake"], envs, [None], group_size=opts.rl_group_size)
        assert (len(plan.ids), plan.per_env, plan.models, plan.harnesses) == (8, {"flaky": 8}, ["fake"], [])
        source = RowSource.from_store(store, plan.ids, page=3)
        pages = [(rows, prior) async for rows, prior in source.pages()]
        assert source.total == 8 and [len(rows) for rows, _ in pages] == [3, 3, 2]
        rows = [r for page, _ in pages for r in page]
        assert [(r.case_id, r.sample_index) for r in rows] == [
            (c, k) for c in ("c3", "c1", "c10", "c2") for k in (0, 1)
        ]
        assert [r.session_id for r in rows] == plan.ids[0:8]
        assert all(r.status == "pending" and not r.finished and r.job_id == "jp" for r in rows)
        assert all(prior == {} for _, prior in pages)  # a new job: no earlier attempts
        # the same rows as plan_sessions makes (what `serve` uses), apart from the random ids
        listed = await plan_sessions(store, "jq", ["fake"], envs, group_size=opts.rl_group_size)
        assert [(r.case_id, r.sample_index, r.group_id != "") for r in listed] == [
            (r.case_id, r.sample_index, True) for r in rows
        ]
        with pytest.raises(SetupError, match="already exists"):
            await plan_job(store, "jp", ["fake"], envs, [None], group_size=opts.rl_group_size)
        for sid in plan.ids[0:3]:
            await store.finish_job_session(sid, SessionResult(status="succeeded"))
        streamed = [r async for r in iter_job_records(store, "jp", page=2)]
        assert [r.session_id for r in streamed] == [r.session_id for r in await job_records(store, "jp")]
        assert sorted((r.case_id, r.sample_index) for r in streamed) == [("c1", 0), ("c3", 0), ("c3", 1)]
        assert [r.case_id for r in streamed] == ["c1", "c3", "c3"]  # env, case, sample order
    finally:
        await store.close()


async def test_a_job_whose_rows_are_gone_from_the_store_still_ends(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = Store(f"sqlite://{tmp_path / 't.db'}")
    await store.init()
    ids = SessionIds()
    for _ in range(3):
        ids.append(uuid.uuid4().hex)  # planned, but no such rows
    opts = JobOptions(agent_root=tmp_path, gateway_config=tmp_path / "x.yaml", pool_size=2)
    ctx = JobContext(job_id="jz", gateway_url="http://127.0.0.1:9/v1/sessions", models=("m",))
    try:
        records = await asyncio.wait_for(Pool(store, opts, ctx, {}).run(RowSource.from_store(store, ids)), 60)
    finally:
        await store.close()
    assert records == []
    assert any("3 planned session(s) were not found in the store" in r.getMessage() for r in caplog.records)


async def test_a_graded_job_resumed_without_evaluation_is_refused(tmp_path: Path) -> None:
    """Its remaining sessions would finish ungraded beside graded ones: the resume names the flag."""
    make_env(tmp_path / "envs", [{"id": "c1", "q": "hi"}, {"id": "c2", "q": "hi"}])
    db = tmp_path / "t.db"
    envs = load_envs(options(tmp_path, tmp_path / "unused.yaml", db))
    store = Store(f"sqlite://{db}")
    await store.init()
    try:
        plan = await plan_job(store, "jr", ["fake"], envs, [None])
        await store.finish_job_session(
            plan.ids[0:1][0], SessionResult(status="succeeded", reward=10.0, eval_status="scored")
        )
        with pytest.raises(SetupError, match="the sessions of jr were graded: add --enable-evaluation"):
            await plan_job(store, "jr", ["fake"], envs, [None], resume=True, graded=False)
        resumed = await plan_job(store, "jr", ["fake"], envs, [None], resume=True, graded=True)
        assert (len(resumed.ids), resumed.ids[0:1]) == (1, plan.ids[1:2])  # the unfinished one
    finally:
        await store.close()
