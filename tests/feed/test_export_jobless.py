"""``launcher.py export --session ID`` / ``--without-job``: sessions a client named on the gateway
(no launcher row) exported in the job export's formats, in process on a real SQLite store: no
score (null, never 0) and the reason, only-trainable and min-score leave them out, unknown or
job-owned sessions are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollout.cli.feed import build_parser
from rollout.servers.feed.export import NO_JOB, ExportError, export_sessions
from store import GatewaySession, Store
from store.feed import FeedQueries
from tests.feed.helpers import make_job, step


@pytest.fixture
async def queries(tmp_path: Path):  # type: ignore[no-untyped-def]
    store = Store(f"sqlite://{tmp_path / 't.db'}")
    await store.init()
    await make_job(store, "j", {"g1": 1})
    await store.write_batch(
        [
            step("vf-a", 1, "one"),
            step("vf-a", 2, "two", request={"model": "m", "tools": []}),
            step("vf-b", 1, "bee"),
        ],
        [
            GatewaySession(session_id="vf-a", route="m", status="closed", total_steps=2),
            GatewaySession(session_id="vf-b", route="m", total_steps=1),
        ],
    )
    yield FeedQueries(store.reader)
    await store.close()


def _read(path: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_every_session_without_a_job_per_session_has_no_score(
    queries: FeedQueries, tmp_path: Path
) -> None:
    out = tmp_path / "x.jsonl"
    result = await export_sessions(queries, None, "jsonl", out)
    rows = _read(out)
    assert result.rows == 2 and [r["session_id"] for r in rows] == ["vf-a", "vf-b"]  # not the job's session
    a = rows[0]
    assert (a["job_id"], a["group_id"], a["model"], a["status"], a["score"], a["advantage"]) == (
        None,
        None,
        "m",
        "closed",
        None,
        None,
    )
    assert a["valid"] is False and a["invalid_reason"] == NO_JOB and a["group_flags"] == ["no_job"]
    assert a["group_trainable"] is False
    assert [s["seq"] for s in a["steps"]] == [1, 2] and a["steps"][1]["content"] == "two"


async def test_named_sessions_per_step_and_in_the_openai_format(queries: FeedQueries, tmp_path: Path) -> None:
    out = tmp_path / "s.jsonl"
    await export_sessions(queries, ["vf-a", "vf-a"], "jsonl", out, per="step")
    rows = _read(out)
    assert [(r["session_id"], r["seq"], r["step_status"], r["score"]) for r in rows] == [
        ("vf-a", 1, "ok", None),
        ("vf-a", 2, "ok", None),
    ]
    chat = tmp_path / "c.jsonl"
    assert (await export_sessions(queries, ["vf-a"], "openai", chat)).rows == 1
    (ex,) = _read(chat)
    assert ex["messages"][-1] == {"role": "assistant", "content": "two"} and ex["tools"] == []


async def test_filters_leave_them_out_with_the_reason(queries: FeedQueries, tmp_path: Path) -> None:
    r = await export_sessions(queries, None, "jsonl", tmp_path / "t.jsonl", only_trainable=True)
    assert r.rows == 0 and r.skipped == {f"invalid sample: {NO_JOB}": 2}
    r = await export_sessions(queries, None, "jsonl", tmp_path / "m.jsonl", min_score=0)
    assert r.rows == 0 and r.skipped == {"score below 0 or none": 2}


async def test_unknown_or_job_owned_sessions_are_refused(queries: FeedQueries, tmp_path: Path) -> None:
    out = tmp_path / "x.jsonl"
    with pytest.raises(ExportError, match="no session 'nope' in this store"):
        await export_sessions(queries, ["vf-a", "nope"], "jsonl", out)
    with pytest.raises(ExportError, match="session 'j-g1-0' belongs to job 'j': export it with --job-id j"):
        await export_sessions(queries, ["j-g1-0"], "jsonl", out)
    assert not out.exists()


def test_the_cli_takes_at_most_one_of_job_session_and_without_job(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["export", "--session", "a", "--session", "b"])
    assert args.session == ["a", "b"] and args.job_id is None and not args.without_job
    assert build_parser().parse_args(["export", "--without-job"]).without_job
    assert (
        build_parser().parse_args(["export"]).job_id is None
    )  # none: the latest job (tests/rollout/test_next_steps.py)
    for bad in (["export", "--job-id", "j", "--without-job"], ["export", "--job-id", "j", "--session", "a"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(bad)


async def test_parquet_takes_them_with_the_job_export_schema(queries: FeedQueries, tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    out = tmp_path / "x.parquet"
    assert (await export_sessions(queries, ["vf-b"], "parquet", out)).rows == 1
    (row,) = pq.read_table(out).to_pylist()
    assert (row["session_id"], row["score"], row["sample_index"], row["invalid_reason"]) == (
        "vf-b",
        None,
        None,
        NO_JOB,
    )
    assert row["steps"][0]["content"] == "bee"


async def test_a_client_score_is_exported_as_client_score_never_as_score(
    queries: FeedQueries, tmp_path: Path
) -> None:
    store = Store(f"sqlite://{tmp_path / 't.db'}")
    try:
        await store.set_client_score("vf-a", 7.5, "inspect: includes")
    finally:
        await store.close()
    out = tmp_path / "x.jsonl"
    await export_sessions(queries, None, "jsonl", out)
    got = [
        (r["session_id"], r["client_score"], r["client_score_reason"], r["score"], r["reward"], r["valid"])
        for r in _read(out)
    ]
    assert got == [
        ("vf-a", 7.5, "inspect: includes", None, None, False),
        ("vf-b", None, None, None, None, False),
    ]
    steps = tmp_path / "s.jsonl"
    await export_sessions(queries, ["vf-a"], "jsonl", steps, per="step")
    assert [(r["seq"], r["client_score"], r["score"]) for r in _read(steps)] == [
        (1, 7.5, None),
        (2, 7.5, None),
    ]
    r = await export_sessions(queries, None, "jsonl", tmp_path / "m.jsonl", min_score=5)
    assert r.rows == 0  # a client's score never passes --min-score
    pq = pytest.importorskip("pyarrow.parquet")
    parquet = tmp_path / "x.parquet"
    await export_sessions(queries, ["vf-a"], "parquet", parquet)
    (row,) = pq.read_table(parquet).to_pylist()
    assert (row["client_score"], row["client_score_reason"], row["score"], row["reward"]) == (
        7.5,
        "inspect: includes",
        None,
        None,
    )
