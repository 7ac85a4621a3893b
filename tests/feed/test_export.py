"""``launcher.py export``: JSONL, Parquet read back by pandas, the OpenAI chat format; only
trainable rows; per step."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from store import Store
from tests.feed.helpers import finish, make_job, step

REPO = Path(__file__).resolve().parents[2]
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


async def _job(db: Path) -> dict[str, list[str]]:
    store = Store(f"sqlite://{db}")
    await store.init()
    try:
        ids = await make_job(store, "j", {"g1": 2, "g2": 2})
        tool_call = {
            "id": "t1",
            "type": "function",
            "function": {"name": "bash", "arguments": '{"cmd": "ls"}'},
        }
        second = step(ids["g1"][0], 2, "done", request={"model": "m", "tools": TOOLS})
        second.response = {
            "choices": [
                {
                    "message": {"role": "assistant", "content": None, "tool_calls": [tool_call]},
                    "finish_reason": "tool_calls",
                }
            ]
        }
        await store.write_batch([second], [])
        await finish(store, ids["g1"][0], 10)
        await finish(store, ids["g1"][1], 4)
        await finish(
            store, ids["g2"][0], None, "grader_broken", eval_reason="KeyError"
        )  # never a 0 for training
        await finish(store, ids["g2"][1], 8)
    finally:
        await store.close()
    return ids


def export_run(db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``launcher.py export`` of job ``j`` of ``db`` with ``args``; it must exit 0."""
    r = subprocess.run(
        [
            sys.executable,
            str(REPO / "launcher.py"),
            "export",
            "--db-path",
            f"sqlite://{db}",
            "--job-id",
            "j",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert r.returncode == 0, r.stderr
    return r


def export(db: Path, *args: str) -> str:
    return export_run(db, *args).stdout


async def test_jsonl_and_parquet_rows_per_session(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    ids = await _job(db)
    out = export(db, "--format", "jsonl", "--out", str(tmp_path / "x.jsonl"))
    assert "4 rows (jsonl, one per session)" in out
    rows = {r["session_id"]: r for r in map(json.loads, (tmp_path / "x.jsonl").read_text().splitlines())}
    a = rows[ids["g1"][0]]
    assert (a["group_id"], a["env"], a["case_id"], a["score"], a["valid"], a["cursor"]) == (
        "g1",
        "toy",
        "case-g1",
        10.0,
        True,
        1,
    )
    assert round(a["advantage"], 5) == 1.0 and a["group_trainable"] is True
    assert [s["seq"] for s in a["steps"]] == [1, 2] and a["steps"][1]["tool_calls"][0]["id"] == "t1"
    bad = rows[ids["g2"][0]]
    assert (bad["score"], bad["advantage"], bad["valid"]) == (None, None, False)
    assert bad["invalid_reason"] == "evaluation grader_broken: KeyError"
    assert rows[ids["g2"][1]]["group_flags"] == ["too_few_valid"]

    export(db, "--format", "parquet", "--out", str(tmp_path / "x.parquet"))
    df = pd.read_parquet(tmp_path / "x.parquet")
    assert len(df) == 4 and set(df["session_id"]) == set(rows)
    pa_row = df[df["session_id"] == ids["g1"][0]].iloc[0]
    assert pa_row["score"] == 10.0 and bool(pa_row["valid"])
    steps = list(pa_row["steps"])
    assert [int(s["seq"]) for s in steps] == [1, 2]
    assert json.loads(steps[0]["messages"]) == [{"role": "user", "content": "q1"}]
    assert json.loads(steps[1]["tool_calls"])[0]["function"]["name"] == "bash"
    assert steps[0]["prompt_token_ids"] is None  # not captured: null, never an empty list
    assert pd.isna(df[df["session_id"] == ids["g2"][0]].iloc[0]["score"])


async def test_parquet_loads_with_datasets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    import datasets  # imported here: slow to import, and it reads HF_* at import time

    db = tmp_path / "t.db"
    ids = await _job(db)
    export(db, "--format", "parquet", "--out", str(tmp_path / "x.parquet"))
    ds = datasets.load_dataset(
        "parquet", data_files=str(tmp_path / "x.parquet"), split="train", cache_dir=str(tmp_path / "cache")
    )
    assert ds.num_rows == 4 and sorted(ds["session_id"]) == sorted(sid for g in ids.values() for sid in g)
    row = next(r for r in ds if r["session_id"] == ids["g1"][0])
    assert row["score"] == 10.0 and [s["seq"] for s in row["steps"]] == [1, 2]


async def test_only_trainable_per_step_and_openai_format(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    ids = await _job(db)
    out = export(
        db, "--format", "parquet", "--per", "step", "--only-trainable", "--out", str(tmp_path / "s.parquet")
    )
    df = pd.read_parquet(tmp_path / "s.parquet")
    # g2 has one valid sample (< 2): flagged, left out; g1's two sessions have 2 + 1 steps
    assert sorted(zip(df["session_id"], df["seq"], strict=True)) == sorted(
        [(ids["g1"][0], 1), (ids["g1"][0], 2), (ids["g1"][1], 1)]
    )
    assert set(df["step_model"]) == {"m"} and set(df["model"]) == {"m"}
    assert "left out 2: group not trainable (too_few_valid)" in out

    out = export(db, "--format", "openai", "--out", str(tmp_path / "o.jsonl"))
    lines = [json.loads(x) for x in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert len(lines) == 4  # the last successful call of each session
    tool_ex = next(x for x in lines if "tools" in x)
    assert tool_ex["tools"] == TOOLS
    assert tool_ex["messages"] == [
        {"role": "user", "content": "q2"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "t1", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}
            ],
        },
    ]
    export(db, "--format", "openai", "--min-score", "8", "--out", str(tmp_path / "o8.jsonl"))
    lines = [json.loads(x) for x in (tmp_path / "o8.jsonl").read_text().splitlines()]
    assert sorted(x["messages"][-1]["content"] or "tool" for x in lines) == [f"answer {ids['g2'][1]}", "tool"]


def test_unknown_job_is_a_clear_error(tmp_path: Path) -> None:
    db = tmp_path / "none.db"
    r = subprocess.run(
        [sys.executable, str(REPO / "launcher.py"), "export", "--db-path", f"sqlite://{db}", "--job-id", "j"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert r.returncode == 1 and "no trajectory store at" in r.stderr
    db.touch()  # an empty file: refused, and left empty (a reader never turns it into a store)
    r = subprocess.run(
        [sys.executable, str(REPO / "launcher.py"), "export", "--db-path", f"sqlite://{db}", "--job-id", "j"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert r.returncode == 1 and "is an empty file, not a trajectory store" in r.stderr
    assert db.stat().st_size == 0


def test_a_job_id_that_is_a_path_is_refused(tmp_path: Path) -> None:
    r = subprocess.run(
        [
            sys.executable,
            str(REPO / "launcher.py"),
            "export",
            "--db-path",
            f"sqlite://{tmp_path / 'x.db'}",
            "--job-id",
            "../../x",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert r.returncode == 2 and "is not a job id" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written, not even runs/


async def test_min_valid_below_one_and_a_non_finite_min_score_are_refused_before_writing(
    tmp_path: Path,
) -> None:
    db = tmp_path / "t.db"
    await _job(db)
    for args, line in (
        (["--min-valid-samples", "0"], "argument --min-valid-samples: 0 is below 1 (it must be at least 1)"),
        (["--min-score", "nan"], "argument --min-score: 'nan' is not a finite number"),
    ):
        r = subprocess.run(
            [
                sys.executable,
                str(REPO / "launcher.py"),
                "export",
                "--db-path",
                f"sqlite://{db}",
                "--job-id",
                "j",
                "--out",
                str(tmp_path / "x.jsonl"),
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        assert (r.returncode, r.stderr.splitlines()[-1]) == (2, f"launcher.py export: error: {line}"), (
            r.stderr
        )
        assert not (tmp_path / "x.jsonl").exists()
    export(db, "--min-valid-samples", "1", "--out", str(tmp_path / "x.jsonl"))
    rows = [json.loads(x) for x in (tmp_path / "x.jsonl").read_text().splitlines()]
    by_group = {(r["group_id"], r["group_n_valid"], r["group_trainable"]) for r in rows}
    assert by_group == {("g1", 2, True), ("g2", 1, True)}  # min_valid 1: one valid sample is enough


async def test_a_damaged_step_is_one_line_and_leaves_the_export_untouched(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    ids = await _job(db)
    out = tmp_path / "x.jsonl"
    out.write_text("the previous export\n")
    con = sqlite3.connect(db)
    con.execute(
        "UPDATE session_steps SET encoding = '[3]', packed = x'0badbeef' WHERE session_id = ? AND seq = 2",
        (ids["g1"][0],),
    )
    con.commit()
    con.close()
    r = subprocess.run(
        [
            sys.executable,
            str(REPO / "launcher.py"),
            "export",
            "--db-path",
            f"sqlite://{db}",
            "--job-id",
            "j",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert r.returncode == 1 and r.stderr.startswith(
        f"error: the store cannot be read: step 2 of session {ids['g1'][0]}: its packed values are damaged ("
    ), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1  # no traceback
    assert (
        out.read_text() == "the previous export\n"
        and [p.name for p in tmp_path.iterdir() if p.name.startswith(".x.jsonl")] == []
    )


async def test_a_running_jobs_export_warns_that_its_unfinished_groups_are_flagged(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    store = Store(f"sqlite://{db}")
    await store.init()
    try:
        ids = await make_job(store, "j", {"g1": 2, "g2": 2})
        for sid in (*ids["g1"], ids["g2"][0]):  # g2's second session still running
            await finish(store, sid, 10)
    finally:
        await store.close()
    r = export_run(db, "--out", str(tmp_path / "x.jsonl"))
    assert "warning: 1 group(s) of job j had sessions not ended" in r.stderr
    flags = {
        row["group_id"]: row["group_flags"]
        for row in map(json.loads, (tmp_path / "x.jsonl").read_text().splitlines())
    }
    assert "incomplete" in flags["g2"] and "incomplete" not in flags["g1"]
    await _job(tmp_path / "done.db")
    assert "warning" not in export_run(tmp_path / "done.db", "--out", str(tmp_path / "y.jsonl")).stderr
