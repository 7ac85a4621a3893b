"""rollout.jobs.regrade: a job run for real (in-process gateway, fake upstream, runtime subprocesses),
graded again with a fixed evaluator from the store only; and the rules on a job built with the
store API (what is not regraded, evaluator failures, history)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from rollout.core.envs import WorkspaceArchiveConfig
from rollout.core.setup import SetupError
from rollout.jobs.options import JobOptions
from rollout.jobs.regrade import (
    RegradeOptions,
    regrade_blocker,
    regrade_exit_code,
    regrade_job,
    render_regrade_summary,
)
from rollout.jobs.run import run_job
from rollout.jobs.workspace_archive import keep_workspace
from store import JobEnvironment, SessionResult, Store, launcher_rows, step_record
from tests.fake_upstream import DEFAULT_TEXT, FakeUpstream, chat_completion
from tests.gateway.conftest import make_settings, serve

pytestmark = pytest.mark.usefixtures("no_leaked_threads")
REPO = Path(__file__).resolve().parents[2]

RUNTIME = """
from pathlib import Path
from env.runtime_kit import chat_completion, openai_client, run_runtime
from rollout.contract.protocol import SimulationStartResult

def main(req):
    row = req.env_params["dataset"]
    client = openai_client(req, max_retries=0)
    completion, _ = chat_completion(client, model=req.model, messages=[{"role": "user", "content": row["q"]}])
    text = completion.choices[0].message.content
    Path("outputs").mkdir()
    Path("outputs/answer.txt").write_text(text)
    if row.get("big"):
        Path("big.bin").write_bytes(b"x" * 4096)
    return SimulationStartResult(session_id=req.session_id, status="succeeded", step_count=1, metrics={"text": text})

run_runtime(main)
"""

BUGGY = """
def evaluate(request, spec, trajectory):
    return 3
"""

FIXED = """
from pathlib import Path

def evaluate(request, spec, trajectory):
    row = request.env_params["dataset"]
    if row.get("bad_eval"):
        raise KeyError("expected_answer")
    answer = (Path(request.workspace) / "outputs" / "answer.txt").read_text()
    ok = answer == row["expected"] == trajectory.final_response == request.start_result.metrics["text"]
    return {"score": 10 if ok else 1, "reason": f"answer {answer!r}"}
"""

CASES = [
    {"id": "a", "q": "hi", "expected": DEFAULT_TEXT},
    {"id": "b", "q": "hi", "expected": "something else"},
    {"id": "c", "q": "hi", "expected": DEFAULT_TEXT, "big": True},
    {"id": "f", "q": "hi", "expected": DEFAULT_TEXT, "bad_eval": True},
    {"id": "i", "q": "hi", "expected": DEFAULT_TEXT},
    {"id": "u", "q": "hi", "expected": DEFAULT_TEXT},
]


def write_env(root: Path, evaluator: str) -> Path:
    env_dir = root / "toy"
    (env_dir / "data").mkdir(parents=True)
    (env_dir / "runtime.py").write_text(RUNTIME)
    (env_dir / "rule_evaluator.py").write_text(evaluator)
    (env_dir / "data" / "cases.jsonl").write_text("".join(json.dumps(c) + "\n" for c in CASES))
    (env_dir / "env.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "toy",
                "dataset": {"path": "data/cases.jsonl", "id_field": "id", "hidden_fields": ["expected"]},
                "runtime": {"command": ["{python}", "{env_dir}/runtime.py"], "timeout_s": 60},
                "workspace_archive": {"max_bytes": 2048},
                "max_steps": 2,
            }
        )
    )
    return env_dir


def sql(db: Path, query: str, *params: Any) -> list[tuple[Any, ...]]:
    import sqlite3

    con = sqlite3.connect(db)
    try:
        rows = con.execute(query, params).fetchall()
        con.commit()
        return rows
    finally:
        con.close()


class Spy:
    """Records (and refuses) every process start and every outgoing httpx request."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.processes: list[Any] = []
        self.requests: list[str] = []
        real_send = httpx.AsyncClient.send

        def popen(*args: Any, **kw: Any) -> Any:
            self.processes.append(args[1] if len(args) > 1 else kw.get("args"))
            raise AssertionError("a process was started")

        async def send(client: httpx.AsyncClient, request: httpx.Request, **kw: Any) -> httpx.Response:
            self.requests.append(str(request.url))
            return await real_send(client, request, **kw)

        monkeypatch.setattr(subprocess.Popen, "__init__", popen)
        monkeypatch.setattr(httpx.AsyncClient, "send", send)


async def test_fixed_grader_regrades_a_real_job_from_the_store_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_root, fixed_root = tmp_path / "run-envs", tmp_path / "fixed-envs"
    write_env(run_root, BUGGY)
    write_env(fixed_root, FIXED)
    db = tmp_path / "trajs.db"
    # the job's end of each session and the regrade write the evaluation through one function
    writes: list[tuple[str, bool]] = []
    write_evaluation = launcher_rows.write_evaluation

    def spy(conn: Any, session_id: str, **kw: Any) -> Any:
        writes.append((session_id, kw.get("keep_previous", False)))
        return write_evaluation(conn, session_id, **kw)

    monkeypatch.setattr(launcher_rows, "write_evaluation", spy)
    async with FakeUpstream() as up:
        gw = await serve(make_settings(up, f"sqlite://{db}"))
        try:
            result = await run_job(
                JobOptions(
                    agent_root=run_root,
                    gateway_base_url=f"{gw.url}/v1/sessions",
                    gateway_config=REPO / "configs" / "gateway.yaml",
                    llm_model="m",
                    enable_evaluation=True,
                    db_path=f"sqlite://{db}",
                    pool_size=3,
                    job_id="j1",
                    out=tmp_path / "run.jsonl",
                )
            )
            assert {r.case_id: (r.status, r.score) for r in result.records} == {
                c["id"]: ("succeeded", 3.0) for c in CASES
            }
            # the outcomes of other parts of the launcher: an infrastructure failure (no reward) and an
            # unfinished session
            sql(
                db,
                "UPDATE job_environments SET reward = NULL, status = 'error', outcome = 'gateway_unreachable', "
                "eval_status = 'infra_error', error_text = 'gateway unreachable' WHERE case_id = 'i'",
            )
            sql(db, "UPDATE job_environments SET finished = 0, status = 'cancelled' WHERE case_id = 'u'")
            kept = dict(
                sql(
                    db,
                    "SELECT j.case_id, w.status FROM session_workspaces w "
                    "JOIN job_environments j ON j.env_id = w.session_id",
                )
            )
            assert kept == {"a": "kept", "b": "kept", "c": "too_large", "f": "kept", "i": "kept", "u": "kept"}
            case_of = dict(sql(db, "SELECT env_id, case_id FROM job_environments"))
            assert sorted((case_of[sid], keep) for sid, keep in writes) == [(c["id"], False) for c in CASES]
            writes.clear()
            upstream_calls = len(up.requests)
            steps_before = sql(db, "SELECT record_id, session_id, seq, request, response FROM session_steps")
            gateway_before = sql(db, "SELECT * FROM gateway_sessions")
            attempts_before = sql(
                db, "SELECT env_id, attempts, started_at, finished_at FROM job_environments"
            )

            spy = Spy(monkeypatch)
            seen: list[Any] = []
            # graded in the launcher here, so that no process at all may start (the grader sandbox is one)
            regrade = await regrade_job(
                RegradeOptions(
                    job_id="j1",
                    db_path=f"sqlite://{db}",
                    agent_root=fixed_root,
                    out=tmp_path / "regrade.jsonl",
                    grader_isolation="none",
                ),
                on_done=seen.append,
            )
            monkeypatch.undo()
        finally:
            await gw.stop()

    # nothing ran and nothing was called: no process, no HTTP request, no upstream call, no new step
    assert spy.processes == [] and spy.requests == []
    assert len(up.requests) == upstream_calls
    assert sql(db, "SELECT record_id, session_id, seq, request, response FROM session_steps") == steps_before
    assert sql(db, "SELECT * FROM gateway_sessions") == gateway_before
    assert (
        sql(db, "SELECT env_id, attempts, started_at, finished_at FROM job_environments") == attempts_before
    )

    got = {r.case_id: (r.after_status, r.after_score, r.before_score) for r in regrade.regraded}
    # f's grader raises on its case whatever the agent did (on the control too): broken
    assert got == {"a": ("scored", 10.0, 3.0), "b": ("scored", 1.0, 3.0), "f": ("grader_broken", None, 3.0)}
    assert [r.reason for r in regrade.regraded if r.case_id == "f"] == [
        "grader broken: it failed on this session (error: KeyError: 'expected_answer') and on the control, the "
        "untouched starting workspace (error: KeyError: 'expected_answer'); not counted"
    ]
    blocked = {r.case_id: (r.kind, r.reason) for r in regrade.not_regraded}
    assert blocked == {
        "c": (
            "no_workspace",
            "final workspace not kept: its files hold more than 2048 bytes "
            "(cap: workspace_archive.max_bytes in env.yaml)",
        ),
        "i": ("infrastructure_failure", "not graded in the run (gateway_unreachable: gateway unreachable)"),
        "u": ("not_finished", "not finished (status cancelled): complete it with --resume --job-id j1 first"),
    }
    assert len(seen) == len(CASES)
    assert regrade_exit_code(regrade) == 2

    assert sorted((case_of[sid], keep) for sid, keep in writes) == [("a", True), ("b", True), ("f", True)]
    # the store: new reward on the session row and its last step, the previous evaluation kept
    state = {
        case: (reward, status, json.loads(history) if history else None)
        for case, reward, status, history in sql(
            db, "SELECT case_id, reward, eval_status, eval_history FROM job_environments"
        )
    }
    assert {k: v[:2] for k, v in state.items()} == {
        "a": (10.0, "scored"),
        "b": (1.0, "scored"),
        "c": (3.0, "scored"),
        "f": (None, "grader_broken"),
        "i": (None, "infra_error"),
        "u": (3.0, "scored"),
    }
    [previous] = state["a"][2]
    assert (previous["eval_status"], previous["reward"], previous["eval_detail"]) == (
        "scored",
        3.0,
        {"raw_repr": "3", "artifacts": None, "isolation": "bwrap"},
    )
    assert state["c"][2] is None and state["i"][2] is None
    a_id = sql(db, "SELECT env_id FROM job_environments WHERE case_id = 'a'")[0][0]
    reward, step_reward, meta = sql(
        db,
        "SELECT reward, step_reward, meta_json FROM session_steps WHERE session_id = ? AND is_terminal = 1",
        a_id,
    )[0]
    meta = json.loads(meta)
    assert (reward, step_reward) == (10.0, 10.0)
    assert (meta["evaluation"]["status"], meta["evaluation"]["score"]) == ("scored", 10.0)
    assert meta["evaluation"]["reason"] == f"answer {DEFAULT_TEXT!r}"
    fixed_sha = hashlib.sha256((fixed_root / "toy" / "rule_evaluator.py").read_bytes()).hexdigest()
    assert meta["evaluation"]["evaluator_sha256"] == fixed_sha
    assert [(e["status"], e["score"]) for e in meta["evaluation_history"]] == [("scored", 3.0)]

    # the report covers the finished sessions, with the new scores
    lines = {
        r["case_id"]: r["score"]
        for r in map(json.loads, (tmp_path / "regrade.jsonl").read_text().splitlines())
    }
    assert lines == {"a": 10.0, "b": 1.0, "c": 3.0, "f": None, "i": None}
    summary = render_regrade_summary(regrade)
    assert summary.splitlines()[0] == (
        "regrade of job j1: 3 sessions regraded (3 changed), 3 not regraded (previous evaluation kept)"
    )
    assert "  toy: 1 cannot be regraded (no_workspace): final workspace not kept" in summary

    # a second regrade with the same grader: same scores, nothing changed, the history grows
    again = await regrade_job(
        RegradeOptions(
            job_id="j1",
            db_path=f"sqlite://{db}",
            agent_root=fixed_root,
            env_names=["toy"],
            out=tmp_path / "again.jsonl",
        )
    )
    assert [(r.case_id, r.after_score, r.changed) for r in again.regraded] == [
        ("a", 10.0, False),
        ("b", 1.0, False),
        ("f", None, False),
    ]
    history = json.loads(sql(db, "SELECT eval_history FROM job_environments WHERE case_id = 'a'")[0][0])
    assert [(h["eval_status"], h["reward"]) for h in history] == [("scored", 3.0), ("scored", 10.0)]


# ------------------------------------------------------------------------------------------------
# a job written with the store API
# ------------------------------------------------------------------------------------------------


def session(sid: str, env: str, case: str, **values: Any) -> JobEnvironment:
    return JobEnvironment(
        session_id=sid,
        job_id="js",
        env_name=env,
        case_id=case,
        llm_model="m",
        group_id=f"g-{case}",
        env_params={"dataset": {"expected": "42"}},
        **values,
    )


async def stored_job(store: Store, tmp_path: Path, rows: list[JobEnvironment], *, archive: set[str]) -> None:
    """Insert ``rows``, one step answering "42" for each, finish them with their own evaluation
    columns, and keep a workspace (with outputs/answer.txt = "42") for the sessions in ``archive``."""
    await store.init()
    await store.add_job_sessions([r.model_copy(update={"finished": False}) for r in rows])
    await store.write_batch(
        [
            step_record(
                session_id=r.session_id,
                seq=1,
                step_id=1,
                llm_model="m",
                endpoint="chat.completions",
                response=chat_completion("42"),
            )
            for r in rows
        ],
        [],
    )
    for r in rows:
        if r.finished:
            meta = {"status": r.eval_status, "score": r.reward} if r.eval_status else None
            await store.finish_job_session(
                r.session_id,
                SessionResult(
                    reward=r.reward,
                    evaluation=meta,
                    status=r.status,
                    eval_status=r.eval_status,
                    eval_reason=r.eval_reason,
                ),
            )
        if r.session_id in archive:
            ws = tmp_path / f"ws-{r.session_id}"
            (ws / "outputs").mkdir(parents=True)
            (ws / "outputs" / "answer.txt").write_text("42")
            await keep_workspace(store, r, WorkspaceArchiveConfig(), ws)


def evaluators(root: Path, **bodies: str) -> Path:
    for env, body in bodies.items():
        (root / env).mkdir(parents=True, exist_ok=True)
        (root / env / "rule_evaluator.py").write_text(textwrap.dedent(body))
    return root


async def test_evaluator_outcomes_and_what_is_not_regraded(
    tmp_path: Path, releasers: list[Callable[[], None]]
) -> None:
    db = tmp_path / "s.db"
    store = Store(f"sqlite://{db}")
    rows = [
        session("s-ok", "math", "1", finished=True, status="succeeded", reward=0.0, eval_status="scored"),
        session("s-never", "math", "2", finished=True, status="succeeded"),  # run without --enable-evaluation
        session("s-old", "math", "3", finished=True, status="failed", reward=0.0, eval_status="scored"),
        session("s-harness", "math", "4", finished=True, status="error"),  # the harness failed, no reward
        session("s-nan", "nan", "1", finished=True, status="succeeded", reward=5.0, eval_status="scored"),
        session("s-hang", "hang", "1", finished=True, status="succeeded", reward=5.0, eval_status="scored"),
        session("s-none", "gone", "1", finished=True, status="succeeded", reward=5.0, eval_status="scored"),
    ]
    try:
        await stored_job(
            store, tmp_path, rows, archive={"s-ok", "s-never", "s-harness", "s-nan", "s-hang", "s-none"}
        )
    finally:
        await store.close()
    root = evaluators(
        tmp_path / "envs",
        math="""
        from pathlib import Path
        def evaluate(request, spec, trajectory):
            answer = (Path(request.workspace) / "outputs" / "answer.txt").read_text()
            return 10 if answer == request.env_params["dataset"]["expected"] == trajectory.final_response else 0
        """,
        nan="""
        def evaluate(request, spec, trajectory):
            return float("nan")
        """,
        hang="""
        import threading
        RELEASE = threading.Event()
        def evaluate(request, spec, trajectory):
            RELEASE.wait(3600)
            return 10
        """,
    )

    def release() -> None:
        from rollout.grading.evaluator_loader import load_evaluator

        load_evaluator(root / "hang" / "rule_evaluator.py").__globals__["RELEASE"].set()

    releasers.append(release)
    # an evaluator that never returns: the regrade's timeout (it blocks until released, so the
    # outcome does not depend on the machine's speed)
    hung = await regrade_job(
        RegradeOptions(
            job_id="js",
            db_path=f"sqlite://{db}",
            agent_root=root,
            env_names=["hang"],
            eval_timeout=0.3,
            out=tmp_path / "h.jsonl",
        )
    )
    assert [(r.session_id, r.after_status, r.after_score, r.reason) for r in hung.regraded] == [
        (
            "s-hang",
            "grader_broken",
            None,
            "grader broken: it failed on this session (timeout: evaluator timed out "
            "after 0.3 s) and on the control, the untouched starting workspace "
            "(timeout: evaluator timed out after 0.3 s); not counted",
        )
    ]
    assert regrade_exit_code(hung) == 2

    result = await regrade_job(
        RegradeOptions(
            job_id="js",
            db_path=f"sqlite://{db}",
            agent_root=root,
            env_names=["math", "nan", "gone"],
            out=tmp_path / "r.jsonl",
        )
    )
    got = {
        r.session_id: (r.before_status, r.before_score, r.after_status, r.after_score)
        for r in result.regraded
    }
    assert got == {
        "s-ok": ("scored", 0.0, "scored", 10.0),
        "s-never": (None, None, "scored", 10.0),  # graded for the first time
        "s-nan": ("scored", 5.0, "grader_broken", None),  # NaN on the control too: the grader is broken
    }
    blocked = {r.session_id: (r.kind, r.reason) for r in result.not_regraded}
    assert blocked == {
        "s-old": ("no_workspace", "no kept workspace (the run did not archive it)"),
        "s-harness": ("infrastructure_failure", "the run ended in status error without a score (None)"),
        "s-none": (
            "no_evaluator",
            f"env 'gone' has no rule_evaluator.py under {root} (an env the job ran from --tasks DIR or "
            "--agent-config needs that flag again)",
        ),
    }
    assert regrade_exit_code(result) == 2
    store = Store(f"sqlite://{db}")
    try:
        state = {
            r.session_id: (r.reward, r.eval_status, r.eval_history) for r in await store.job_sessions("js")
        }
    finally:
        await store.close()
    assert state["s-never"] == (10.0, "scored", None)  # no previous evaluation to keep
    assert state["s-old"] == (0.0, "scored", None) and state["s-none"] == (5.0, "scored", None)
    assert state["s-harness"] == (None, None, None)
    assert state["s-nan"][:2] == (None, "grader_broken")
    assert [(h["eval_status"], h["reward"]) for h in state["s-nan"][2]] == [("scored", 5.0)]

    # only one env, fully regradable, but its grader is broken (NaN on the control too): exit code 2
    only = await regrade_job(
        RegradeOptions(
            job_id="js",
            db_path=f"sqlite://{db}",
            agent_root=root,
            env_names=["nan"],
            out=tmp_path / "n.jsonl",
        )
    )
    assert [(r.session_id, r.after_status) for r in only.regraded] == [("s-nan", "grader_broken")]
    assert only.not_regraded == [] and regrade_exit_code(only) == 2
    assert [r.session_id for r in only.records] == ["s-nan"]


async def test_bad_stored_data_fails_that_session_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "s.db"
    store = Store(f"sqlite://{db}")
    rows = [
        session(f"s{i}", "math", str(i), finished=True, status="succeeded", reward=0.0, eval_status="scored")
        for i in range(3)
    ]
    try:
        await stored_job(store, tmp_path, rows, archive={"s0", "s1", "s2"})
        await store.update_job_session("s1", result={"session_id": "s1", "status": "exploded"})
    finally:
        await store.close()
    root = evaluators(
        tmp_path / "envs",
        math="""
        def evaluate(request, spec, trajectory):
            return 7
        """,
    )
    import rollout.jobs.regrade as regrade_module

    real = regrade_module.to_trajectory

    def broken(sid: str, steps: list[Any]) -> Any:
        if sid == "s2":
            raise TypeError("cannot read step 1")
        return real(sid, steps)

    monkeypatch.setattr(regrade_module, "to_trajectory", broken)
    result = await regrade_job(
        RegradeOptions(job_id="js", db_path=f"sqlite://{db}", agent_root=root, out=tmp_path / "r.jsonl")
    )
    assert [(r.session_id, r.after_score) for r in result.regraded] == [("s0", 7.0)]
    blocked = {r.session_id: (r.kind, r.reason) for r in result.not_regraded}
    assert blocked["s2"] == (
        "regrade_error",
        "the regrade failed for this session: TypeError: cannot read step 1",
    )
    assert blocked["s1"][0] == "bad_stored_data" and blocked["s1"][1].startswith(
        "stored start result is invalid"
    )
    assert {r.session_id: r.score for r in result.records} == {"s0": 7.0, "s1": 0.0, "s2": 0.0}


async def test_cancelled_regrade_leaves_each_session_new_or_previous(
    tmp_path: Path, releasers: list[Callable[[], None]]
) -> None:
    """Ctrl-C while a regrade runs: finished sessions keep their new evaluation, the one whose
    evaluator is still running and those not started keep their previous one."""
    db = tmp_path / "s.db"
    store = Store(f"sqlite://{db}")
    rows = [
        session(f"s{i}", "math", str(i), finished=True, status="succeeded", reward=1.0, eval_status="scored")
        for i in range(3)
    ]
    try:
        await stored_job(store, tmp_path, rows, archive={"s0", "s1", "s2"})
    finally:
        await store.close()
    root = evaluators(
        tmp_path / "envs",
        math="""
        import threading
        RELEASE = threading.Event()
        def evaluate(request, spec, trajectory):
            if request.session_id != "s0":
                RELEASE.wait(3600)
            return 9
        """,
    )

    def release() -> None:
        from rollout.grading.evaluator_loader import load_evaluator

        load_evaluator(root / "math" / "rule_evaluator.py").__globals__["RELEASE"].set()

    releasers.append(release)
    done: list[str] = []
    task = asyncio.create_task(
        regrade_job(
            RegradeOptions(
                job_id="js", db_path=f"sqlite://{db}", agent_root=root, pool_size=1, out=tmp_path / "r.jsonl"
            ),
            on_done=lambda item: done.append(item.session_id),
        )
    )
    for _ in range(3000):  # until s0 is committed and s1's evaluator is running
        await asyncio.sleep(0.01)
        if done == ["s0"] and abandoned_or_running("s1"):
            break
    assert done == ["s0"]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    state = dict(sql(db, "SELECT env_id, reward FROM job_environments"))
    assert state == {"s0": 9.0, "s1": 1.0, "s2": 1.0}


def abandoned_or_running(session_id: str) -> bool:
    import threading

    return any(t.name == f"evaluator-math/{session_id}" for t in threading.enumerate())


async def test_evaluator_found_next_to_an_agent_config(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    store = Store(f"sqlite://{db}")
    try:
        await stored_job(
            store,
            tmp_path,
            [session("s1", "math", "1", finished=True, status="succeeded", reward=0.0, eval_status="scored")],
            archive={"s1"},
        )
    finally:
        await store.close()
    root = evaluators(
        tmp_path / "elsewhere",
        math="""
        def evaluate(request, spec, trajectory):
            return 4
        """,
    )
    (root / "math" / "env.yaml").write_text(
        yaml.safe_dump({"name": "math", "dataset": {"path": "x.jsonl"}, "runtime": {"command": ["x"]}})
    )
    result = await regrade_job(
        RegradeOptions(
            job_id="js",
            db_path=f"sqlite://{db}",
            agent_root=tmp_path / "none",
            agent_configs=[root / "math" / "env.yaml"],
            out=tmp_path / "r.jsonl",
        )
    )
    assert [(r.session_id, r.after_score) for r in result.regraded] == [("s1", 4.0)]


async def test_setup_errors(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    store = Store(f"sqlite://{db}")
    try:
        await stored_job(
            store, tmp_path, [session("s1", "math", "1", finished=True, status="succeeded")], archive=set()
        )
    finally:
        await store.close()
    with pytest.raises(SetupError, match="no job 'nosuch'"):
        await regrade_job(RegradeOptions(job_id="nosuch", db_path=f"sqlite://{db}"))
    with pytest.raises(SetupError, match=r"job js has no sessions of env \['other'\] \(has \['math'\]\)"):
        await regrade_job(RegradeOptions(job_id="js", db_path=f"sqlite://{db}", env_names=["other"]))
    with pytest.raises(
        SetupError, match=r"agent root .*nope is not a directory: run from the project folder"
    ):
        await regrade_job(RegradeOptions(job_id="js", db_path=f"sqlite://{db}", agent_root=tmp_path / "nope"))


def test_blocker_rules() -> None:
    def row(**kw: Any) -> JobEnvironment:
        return session("s", "e", "c", **kw)

    assert regrade_blocker(row(finished=True, status="succeeded", reward=0.0, eval_status="error")) is None
    assert regrade_blocker(row(finished=True, status="error", reward=0.0, eval_status="scored")) is None
    assert regrade_blocker(row(finished=True, status="succeeded", eval_status="skipped")) is None
    assert regrade_blocker(row(finished=True, status="timeout")) is None  # the agent's own outcome
    for status in ("error", "infra_error"):  # rows written before outcomes were recorded
        kind, _ = regrade_blocker(row(finished=True, status=status)) or ("", "")
        assert kind == "infrastructure_failure"
    # the recorded outcome decides: an infrastructure failure is never graded, a runtime error (a
    # task outcome) is; so is a row an older launcher recorded as runtime_crashed (no valid result
    # before any answered call), which is the agent's outcome under the current rules
    kind, _ = regrade_blocker(row(finished=True, status="error", outcome="upstream_unavailable")) or ("", "")
    assert kind == "infrastructure_failure"
    assert regrade_blocker(row(finished=True, status="error", outcome="runtime_error")) is None
    assert regrade_blocker(row(finished=True, status="error", outcome="runtime_crashed")) is None
    kind, _ = regrade_blocker(row(finished=False, status="running")) or ("", "")
    assert kind == "not_finished"


def test_a_harbor_tasks_env_is_not_regraded_and_says_its_verifiers_are_not_run_again() -> None:
    from rollout.core.envs import task_folder_env
    from rollout.jobs.regrade import _evaluators

    tasks = Path(__file__).resolve().parents[2] / "env" / "harbor_tasks" / "tasks"
    name = task_folder_env(tasks).name
    found, verified = _evaluators(RegradeOptions(job_id="j", tasks=[tasks]), {name})
    assert (found, verified) == ({name: None}, {name})
