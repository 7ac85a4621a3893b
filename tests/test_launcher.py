"""Launcher integration: the real gateway on a loopback port (started by the launcher, or given
with --gateway-base-url), real runtime subprocesses, the fake upstream as the model, evaluation,
the DB rows, the JSONL and the exit code."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sqlite3
import sys
import zlib
from pathlib import Path

import pytest
import yaml

from tests.fake_upstream import DEFAULT_TEXT, FakeUpstream

REPO = Path(__file__).resolve().parents[1]

RUNTIME = """
import time
from env.runtime_kit import chat_completion, openai_client, run_runtime
from rollout.contract.protocol import SimulationStartResult

def main(req):
    row = req.env_params["dataset"]
    assert "expected" not in row, "hidden field leaked to the runtime"
    if row.get("hang"):
        time.sleep(60)
    client = openai_client(req, max_retries=0)
    for _ in range(row.get("calls", 1)):
        completion, text = chat_completion(client, model=req.model,
                                           messages=[{"role": "user", "content": row["q"]}])
    if row.get("crash"):
        raise RuntimeError("agent crashed on purpose")
    return SimulationStartResult(session_id=req.session_id, status="succeeded", step_count=row.get("calls", 1),
                                 metrics={"text": text})

run_runtime(main)
"""

EVALUATOR = """
def evaluate(request, spec, trajectory):
    row = request.env_params["dataset"]
    if row.get("bad_eval"):
        raise KeyError("expected_answer")
    ok = trajectory.final_response == row["expected"]
    return {"score": 10 if ok else 3, "reason": f"{len(trajectory.steps)} steps"}
"""

CASES = [
    {"id": "a", "q": "say hello", "expected": DEFAULT_TEXT},
    {"id": "b", "q": "say hello twice", "expected": DEFAULT_TEXT, "calls": 2},
    {"id": "c", "q": "wrong", "expected": "something else"},
    {"id": "d", "q": "crash", "expected": "", "crash": True},
    {"id": "e", "q": "hang", "expected": "", "hang": True},
    {"id": "f", "q": "evaluator bug", "expected": "", "bad_eval": True},
    {"id": "g", "q": "over budget", "expected": "", "calls": 4},
]


def make_env(root: Path, cases: list[dict[str, object]] = CASES) -> Path:
    env_dir = root / "toy"
    (env_dir / "data").mkdir(parents=True)
    (env_dir / "runtime.py").write_text(RUNTIME)
    (env_dir / "rule_evaluator.py").write_text(EVALUATOR)
    (env_dir / "data" / "cases.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cases))
    cfg = {
        "name": "toy",
        "dataset": {
            "format": "jsonl",
            "path": "data/cases.jsonl",
            "id_field": "id",
            "hidden_fields": ["expected"],
        },
        "runtime": {"command": ["{python}", "{env_dir}/runtime.py"], "timeout_s": 15},
        "max_steps": 3,
    }
    (env_dir / "env.yaml").write_text(yaml.safe_dump(cfg))
    return env_dir


def gateway_config(path: Path, upstream_url: str, db: Path | str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "storage_config": {"db_url": db if isinstance(db, str) else f"sqlite://{db}"},
                "llm_routes": {"fake": {"base_url": upstream_url, "api_key": "sk-route-secret-123"}},
            }
        )
    )
    return path


async def launch(
    *args: str, cwd: Path, env: dict[str, str] | None = None, progress: bool = False
) -> tuple[int, str, str]:
    """Run launcher.py with ``args`` (plus ``--no-progress`` unless ``progress``: its stderr is a
    pipe); ``env`` replaces the environment (default: this one), PYTHONPATH set to the repo either way."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(REPO / "launcher.py"),
        *args,
        *([] if progress else ["--no-progress"]),
        cwd=str(cwd),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**(os.environ if env is None else env), "PYTHONPATH": str(REPO)},
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=240)
    return proc.returncode or 0, out.decode(), err.decode()


def rows(db: Path, sql: str) -> list[tuple]:  # type: ignore[type-arg]
    con = sqlite3.connect(db)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


async def test_case_ids_that_look_like_paths(tmp_path: Path) -> None:
    """Benchmark ids such as ``django/django-11099`` name a case, not a path: each session runs in
    its own workspace and keeps its id."""
    ids = ["django/django-11099", "org/repo#12", "../../up", "plain"]
    env_root = tmp_path / "envs"
    make_env(env_root, [{"id": i, "q": "say hello", "expected": DEFAULT_TEXT} for i in ids])
    db, out = tmp_path / "trajs.db", tmp_path / "out.jsonl"
    async with FakeUpstream() as up:
        cfg = gateway_config(tmp_path / "gw.yaml", up.base_url, db)
        code, _, stderr = await launch(
            "--agent-root",
            str(env_root),
            "--gateway-config",
            str(cfg),
            "--llm-model",
            "fake",
            "--db-path",
            str(db),
            "--enable-evaluation",
            "--pool-size",
            "2",
            "--job-id",
            "paths",
            "--out",
            str(out),
            cwd=tmp_path,
        )
    assert code == 0, stderr
    records = {r["case_id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert sorted(records) == sorted(ids)
    assert {(r["status"], r["score"]) for r in records.values()} == {("succeeded", 10.0)}
    assert not (tmp_path / "up").exists() and not (tmp_path.parent / "up").exists()


async def test_launcher_runs_grades_and_reports(tmp_path: Path) -> None:
    env_root = tmp_path / "envs"
    make_env(env_root)
    db = tmp_path / "trajs.db"
    out = tmp_path / "out.jsonl"
    async with FakeUpstream() as up:
        cfg = gateway_config(tmp_path / "gw.yaml", up.base_url, db)
        code, stdout, stderr = await launch(
            "--agent-root",
            str(env_root),
            "--gateway-config",
            str(cfg),
            "--llm-model",
            "fake",
            "--db-path",
            f"sqlite://{db}",
            "--enable-evaluation",
            "--pool-size",
            "3",
            "--rl-group-size",
            "2",
            "--job-id",
            "job1",
            "--out",
            str(out),
            "--max-broken-graders",
            "0",
            cwd=tmp_path,
        )
        upstream_calls = len([r for r in up.requests if r.path.endswith("/chat/completions")])

    # the hanging runtime timed out: a result; f's evaluator raises on its case whatever the agent did:
    # a broken grader, which does not stop the job here (--max-broken-graders 0) but makes the exit code 5
    assert code == 5, stderr
    assert (
        "error: 2 sessions met a broken grader (toy 2): it failed on the case's untouched starting workspace "
        "too, so they are not counted"
    ) in stderr
    records = {(r["case_id"], r["sample_index"]): r for r in map(json.loads, out.read_text().splitlines())}
    assert len(records) == len(CASES) * 2
    for k in (0, 1):
        a, b, c = records[("a", k)], records[("b", k)], records[("c", k)]
        assert (a["status"], a["score"], a["eval_status"], a["step_count"]) == (
            "succeeded",
            10.0,
            "scored",
            1,
        )
        assert (b["score"], b["step_count"]) == (10.0, 2)
        assert (c["score"], c["reason"]) == (3.0, "1 steps")
        # score / 10; f's grader raises whatever the agent did (on the control too): broken, no reward
        assert (a["reward"], c["reward"], records[("f", k)]["reward"]) == (1.0, 0.3, None)
        assert a["trajectory"][0]["content"] == DEFAULT_TEXT
        assert a["usage"] == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
        d = records[("d", k)]
        # the agent crashed after its call: a failed session, still graded on what it did
        assert (d["status"], d["eval_status"], d["score"]) == ("failed", "scored", 3.0)
        assert "RuntimeError: agent crashed on purpose" in d["error"]
        e = records[("e", k)]
        assert (e["status"], e["step_count"]) == ("timeout", 0) and "timed out after 15 s" in e["error"]
        # task outcomes are final: one attempt each, never retried
        assert [a["outcome"] for a in d["attempts"]] == ["failed"] and not d["retried"]
        assert [a["outcome"] for a in e["attempts"]] == ["timeout"] and not e["retried"]
        f = records[("f", k)]
        assert (f["eval_status"], f["score"], f["error"]) == (
            "grader_broken",
            None,
            None,
        ) and "KeyError" in f["reason"]
        g = records[("g", k)]  # budget 3: the 4th call got a synthetic stop, no upstream call
        assert (g["status"], g["step_count"]) == ("truncated", 3)
    # samples of a case share a group; sessions do not
    assert records[("a", 0)]["group_id"] == records[("a", 1)]["group_id"] != records[("b", 0)]["group_id"]
    assert records[("a", 0)]["session_id"] != records[("a", 1)]["session_id"]

    # one step row per upstream model call, with step ids 1..n per session
    steps = rows(
        db, "SELECT session_id, step_id, seq, job_id, env_name FROM session_steps ORDER BY session_id, seq"
    )
    assert len(steps) == upstream_calls == 2 * (1 + 2 + 1 + 1 + 0 + 1 + 3)
    assert all(s[3] == "job1" and s[4] == "toy" for s in steps)
    by_session: dict[str, list[int]] = {}
    for sid, step_id, seq, *_ in steps:
        by_session.setdefault(sid, []).append(step_id)
        assert step_id == seq
    assert all(ids == list(range(1, len(ids) + 1)) for ids in by_session.values())
    # the reward is written on the last step of each evaluated session, and on the session row
    rewarded = rows(
        db,
        "SELECT s.session_id, s.reward, j.reward FROM session_steps s JOIN job_environments j "
        "ON j.env_id = s.session_id WHERE s.is_terminal = 1",
    )
    assert len(rewarded) == len(by_session) and all(r[1] == r[2] for r in rewarded)
    assert rows(db, "SELECT count(*) FROM job_environments WHERE finished = 1") == [(14,)]
    # secrets never stored
    blob = db.read_bytes() + (
        db.with_name(db.name + "-wal").read_bytes() if db.with_name(db.name + "-wal").exists() else b""
    )
    packed = [
        zlib.decompress(p) for (p,) in rows(db, "SELECT packed FROM session_steps WHERE packed IS NOT NULL")
    ]
    assert packed and b"sk-route-secret-123" not in b"".join([blob, *packed])  # steps are stored compressed
    # the summary table is printed
    assert "toy" in stdout and "pass@" in stdout


async def test_a_job_on_postgresql_stores_the_same_rows_as_on_sqlite(tmp_path: Path, store_url: str) -> None:
    """The same job (graded, a crash, an evaluator bug, a budget cut) with ``--db-path`` a SQLite
    file and a PostgreSQL URL: the same sessions, scores, steps and gateway states."""
    from tests.raw_sql import raw_sql

    cases = [c for c in CASES if not c.get("hang")]
    env_root = tmp_path / "envs"
    make_env(env_root, cases)
    async with FakeUpstream() as up:
        cfg = gateway_config(tmp_path / "gw.yaml", up.base_url, store_url)
        code, stdout, stderr = await launch(
            "--agent-root",
            str(env_root),
            "--gateway-config",
            str(cfg),
            "--llm-model",
            "fake",
            "--db-path",
            store_url,
            "--enable-evaluation",
            "--pool-size",
            "3",
            "--rl-group-size",
            "2",
            "--max-broken-graders",
            "0",
            "--job-id",
            "same",
            "--out",
            str(tmp_path / "out.jsonl"),
            cwd=tmp_path,
        )
    assert code == 5, (
        stderr
    )  # the evaluator bug: a broken grader (named in the table, exit 5), the job completed
    sessions = await raw_sql(
        store_url,
        "SELECT env_id, case_id, sample_index, status, reward, eval_status, attempts, "
        "finished FROM job_environments ORDER BY case_id, sample_index",
    )
    got = [
        (
            r["case_id"],
            r["sample_index"],
            r["status"],
            r["reward"],
            r["eval_status"],
            r["attempts"],
            bool(r["finished"]),
        )
        for r in sessions
    ]
    expected = []
    for c in cases:
        status = "failed" if c.get("crash") else "truncated" if c.get("calls", 1) > 3 else "succeeded"
        score = None if c.get("bad_eval") else 10.0 if c["expected"] == DEFAULT_TEXT else 3.0
        expected += [
            (c["id"], k, status, score, "grader_broken" if c.get("bad_eval") else "scored", 1, True)
            for k in (0, 1)
        ]
    assert got == expected
    steps = await raw_sql(
        store_url,
        "SELECT j.case_id, j.sample_index, s.seq, s.step_id, s.status, s.is_terminal, "
        "s.reward FROM session_steps s JOIN job_environments j ON j.env_id = s.session_id "
        "ORDER BY j.case_id, j.sample_index, s.seq",
    )
    calls = {c["id"]: min(int(c.get("calls", 1)), 3) for c in cases}  # type: ignore[call-overload]
    rewards = {(e[0], e[1]): e[3] for e in expected}
    assert [
        (
            r["case_id"],
            r["sample_index"],
            r["seq"],
            r["step_id"],
            r["status"],
            bool(r["is_terminal"]),
            r["reward"],
        )
        for r in steps
    ] == [
        (cid, k, i, i, "ok", i == n, rewards[(cid, k)] if i == n else None)
        for cid, n in calls.items()
        for k in (0, 1)
        for i in range(1, n + 1)
    ]
    states = await raw_sql(
        store_url,
        "SELECT g.status, g.total_steps, g.in_flight, g.completion_mode, j.case_id "
        "FROM gateway_sessions g JOIN job_environments j ON j.env_id = g.session_id "
        "ORDER BY j.case_id, j.sample_index",
    )
    assert [(r["case_id"], r["status"], r["total_steps"], r["in_flight"]) for r in states] == [
        (cid, "closed", n, 0) for cid, n in calls.items() for _ in (0, 1)
    ]
    assert {r["completion_mode"] for r in states if r["case_id"] == "g"} == {"truncated"}
    # the HTML report reads the same store (the viewer's queries)
    from rollout.servers.viewer.report import write_report

    html = (await write_report(store_url, "same", tmp_path / "report.html")).read_text()
    assert "toy" in html and "KeyError" in html  # the env row and the evaluator failure reason


async def test_resume_runs_only_unfinished_sessions(tmp_path: Path) -> None:
    env_root = tmp_path / "envs"
    env_dir = make_env(env_root)
    (env_dir / "data" / "cases.jsonl").write_text(json.dumps(CASES[0]) + "\n" + json.dumps(CASES[1]) + "\n")
    db = tmp_path / "trajs.db"
    async with FakeUpstream() as up:
        cfg = gateway_config(tmp_path / "gw.yaml", up.base_url, db)
        common = [
            "--agent-root",
            str(env_root),
            "--gateway-config",
            str(cfg),
            "--llm-model",
            "fake",
            "--db-path",
            f"sqlite://{db}",
            "--enable-evaluation",
            "--job-id",
            "jr",
        ]
        code, _, err = await launch(*common, "--out", str(tmp_path / "1.jsonl"), cwd=tmp_path)
        assert code == 0, err
        assert len(up.requests) == 3
        # pretend the session of case "b" was interrupted
        con = sqlite3.connect(db)
        con.execute("UPDATE job_environments SET finished = 0, status = 'cancelled' WHERE case_id = 'b'")
        con.commit()
        con.close()
        code, _, err = await launch(*common, "--resume", "--out", str(tmp_path / "2.jsonl"), cwd=tmp_path)
        assert code == 0, err
        assert len(up.requests) == 3 + 2  # only case b ran again (2 calls)
        # resuming the finished job: nothing runs, no gateway starts, its records are written again
        code, _, err = await launch(*common, "--resume", "--out", str(tmp_path / "3.jsonl"), cwd=tmp_path)
        assert code == 0, err
        assert len(up.requests) == 3 + 2
        assert "job jr: every session is finished, nothing to run" in err and " via http" not in err, err
    lines = [json.loads(x) for x in (tmp_path / "2.jsonl").read_text().splitlines()]
    assert sorted(r["case_id"] for r in lines) == ["a", "b"]  # the report covers the whole job
    assert (tmp_path / "3.jsonl").read_text() == (tmp_path / "2.jsonl").read_text()
    assert rows(db, "SELECT attempts FROM job_environments ORDER BY case_id") == [(1,), (2,)]


async def test_resume_keeps_launcher_errors_unless_asked(tmp_path: Path) -> None:
    """A session that ended in launcher_error (our bug) is not run again by --resume (no free
    re-roll): it stays finished and reported, and the log says so; --rerun-launcher-errors runs it."""
    env_root = tmp_path / "envs"
    env_dir = make_env(env_root)
    (env_dir / "data" / "cases.jsonl").write_text(json.dumps(CASES[0]) + "\n" + json.dumps(CASES[1]) + "\n")
    db = tmp_path / "trajs.db"
    async with FakeUpstream() as up:
        cfg = gateway_config(tmp_path / "gw.yaml", up.base_url, db)
        common = [
            "--agent-root",
            str(env_root),
            "--gateway-config",
            str(cfg),
            "--llm-model",
            "fake",
            "--db-path",
            f"sqlite://{db}",
            "--enable-evaluation",
            "--job-id",
            "jl",
        ]
        code, _, err = await launch(*common, "--out", str(tmp_path / "1.jsonl"), cwd=tmp_path)
        assert code == 0, err
        assert len(up.requests) == 3
        con = sqlite3.connect(db)  # the session of case "b" ended in a launcher bug
        con.execute(
            "UPDATE job_environments SET status = 'error', outcome = 'launcher_error', reward = NULL, "
            "eval_status = NULL, error_text = 'launcher error: ValueError: bug' WHERE case_id = 'b'"
        )
        con.commit()
        con.close()
        code, _, err = await launch(*common, "--resume", "--out", str(tmp_path / "2.jsonl"), cwd=tmp_path)
        assert len(up.requests) == 3  # nothing ran again
        assert code == 3, err  # still a session lost to a failure of ours
        assert (
            "--resume: 1 session(s) of job jl ended in launcher_error (a launcher bug): kept as they ended, "
            "not run again (--rerun-launcher-errors runs them again)"
        ) in err
        # the job's own command again, from this folder: the launcher's path, the flags given
        assert f"rerun with python {REPO / 'launcher.py'} --agent-root {env_root} " in err
        assert (
            " --resume --job-id jl to run them again (1 of them launcher_error, run again only with "
            "--rerun-launcher-errors)"
        ) in err
        code, _, bad = await launch(*common, "--resume", "--rl-group-size", "5", cwd=tmp_path)
        assert (
            code == 1 and "--resume runs job jl as it was planned: its sessions have --rl-group-size" in bad
        )
        assert "not 5 (leave --rl-group-size out, or start a new job)" in bad, bad
        hint = err.split("rerun with python ", 1)[1].split(" to run them again", 1)[0]
        again = shlex.split(hint)  # as printed, run from another folder: the same resume
        assert again[0] == str(REPO / "launcher.py")
        (tmp_path / "elsewhere").mkdir()
        code, _, err2 = await launch(*again[1:], cwd=tmp_path / "elsewhere")
        assert code == 3 and "1 session(s) of job jl ended in launcher_error" in err2, err2
        lines = [json.loads(x) for x in (tmp_path / "2.jsonl").read_text().splitlines()]
        assert sorted((r["case_id"], r["outcome"]) for r in lines) == [
            ("a", "succeeded"),
            ("b", "launcher_error"),
        ]
        code, _, err = await launch(
            *common, "--resume", "--rerun-launcher-errors", "--out", str(tmp_path / "3.jsonl"), cwd=tmp_path
        )
        assert code == 0, err
        assert len(up.requests) == 3 + 2  # case b ran again (2 calls)
        assert (
            "--resume: running again 1 session(s) of job jl that ended in launcher_error "
            "(--rerun-launcher-errors)" in err
        )
    assert rows(db, "SELECT case_id, attempts, outcome FROM job_environments ORDER BY case_id") == [
        ("a", 1, "succeeded"),
        ("b", 2, "succeeded"),
    ]


async def test_running_gateway_with_other_storage_is_refused(tmp_path: Path) -> None:
    """A given gateway is checked before anything runs: same storage, session path, route, the
    route's upstream."""
    from gateway.settings import GatewaySettings
    from tests.gateway.conftest import serve

    env_root = tmp_path / "envs"
    make_env(env_root)
    settings = GatewaySettings.model_validate(
        {
            "storage_config": {"db_url": f"sqlite://{tmp_path}/gateway.db"},
            "llm_routes": {"fake": {"base_url": "http://127.0.0.1:9/v1"}},
        }
    )
    gw = await serve(settings)
    common = ["--agent-root", str(env_root)]
    try:
        code, _, err = await launch(
            *common,
            "--llm-model",
            "fake",
            "--gateway-base-url",
            f"{gw.url}/v1/sessions",
            "--db-path",
            f"sqlite://{tmp_path}/launcher.db",
            cwd=tmp_path,
        )
        assert code == 1
        assert "records to" in err and "gateway.db" in err and "launcher.db" in err
        # same storage, but a URL without the session path, or a route the gateway does not have
        common += ["--db-path", f"sqlite://{tmp_path}/gateway.db"]
        code, _, err = await launch(
            *common, "--llm-model", "fake", "--gateway-base-url", gw.url, cwd=tmp_path
        )
        assert code == 1 and "must end with the gateway's session path '/v1/sessions'" in err
        code, _, err = await launch(
            *common, "--llm-model", "other", "--gateway-base-url", f"{gw.url}/v1/sessions", cwd=tmp_path
        )
        assert code == 1 and "no route 'other'" in err
        # all of that right, but the route's model server is down: refused now (exit 1), not
        # after the circuit breaker's wait
        import time

        started = time.monotonic()
        code, _, err = await launch(
            *common, "--llm-model", "fake", "--gateway-base-url", f"{gw.url}/v1/sessions", cwd=tmp_path
        )
        assert code == 1 and "is up, but route 'fake' is not: upstream of route fake" in err, err
        assert "start its model server" in err and time.monotonic() - started < 120
    finally:
        await gw.stop()
    assert not (tmp_path / "launcher.db").exists() or rows(
        tmp_path / "launcher.db", "SELECT count(*) FROM session_steps"
    ) == [(0,)]
    # refused before the plan: no session row written, so the same command runs again without --resume
    assert rows(tmp_path / "gateway.db", "SELECT count(*) FROM job_environments") == [(0,)]


async def test_gateway_with_auth_running_or_started(tmp_path: Path) -> None:
    """A running gateway with auth on: the launcher takes its key from $GATEWAY_API_KEY (checked
    before anything runs), closes sessions with it and hands it to runtimes as OPENAI_API_KEY. A
    gateway the launcher starts from a config with auth on: the launcher uses its first key."""
    from gateway.settings import GatewaySettings
    from tests.gateway.conftest import serve

    env_root = tmp_path / "envs"
    env_dir = make_env(env_root)
    (env_dir / "data" / "cases.jsonl").write_text(json.dumps(CASES[0]) + "\n")
    db = tmp_path / "trajs.db"
    base_env = {k: v for k, v in os.environ.items() if k not in ("GATEWAY_API_KEY", "OPENAI_API_KEY")}
    async with FakeUpstream() as up:
        settings = GatewaySettings.model_validate(
            {
                "storage_config": {"db_url": f"sqlite://{db}"},
                "auth": {"api_keys": ["sk-gw-key-1"]},
                "llm_routes": {"fake": {"base_url": up.base_url, "api_key": "sk-route-secret-123"}},
            }
        )
        gw = await serve(settings)
        common = [
            "--agent-root",
            str(env_root),
            "--llm-model",
            "fake",
            "--gateway-base-url",
            f"{gw.url}/v1/sessions",
            "--db-path",
            f"sqlite://{db}",
            "--enable-evaluation",
        ]
        try:
            code, _, err = await launch(*common, "--job-id", "ja0", cwd=tmp_path, env=base_env)
            assert code == 1 and "requires an API key" in err and "GATEWAY_API_KEY" in err, err
            code, _, err = await launch(
                *common, "--job-id", "ja1", cwd=tmp_path, env={**base_env, "GATEWAY_API_KEY": "sk-wrong"}
            )
            assert code == 1 and "refused the key in GATEWAY_API_KEY" in err, err
            out = tmp_path / "ext.jsonl"
            code, _, err = await launch(
                *common,
                "--job-id",
                "ja2",
                "--out",
                str(out),
                cwd=tmp_path,
                env={**base_env, "GATEWAY_API_KEY": "sk-gw-key-1"},
            )
            assert code == 0, err
        finally:
            await gw.stop()
        [record] = [json.loads(x) for x in out.read_text().splitlines()]
        assert (record["status"], record["score"], record["step_count"]) == ("succeeded", 10.0, 1)
        assert rows(db, "SELECT status, close_reason FROM gateway_sessions") == [("closed", "succeeded")]

        cfg = tmp_path / "gw-auth.yaml"
        cfg.write_text(
            yaml.safe_dump(
                {
                    "storage_config": {"db_url": f"sqlite://{db}"},
                    "auth": {"api_keys_env": "MY_GATEWAY_KEYS"},
                    "llm_routes": {"fake": {"base_url": up.base_url}},
                }
            )
        )
        out = tmp_path / "own.jsonl"
        code, _, err = await launch(
            "--agent-root",
            str(env_root),
            "--gateway-config",
            str(cfg),
            "--llm-model",
            "fake",
            "--db-path",
            f"sqlite://{db}",
            "--enable-evaluation",
            "--job-id",
            "ja3",
            "--out",
            str(out),
            cwd=tmp_path,
            env={**base_env, "MY_GATEWAY_KEYS": "k-a,k-b"},
        )
        assert code == 0, err
        [record] = [json.loads(x) for x in out.read_text().splitlines()]
        assert (record["status"], record["score"]) == ("succeeded", 10.0)
        # only the route's own key (none for the second gateway) ever went upstream
        calls = [r for r in up.requests if r.method == "POST"]  # not the start-up checks' GET /models
        assert [r.headers.get("authorization") for r in calls] == ["Bearer sk-route-secret-123", None]
    assert rows(db, "SELECT count(*) FROM gateway_sessions WHERE status = 'closed'") == [(2,)]


def test_bad_env_config_is_a_clear_error(tmp_path: Path) -> None:
    import subprocess

    env_dir = tmp_path / "envs" / "typo"
    env_dir.mkdir(parents=True)
    (env_dir / "env.yaml").write_text(
        "name: typo\ndataset: {path: x.jsonl}\nruntime: {command: [x]}\nmax_step: 3\n"
    )
    p = subprocess.run(
        [sys.executable, str(REPO / "launcher.py"), "--agent-root", str(tmp_path / "envs")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert p.returncode == 1
    assert "max_step" in p.stderr and "env.yaml" in p.stderr


def test_a_runtime_file_missing_from_the_env_folder_stops_the_job_before_it_runs(tmp_path: Path) -> None:
    from rollout.core.setup import SetupError
    from rollout.jobs.options import JobOptions
    from rollout.jobs.prepare import load_envs

    env_dir = tmp_path / "envs" / "typo"
    (env_dir / "data").mkdir(parents=True)
    (env_dir / "data" / "cases.jsonl").write_text('{"q": "hi"}\n')
    (env_dir / "env.yaml").write_text(
        "dataset: {path: data/cases.jsonl}\nruntime: {command: ['{python}', '{env_dir}/runtme.py']}\n"
    )
    opts = JobOptions(agent_root=tmp_path / "envs", gateway_config=REPO / "configs" / "gateway.yaml")
    with pytest.raises(
        SetupError,
        match=rf"env typo \(.*env.yaml\): runtime.command names {env_dir}/runtme.py, "
        "which does not exist",
    ):
        load_envs(opts)
    (env_dir / "runtme.py").write_text("")
    assert [c.name for c, _ in load_envs(opts)] == ["typo"]


@pytest.mark.parametrize("job_id", ["a/b", "../../x", ".hidden", "", "x" * 129])
def test_a_job_id_that_cannot_name_a_folder_is_refused(job_id: str) -> None:
    from pydantic import ValidationError

    from rollout.jobs.options import JobOptions

    with pytest.raises(ValidationError, match="job_id"):
        JobOptions(gateway_config=REPO / "configs" / "gateway.yaml", job_id=job_id)
    assert (
        JobOptions(gateway_config=REPO / "configs" / "gateway.yaml", job_id="exp-1.run_2").job_id
        == "exp-1.run_2"
    )


def test_integers_beyond_the_store_are_refused() -> None:
    from pydantic import ValidationError

    from rollout.jobs.options import JobOptions

    with pytest.raises(ValidationError, match="max_steps"):
        JobOptions(gateway_config=REPO / "configs" / "gateway.yaml", max_steps=2**63)


async def test_ctrl_c_cancels_closes_and_leaves_sessions_for_resume(tmp_path: Path) -> None:
    import signal

    env_root = tmp_path / "envs"
    env_dir = make_env(env_root)
    (env_dir / "data" / "cases.jsonl").write_text(
        "".join(
            json.dumps({"id": f"h{i}", "q": "hang", "expected": "", "hang": True}) + "\n" for i in range(3)
        )
    )
    db = tmp_path / "trajs.db"
    async with FakeUpstream() as up:
        cfg = gateway_config(tmp_path / "gw.yaml", up.base_url, db)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(REPO / "launcher.py"),
            "--agent-root",
            str(env_root),
            "--gateway-config",
            str(cfg),
            "--llm-model",
            "fake",
            "--db-path",
            f"sqlite://{db}",
            "--pool-size",
            "2",
            "--job-id",
            "jc",
            "--no-progress",
            cwd=str(tmp_path),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        for _ in range(300):  # wait until two sessions are running
            await asyncio.sleep(0.1)
            try:
                if rows(db, "SELECT count(*) FROM job_environments WHERE status='running'") == [(2,)]:
                    break
            except sqlite3.OperationalError:  # the launcher has not created its tables yet
                continue
        else:
            pytest.fail("sessions never started")
        await asyncio.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: to every process of the group
        _, err = await asyncio.wait_for(proc.communicate(), timeout=30)
    assert proc.returncode == 130, err.decode()[-2000:]
    assert "Traceback" not in err.decode(), err.decode()[-3000:]
    last = err.decode().splitlines()[-1]
    hint = (
        f"python {REPO / 'launcher.py'} --agent-root {env_root} --gateway-config {cfg} --llm-model fake "
        f"--db-path sqlite://{db} --pool-size 2 --no-progress --resume --job-id jc"
    )
    assert last == (
        f"interrupted: sessions in flight were cancelled and closed; rerun with {hint} to finish the job"
    )
    states = rows(db, "SELECT status, finished FROM job_environments ORDER BY case_id")
    assert states == [("cancelled", 0), ("cancelled", 0), ("pending", 0)]
    closed = rows(db, "SELECT status, close_reason FROM gateway_sessions")
    assert sorted(closed) == [("closed", "cancelled"), ("closed", "cancelled")]
    leftover = subprocess_lines(["pgrep", "-f", str(env_dir / "runtime.py")])
    assert leftover == []


def subprocess_lines(cmd: list[str]) -> list[str]:
    import subprocess

    return subprocess.run(cmd, capture_output=True, text=True).stdout.split()


async def test_setup_mistakes_stop_before_running(tmp_path: Path) -> None:
    """Mistakes a user makes stop the job with exit code 1 and a message naming the fix."""
    env_root = tmp_path / "envs"
    env_dir = make_env(env_root)
    (env_dir / "data" / "cases.jsonl").write_text(json.dumps(CASES[0]) + "\n")
    db = tmp_path / "trajs.db"
    async with FakeUpstream() as up:
        cfg = gateway_config(tmp_path / "gw.yaml", up.base_url, db)
        common = [
            "--agent-root",
            str(env_root),
            "--gateway-config",
            str(cfg),
            "--llm-model",
            "fake",
            "--db-path",
            f"sqlite://{db}",
        ]
        code, _, err = await launch(*common, "--resume", "--job-id", "nosuch", cwd=tmp_path)
        assert code == 1 and f"no trajectory store at {db} (pass the job's --db-path)" in err, err
        assert not db.exists()  # a resume never makes a store
        code, out, err = await launch(*common, "--job-id", "j1", cwd=tmp_path)
        assert code == 0, err
        regrade = (  # the run's flags that a regrade takes, from this folder
            f"python {REPO / 'launcher.py'} --agent-root {env_root} --db-path sqlite://{db} --no-progress "
            "--regrade --job-id j1"
        )
        assert (
            f"not graded: the job ran without --enable-evaluation (regrade it with {regrade})"
            in out.splitlines()
        ), out
        code, out, err = await launch(*shlex.split(regrade)[2:], cwd=tmp_path)  # it works as printed
        assert code == 0 and "regrade of job j1: 1 session regraded" in out, out + err
        code, _, err = await launch(*common, "--job-id", "j1", cwd=tmp_path)  # reused id, no --resume
        assert code == 1 and "already exists" in err and "--resume" in err
        code, _, err = await launch(*common, "--resume", "--job-id", "nosuch", cwd=tmp_path)
        assert code == 1 and "no job 'nosuch'" in err, err
        code, _, err = await launch(*common, "--pool-size", "0", cwd=tmp_path)
        assert code == 1 and "--pool-size" in err
        code, _, err = await launch(*common, "--eval-timeout", "0", cwd=tmp_path)
        assert code == 1 and "--eval-timeout" in err
        code, _, err = await launch(*common, "--llm-model", "nosuch", cwd=tmp_path)
        assert code == 1 and "not a route" in err
        # two env folders with the same name
        twin = env_root / "twin"
        twin.mkdir()
        (twin / "env.yaml").write_text((env_dir / "env.yaml").read_text())
        code, _, err = await launch(*common, cwd=tmp_path)
        assert code == 1 and "two envs are named 'toy'" in err
        assert len(up.requests) == 1  # only the one good run called the model


async def test_a_plain_db_path_is_a_sqlite_file(tmp_path: Path) -> None:
    """``--db-path`` takes a file path (relative to the cwd) as well as a URL; a file whose
    folder does not exist stops the job before anything runs."""
    env_root = tmp_path / "envs"
    env_dir = make_env(env_root)
    (env_dir / "data" / "cases.jsonl").write_text(json.dumps(CASES[0]) + "\n")
    (tmp_path / "runs").mkdir()
    db = tmp_path / "runs" / "plain.db"
    async with FakeUpstream() as up:
        cfg = gateway_config(tmp_path / "gw.yaml", up.base_url, tmp_path / "other.db")
        common = ["--agent-root", str(env_root), "--gateway-config", str(cfg), "--llm-model", "fake"]
        code, _, err = await launch(*common, "--db-path", "runs/plain.db", "--job-id", "rel", cwd=tmp_path)
        assert code == 0, err
        code, _, err = await launch(*common, "--db-path", str(db), "--job-id", "abs", cwd=tmp_path)
        assert code == 0, err
        assert rows(db, "SELECT job_id, count(*) FROM session_steps GROUP BY job_id ORDER BY job_id") == [
            ("abs", 1),
            ("rel", 1),
        ]
        assert not (tmp_path / "other.db").exists()  # the gateway the launcher started wrote to the same file
        for bad in ("nowhere/t.db", str(tmp_path / "nowhere" / "t.db"), f"sqlite://{tmp_path}/nowhere/t.db"):
            code, _, err = await launch(*common, "--db-path", bad, "--job-id", "bad", cwd=tmp_path)
            assert code == 1 and f"the folder {tmp_path}/nowhere of the SQLite file does not exist" in err, (
                err
            )
        (tmp_path / "runs" / "notes.db").write_text("these are notes, not a database\n")
        code, _, err = await launch(*common, "--db-path", "runs/notes.db", "--job-id", "bad", cwd=tmp_path)
        assert code == 1 and err.strip().splitlines()[-1] == (
            f"error: storage sqlite://{tmp_path / 'runs' / 'notes.db'}: cannot open the database "
            "(DatabaseError: file is not a database)"
        ), err
        assert "Traceback" not in err
        assert (tmp_path / "runs" / "notes.db").read_text() == "these are notes, not a database\n"
        code, _, err = await launch(
            *common, "--db-path", str(db), "--job-id", "rep", "--report", str(tmp_path), cwd=tmp_path
        )  # a folder given as the report: refused before the job
        assert (code, err.strip()) == (
            1,
            f"error: --report: {tmp_path} is a folder; give the file's path "
            f"(e.g. {tmp_path / 'report.html'})",
        )
        code, _, err = await launch(
            *common, "--db-path", str(db), "--job-id", "rep", "--out", str(tmp_path), cwd=tmp_path
        )
        assert (code, err.strip()) == (
            1,
            f"error: --out: {tmp_path} is a folder; give the file's path (e.g. {tmp_path / 'out.jsonl'})",
        )
        code, _, err = await launch(
            *common,
            "--db-path",
            str(db),
            "--job-id",
            "rep",
            "--out",
            str(tmp_path / "runs" / "notes.db" / "o.jsonl"),
            cwd=tmp_path,
        )
        assert (code, err.strip()) == (
            1,
            f"error: --out: {tmp_path / 'runs' / 'notes.db'} is a file, not a folder",
        )
        assert rows(db, "SELECT count(*) FROM job_environments WHERE job_id = 'rep'") == [(0,)]
        assert len(up.requests) == 2  # the refused runs called nothing
    assert not (tmp_path / "nowhere").exists()


async def test_sigterm_stops_everything(tmp_path: Path) -> None:
    """SIGTERM (a scheduler stopping the job) cancels sessions and stops the gateway the launcher
    started: exit 143, no orphan process."""
    import signal

    env_root = tmp_path / "envs"
    env_dir = make_env(env_root)
    (env_dir / "data" / "cases.jsonl").write_text(
        json.dumps({"id": "h", "q": "q", "expected": "", "hang": True})
    )
    db = tmp_path / "trajs.db"
    async with FakeUpstream() as up:
        cfg = gateway_config(tmp_path / "gw.yaml", up.base_url, db)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(REPO / "launcher.py"),
            "--agent-root",
            str(env_root),
            "--gateway-config",
            str(cfg),
            "--llm-model",
            "fake",
            "--db-path",
            f"sqlite://{db}",
            "--job-id",
            "jt",
            "--no-progress",
            cwd=str(tmp_path),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        gateway_log = tmp_path / "runs" / "logs" / "jt" / "gateway.log"
        for _ in range(6000):  # SIGTERM once the gateway is being started (a loaded machine may take long)
            if gateway_log.exists():
                break
            await asyncio.sleep(0.02)
        assert gateway_log.exists(), "the launcher never started its gateway"
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), timeout=30)
    assert proc.returncode == 143, err.decode()[-2000:]
    configs = list((tmp_path / "runs" / "logs" / "jt").glob("gateway-*.yaml"))
    assert configs and all(subprocess_lines(["pgrep", "-f", str(c)]) == [] for c in configs)


def test_retry_flags_and_start_config(tmp_path: Path) -> None:
    """--max-retries / --retry-backoff-s, and in the start config the failure classes and the
    breaker; a typo in a class or a breaker key is a clear error naming it."""
    from rollout.cli.run import parse_args
    from rollout.core.setup import SetupError

    opts, _ = parse_args([])
    assert (opts.max_retries, opts.retry_backoff_s) == (2, 1.0)
    assert not opts.rerun_launcher_errors
    with pytest.raises(SetupError) as ei:
        parse_args(["--rerun-launcher-errors"])
    assert str(ei.value) == "--rerun-launcher-errors is only used with --resume"
    assert parse_args(["--resume", "--job-id", "j", "--rerun-launcher-errors"])[0].rerun_launcher_errors
    assert opts.retry_policy().retries("gateway_unreachable") and not opts.retry_policy().retries(
        "launcher_error"
    )
    with pytest.raises(SetupError, match="--rl-group-size: Input should be less than or equal to 10000"):
        parse_args(["--rl-group-size", str(10**11)])  # refused before planning, not planned for ever
    for flag in ("--retry-backoff-s", "--llm-temperature", "--eval-timeout"):
        with pytest.raises(SetupError, match=f"{flag}: Input should be a finite number"):
            parse_args([flag, "inf"])  # not dropped or turned into an error of every session later
    start = tmp_path / "start.yaml"
    start.write_text(
        yaml.safe_dump(
            {
                "max_retries": 5,
                "no_retry_on": ["setup_failed"],
                "retry_on": ["setup_failed", "upstream_unavailable", "launcher_error"],
                "breaker": {"window": 8, "min_failures": 2, "max_wait_s": 30},
            }
        )
    )
    opts, _ = parse_args(
        ["--agent-start-config", str(start), "--max-retries", "1", "--retry-backoff-s", "0.5"]
    )
    policy = opts.retry_policy()
    assert (policy.max_retries, policy.backoff_s) == (1, 0.5)  # flags win over the start config
    assert policy.retries("launcher_error") and policy.retries("upstream_unavailable")
    assert not policy.retries("setup_failed") and not policy.retries("gateway_unreachable")
    assert (opts.breaker.window, opts.breaker.min_failures, opts.breaker.max_wait_s) == (8, 2, 30.0)
    start.write_text(
        yaml.safe_dump({"retry_on": ["runtime_crashed"]})
    )  # no valid result is the agent's outcome
    with pytest.raises(SetupError, match=r"not infrastructure failure classes: \['runtime_crashed'\]"):
        parse_args(["--agent-start-config", str(start)])
    start.write_text(yaml.safe_dump({"retry_on": ["gateway_down"]}))
    with pytest.raises(
        SetupError,
        match=rf"^--agent-start-config {start}: retry_on: .*not infrastructure failure "
        r"classes: \['gateway_down'\]",
    ):
        parse_args(["--agent-start-config", str(start)])
    start.write_text(yaml.safe_dump({"breaker": {"windw": 3}}))
    with pytest.raises(SetupError) as ei:  # a key of the file is named as such, not as a flag
        parse_args(["--agent-start-config", str(start)])
    assert (
        str(ei.value) == f"--agent-start-config {start}: breaker.windw: unknown key (did you mean 'window'?)"
    )
    start.write_text("pool_sise: 3\nmax_retries: 4\n")
    with pytest.raises(SetupError) as ei:
        parse_args(["--agent-start-config", str(start), "--pool-size", "0"])
    assert str(ei.value) == (
        f"--pool-size: Input should be greater than or equal to 1 (got 0)\n"
        f"--agent-start-config {start}: pool_sise: unknown key (did you mean 'pool_size'?)"
    )
    with pytest.raises(
        SetupError, match=r"^--max-retries: Input should be greater than or equal to 0 \(got -1\)$"
    ):
        parse_args(["--max-retries", "-1"])


def test_report_of_a_stopped_job_and_of_infra_failures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rollout.cli.next_steps import launcher_command
    from rollout.cli.run import report
    from rollout.jobs.breaker import BreakerEvent
    from rollout.jobs.run import JobResult
    from rollout.results.report import AttemptRecord, ReportTotals, SessionRecord

    def rec(case: str, outcomes: list[str], status: str = "succeeded") -> SessionRecord:
        attempts = [
            AttemptRecord(
                attempt=i + 1,
                status="error",
                outcome=o,
                infra=o != "succeeded",
                steps_session_id=f"{case}~a{i + 1}",
            )
            for i, o in enumerate(outcomes)
        ]
        return SessionRecord(
            session_id=case,
            job_id="j",
            env_name="e",
            case_id=case,
            group_id=case,
            model="m",
            sample_index=0,
            status=status,
            outcome=outcomes[-1],
            retried=len(outcomes) > 1,
            attempts=attempts,
            score=10.0 if status == "succeeded" else None,
            eval_status="scored" if status == "succeeded" else "infra_error",
        )

    records = [
        rec("a", ["gateway_unreachable", "succeeded"]),
        rec("b", ["upstream_unavailable", "upstream_unavailable"], status="error"),
    ]
    result = JobResult(
        job_id="j",
        totals=ReportTotals.of(records),
        out=tmp_path / "o.jsonl",
        store="sqlite:///x.db",
        breaker_events=[BreakerEvent(state="open", reason="r"), BreakerEvent(state="stopped", reason="s")],
        stopped="the gateway or its upstream did not answer for 300 s",
    )
    assert report(result, False) == 3
    out, err = capsys.readouterr()
    assert (
        "3 attempts ended in an infrastructure failure; 1 session never recovered (not graded, reward NULL)"
        in out
    )
    assert "circuit breaker opened 1 time(s)" in out
    assert (
        "job stopped: the gateway or its upstream did not answer for 300 s; rerun with "
        f"{launcher_command()} --resume --job-id j to finish it" in err
    )
    # the job completed but a session never recovered from an infrastructure failure: 3 too
    assert report(result.model_copy(update={"stopped": None}), False) == 3
    assert (
        "error: 1 session lost to infrastructure failures after every retry; rerun with "
        f"{launcher_command()} --resume --job-id j to run them again" in capsys.readouterr().err
    )
    # only the infrastructure decides: the same job with session b's failure an agent's, not an outage, is 0
    agent = [records[0], rec("b", ["timeout"], status="timeout")]
    assert report(result.model_copy(update={"stopped": None, "totals": ReportTotals.of(agent)}), False) == 0


def test_progress_on_a_non_terminal_is_a_line_per_tenth(capsys: pytest.CaptureFixture[str]) -> None:
    from rollout.cli.run import Progress
    from rollout.results.report import SessionRecord

    def rec(env: str, i: int) -> SessionRecord:
        return SessionRecord(
            session_id=f"{env}{i}",
            job_id="j",
            env_name=env,
            case_id=str(i),
            group_id=str(i),
            model="m",
            sample_index=0,
            status="succeeded",
            score=float(i % 2) * 10,
            eval_status="scored",
        )

    display = Progress(enabled=True)  # stderr is captured here: not a terminal, so no frame
    display.plan({"a": 15, "b": 5})
    display.start("j", 20)
    for i in range(15):
        display.done(rec("a", i))
    for i in range(5):
        display.done(rec("b", i))
    display.close()
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == "" and display.drawn == 0 and "\x1b" not in err
    assert [line.split(":")[0] for line in lines] == [f"progress {n}/20" for n in range(2, 21, 2)]
    assert lines[-1].startswith(
        "progress 20/20: a 15/15 mean 4.67 | b 5/5 mean 4.00 | mean 4.50 | problems none | "
    )
    assert lines[-1].endswith(" sessions/min")

    quiet = Progress(enabled=False)
    quiet.plan({"a": 1})
    quiet.start("j", 1)
    quiet.done(rec("a", 1))
    assert capsys.readouterr() == ("", "") and quiet.state.n_done == 1


TOLD_RUNTIME = """
import os, time
from env.runtime_kit import chat_completion, openai_client, run_runtime
from rollout.contract.protocol import SimulationStartResult

def main(req):
    row = req.env_params["dataset"]
    with open(req.instruction_path, encoding="utf-8") as f:
        told = (req.case_id, os.environ["ROLLOUT_CASE_ID"], os.environ["ROLLOUT_INSTRUCTION_PATH"], f.read())
    assert told == (row["id"], row["id"], req.instruction_path, row["instruction"]), told
    if row.get("hang"):
        time.sleep(60)
    completion, text = chat_completion(openai_client(req, max_retries=0), model=req.model,
                                       messages=[{"role": "user", "content": row["instruction"]}])
    return SimulationStartResult(session_id=req.session_id, status="succeeded", step_count=1)

run_runtime(main)
"""


async def test_case_timeout_and_tasks_flags_run_exactly_what_they_name(tmp_path: Path) -> None:
    """``--case`` runs the named cases only (an unknown id names the nearest), ``--timeout`` is
    each session's, a runtime timeout is a result (exit 0), the runtime is told its case and
    instruction; ``--tasks`` runs a folder of task folders, graded by their expected.json."""
    env_root = tmp_path / "envs"
    env_dir = make_env(
        env_root,
        [
            {
                "id": i,
                "instruction": f"say hello ({i})",
                "q": "",
                "expected": DEFAULT_TEXT,
                "hang": i == "slow",
            }
            for i in ("fast", "other", "slow")
        ],
    )
    (env_dir / "runtime.py").write_text(TOLD_RUNTIME)
    config = yaml.safe_load((env_dir / "env.yaml").read_text())
    config["runtime"]["timeout_s"] = 1  # --timeout overrides it
    (env_dir / "env.yaml").write_text(yaml.safe_dump(config))
    db = tmp_path / "trajs.db"
    async with FakeUpstream() as up:
        cfg = gateway_config(tmp_path / "gw.yaml", up.base_url, db)
        common = (
            "--gateway-config",
            str(cfg),
            "--llm-model",
            "fake",
            "--db-path",
            str(db),
            "--enable-evaluation",
        )
        code, _, stderr = await launch("--agent-root", str(env_root), *common, "--case", "slwo", cwd=tmp_path)
        assert (code, stderr.strip()) == (
            1,
            "error: --case: no such case 'slwo' (nearest: slow) in env(s) toy",
        )
        assert not db.exists()  # refused before anything ran
        code, _, stderr = await launch(
            "--agent-root",
            str(env_root),
            *common,
            "--case",
            "slow",
            "--case",
            "fast",
            "--timeout",
            "15",
            "--job-id",
            "cases",
            "--out",
            str(tmp_path / "c.jsonl"),
            cwd=tmp_path,
        )
        assert code == 0, stderr
        records = {r["case_id"]: r for r in map(json.loads, (tmp_path / "c.jsonl").read_text().splitlines())}
        assert sorted(records) == ["fast", "slow"]
        assert (records["fast"]["status"], records["fast"]["score"], records["fast"]["reward"]) == (
            "succeeded",
            10.0,
            1.0,
        )
        assert records["slow"]["status"] == "timeout" and "timed out after 15 s" in records["slow"]["error"]

        bench = tmp_path / "mybench" / "tasks"
        for task in ("read_name", "tally"):
            (bench / task).mkdir(parents=True)
            for name in ("instruction.md", "expected.json"):
                (bench / task / name).write_bytes(
                    (REPO / "env" / "basics" / "tasks" / task / name).read_bytes()
                )
        code, stdout, stderr = await launch(
            "--tasks",
            str(bench),
            *common,
            "--case",
            "tally",
            "--job-id",
            "tasks",
            "--out",
            str(tmp_path / "t.jsonl"),
            "--max-steps",
            "1",
            cwd=tmp_path,
        )
        assert code == 0, stderr
        [record] = map(json.loads, (tmp_path / "t.jsonl").read_text().splitlines())
        # the bundled bash agent ran; the fake model wrote no answer file: graded 0 by the expected.json rule
        assert (record["env_name"], record["case_id"], record["score"], record["reward"]) == (
            "mybench",
            "tally",
            0.0,
            0.0,
        )
        assert record["reason"] == "outputs/answer.json is missing" and "mybench" in stdout
