"""Failure attribution: a grading failure the agent caused is its 0, counted everywhere; one the
grader shows without the agent (the case's control fails too) is ``grader_broken``, excluded and
named. Unit tests of ``rollout.grading.attribution`` and the counts, then real jobs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import yaml

from rollout.cli.run import job_exit_code
from rollout.core.envs import Case
from rollout.grading.attribution import REFERENCE, Control, Controls, attribute, needs_control
from rollout.grading.evaluation import Evaluation
from rollout.jobs.options import JobOptions
from rollout.jobs.run import run_job
from rollout.results.groups import invalid_reason
from rollout.results.report import SessionRecord, render_table, summarize
from rollout.train.trl_rollout import read_job_samples
from tests.fake_upstream import FakeUpstream

# --- unit -------------------------------------------------------------------------------------


def test_a_failure_whose_control_grades_is_the_agents_zero() -> None:
    failed = Evaluation(
        status="error",
        score=0.0,
        reason="RecursionError: maximum recursion depth exceeded",
        isolation="bwrap",
    )
    control = Evaluation(status="scored", score=0.0, reason="no answer")
    out = attribute(failed, Control(control))
    assert (out.status, out.score, out.isolation) == ("error", 0.0, "bwrap")
    assert out.reason == (
        "error: RecursionError: maximum recursion depth exceeded; counted as the agent's 0: the "
        "same grader scored the control (the untouched starting workspace) 0"
    )
    assert out.detail()["control"] == {
        "on": "the untouched starting workspace",
        "status": "scored",
        "score": 0.0,
        "reason": "no answer",
    }


@pytest.mark.parametrize("control_status", ["error", "timeout", "invalid_reward"])
def test_a_failure_whose_control_fails_too_is_a_broken_grader(control_status: str) -> None:
    failed = Evaluation(status="timeout", score=0.0, reason="evaluator timed out after 60.0 s")
    control = Evaluation(status=control_status, score=0.0, reason="KeyError: 'x'")  # type: ignore[arg-type]
    out = attribute(failed, Control(control))
    assert (out.status, out.score) == ("grader_broken", None)
    assert out.reason == (
        "grader broken: it failed on this session (timeout: evaluator timed out after 60.0 s) and "
        f"on the control, the untouched starting workspace ({control_status}: KeyError: 'x'); "
        "not counted"
    )


def test_only_grading_failures_need_a_control() -> None:
    assert [
        needs_control(Evaluation(status=s, score=0.0))
        for s in ("scored", "error", "timeout", "invalid_reward", "skipped", "grader_broken")  # type: ignore[arg-type]
    ] == [False, True, True, True, False, False]
    assert needs_control(None) is False


async def test_a_control_is_graded_once_per_case_on_its_untouched_files(tmp_path: Path) -> None:
    files = tmp_path / "files"
    (files / "sub").mkdir(parents=True)
    (files / "sub" / "start.txt").write_text("start")
    seen: list[dict[str, str]] = []
    gate = asyncio.Event()

    async def grade(ws: Path) -> Evaluation:
        seen.append({str(p.relative_to(ws)): p.read_text() for p in ws.rglob("*") if p.is_file()})
        for p in ws.rglob("*.txt"):
            p.write_text("changed by the grader")
        await gate.wait()
        return Evaluation(status="scored", score=3.0)

    controls = Controls(tmp_path)
    case = Case(env_name="e", case_id="c1", row={}, files_dir=str(files))
    waiting = [asyncio.ensure_future(controls.control(case, grade)) for _ in range(3)]
    await asyncio.sleep(0.05)
    gate.set()
    assert [c.evaluation.score for c in await asyncio.gather(*waiting)] == [3.0, 3.0, 3.0]
    assert seen == [{"sub/start.txt": "start"}] and controls.graded == 1
    assert (files / "sub" / "start.txt").read_text() == "start"  # a copy was graded
    empty = await controls.control(Case(env_name="e", case_id="c2", row={}), grade)
    assert empty.evaluation.score == 3.0 and seen[1] == {} and controls.graded == 2
    assert list(tmp_path.glob("rollout-control-*")) == []  # removed after grading


async def test_a_grader_that_fails_without_an_answer_is_shown_working_by_the_reference_answer(
    tmp_path: Path,
) -> None:
    """A grader that raises on a missing answer file fails on the untouched workspace; the case's
    reference answer (an expected.json task's) shows it works, so the agent's failure is its 0."""
    graded: list[str | None] = []

    async def grade(ws: Path) -> Evaluation:
        answer = ws / "outputs" / "answer.json"
        graded.append(answer.read_text() if answer.is_file() else None)
        if not answer.is_file():
            return Evaluation(status="error", score=0.0, reason="FileNotFoundError: outputs/answer.json")
        return Evaluation(status="scored", score=10.0)

    case = Case(env_name="e", case_id="t1", row={"expected": {"total": 7}})
    control = await Controls(tmp_path).control(case, grade)
    assert (control.on, control.evaluation.score, graded) == (REFERENCE, 10.0, [None, '{"total": 7}'])
    out = attribute(Evaluation(status="error", score=0.0, reason="FileNotFoundError"), control)
    assert (out.status, out.score) == ("error", 0.0)
    assert out.reason == (
        "error: FileNotFoundError; counted as the agent's 0: the same grader scored the control "
        "(the starting workspace with the reference answer in outputs/answer.json) 10"
    )
    # without a reference answer the same grader is broken
    bare = await Controls(tmp_path).control(Case(env_name="e", case_id="t2", row={"expected": 7}), grade)
    assert (bare.on, bare.evaluation.status) == ("the untouched starting workspace", "error")
    assert attribute(Evaluation(status="error", score=0.0), bare).status == "grader_broken"


def record(case: str, status: str, score: float | None, outcome: str = "succeeded") -> SessionRecord:
    return SessionRecord(
        session_id=f"s-{case}-{status}",
        job_id="j",
        env_name="e",
        case_id=case,
        group_id=case,
        sample_index=0,
        model="m",
        status="succeeded",
        outcome=outcome,
        score=score,
        eval_status=status,
    )


def test_grading_failures_count_as_zero_and_broken_graders_are_left_out() -> None:
    records = [
        record("a", "scored", 10.0),
        record("b", "scored", 10.0),
        record("c", "error", 0.0),
        record("d", "timeout", 0.0),
        record("e", "invalid_reward", 0.0),
        record("f", "grader_broken", None),
        record("g", "infra_error", None, outcome="setup_failed"),
    ]
    (row,) = summarize(records)
    assert row.mean_score == pytest.approx(4.0)  # 2 of 5 counted sessions, not 10.0 over the 2 scored
    assert (row.scored, row.eval_error, row.eval_timeout, row.invalid, row.grader_broken, row.infra) == (
        2,
        1,
        1,
        1,
        1,
        1,
    )
    assert row.pass_at_1 == pytest.approx(2 / 5)  # the broken and the infra case are not cases of pass@k
    assert "broken 1" in render_table([row])


def test_the_feed_trains_on_a_grading_failures_zero_but_not_on_a_broken_grader() -> None:
    base = {"finished": True, "outcome": "succeeded"}
    assert invalid_reason({**base, "eval_status": "error", "reward": 0.0}) is None
    assert invalid_reason({**base, "eval_status": "timeout", "reward": 0.0}) is None
    assert (
        invalid_reason(
            {**base, "eval_status": "grader_broken", "reward": None, "eval_reason": "grader broken: ..."}
        )
        == "evaluation grader_broken: grader broken: ..."
    )


# --- real jobs --------------------------------------------------------------------------------

RUNTIME = """
import json
from pathlib import Path
from env.runtime_kit import run_runtime
from rollout.contract.protocol import SimulationStartResult

def main(req):
    kind = req.env_params["dataset"]["kind"]
    out = Path("outputs")
    out.mkdir(exist_ok=True)
    if kind == "right":
        (out / "answer.json").write_text(json.dumps({"answer": 42}))
    elif kind == "deep":  # valid JSON that a plain json.loads cannot parse: one bash command writes it
        (out / "answer.json").write_text("[" * 200000 + "]" * 200000)
    return SimulationStartResult(session_id=req.session_id, status="succeeded")

run_runtime(main)
"""

# a grader that scores a missing answer 0 but, like many, parses the answer without a depth guard
EVALUATOR = """
import json
from pathlib import Path

def evaluate(request, spec, trajectory):
    answer = Path(request.workspace or "/nonexistent") / "outputs" / "answer.json"
    if not answer.is_file():
        return {"score": 0, "reason": "no answer"}
    return 10 if json.loads(answer.read_text()) == {"answer": 42} else 0
"""

BROKEN_EVALUATOR = """
def evaluate(request, spec, trajectory):
    raise KeyError("expected")
"""


def make_env(root: Path, name: str, kinds: list[str], evaluator: str) -> None:
    env_dir = root / name
    (env_dir / "data").mkdir(parents=True)
    (env_dir / "runtime.py").write_text(RUNTIME)
    (env_dir / "rule_evaluator.py").write_text(evaluator)
    (env_dir / "data" / "cases.jsonl").write_text(
        "".join(json.dumps({"id": f"{k}{i}", "kind": k}) + "\n" for i, k in enumerate(kinds))
    )
    (env_dir / "env.yaml").write_text(
        yaml.safe_dump(
            {
                "name": name,
                "dataset": {"format": "jsonl", "path": "data/cases.jsonl", "id_field": "id"},
                "runtime": {"command": ["{python}", "{env_dir}/runtime.py"], "timeout_s": 60},
            }
        )
    )


def options(tmp: Path, up: FakeUpstream, **kw: Any) -> JobOptions:
    db = tmp / "t.db"
    cfg = tmp / "gw.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "storage_config": {"db_url": f"sqlite://{db}"},
                "llm_routes": {"fake": {"base_url": up.base_url}},
            }
        )
    )
    return JobOptions.model_validate(
        {
            "agent_root": tmp / "envs",
            "gateway_config": cfg,
            "llm_model": "fake",
            "db_path": f"sqlite://{db}",
            "enable_evaluation": True,
            "out": tmp / "out.jsonl",
            "pool_size": 2,
            **kw,
        }
    )


async def test_a_wrong_answer_that_breaks_the_grader_counts_zero_in_the_mean_and_trains(
    tmp_path: Path,
) -> None:
    """2 of 5 right, 3 answers that crash the grader: mean 4.00 (not 10.00), 5 valid samples."""
    make_env(tmp_path / "envs", "answers", ["right", "right", "deep", "deep", "deep"], EVALUATOR)
    async with FakeUpstream() as up:
        result = await run_job(options(tmp_path, up, job_id="attr1"))
    by_case = {r.case_id: r for r in result.records}
    for cid in ("deep2", "deep3", "deep4"):
        r = by_case[cid]
        assert (r.eval_status, r.score) == ("error", 0.0), cid
        assert "counted as the agent's 0: the same grader scored the control" in (r.reason or ""), cid
    assert [by_case[c].score for c in ("right0", "right1")] == [10.0, 10.0]
    (row,) = result.totals.summary()
    assert (row.mean_score, row.pass_at_1, row.eval_error, row.grader_broken) == (4.0, 0.4, 3, 0)
    groups, _, _ = await read_job_samples(f"sqlite://{tmp_path / 't.db'}", "attr1")
    samples = [s for g in groups for s in g.samples]
    assert sorted((s.valid, s.score) for s in samples) == [(True, 0.0)] * 3 + [(True, 10.0)] * 2
    con = sqlite3.connect(tmp_path / "t.db")
    detail = con.execute("SELECT eval_detail FROM job_environments WHERE case_id = 'deep2'").fetchone()[0]
    con.close()
    assert json.loads(detail)["control"] == {
        "on": "the untouched starting workspace",
        "status": "scored",
        "score": 0.0,
        "reason": "no answer",
    }


async def test_a_grader_that_fails_on_its_control_is_broken_named_and_stops_the_job(tmp_path: Path) -> None:
    make_env(tmp_path / "envs", "answers", ["right", "deep"], EVALUATOR)
    make_env(tmp_path / "envs", "badgrader", ["right", "deep", "right", "deep"], BROKEN_EVALUATOR)
    async with FakeUpstream() as up:
        result = await run_job(options(tmp_path, up, job_id="attr2", max_broken_graders=0))
    rows = {r.env_name: r for r in result.totals.summary()}
    assert (rows["badgrader"].grader_broken, rows["badgrader"].mean_score, rows["badgrader"].pass_at_1) == (
        4,
        None,
        None,
    )
    assert (rows["answers"].grader_broken, rows["answers"].mean_score) == (0, 5.0)
    table = render_table(list(rows.values()))
    assert "broken 4" in table.split("badgrader", 1)[1].split("\n", 2)[1]  # the problems line of its row
    broken = [r for r in result.records if r.env_name == "badgrader"]
    assert {(r.eval_status, r.score) for r in broken} == {("grader_broken", None)}
    assert all(
        (r.reason or "").startswith(
            "grader broken: it failed on this session (error: KeyError: 'expected') and on the control"
        )
        for r in broken
    )
    groups, _, _ = await read_job_samples(f"sqlite://{tmp_path / 't.db'}", "attr2")
    assert {s.valid for g in groups if g.env == "badgrader" for s in g.samples} == {False}
    assert job_exit_code(result) == 5  # the job completed (--max-broken-graders 0), but a grader is broken
    # the default stops the job at the first finding, resumable; a limit of 3 at the third
    make_env(tmp_path / "envs2", "badgrader", ["right"] * 8, BROKEN_EVALUATOR)
    for limit, job in ((None, "attr3"), (3, "attr5")):
        more = {"max_broken_graders": limit} if limit else {}
        async with FakeUpstream() as up:
            stopped = await run_job(
                options(tmp_path, up, job_id=job, agent_root=tmp_path / "envs2", pool_size=1, **more)
            )
        n = limit or 1
        assert stopped.stopped is not None and stopped.stop_kind == "broken_graders"
        assert stopped.stopped == (
            f"{n} broken-grader finding(s) (badgrader: {n}): the grader fails without the agent "
            f"(--max-broken-graders {n}); the sessions not run are left for --resume"
        )
        assert len(stopped.records) == n and job_exit_code(stopped) == 5
    # the limit reached at the job's last session: nothing is left to --resume, the job is not stopped
    async with FakeUpstream() as up:
        ended = await run_job(
            options(
                tmp_path, up, job_id="attr8", agent_root=tmp_path / "envs2", pool_size=1, max_broken_graders=8
            )
        )
    assert (ended.stopped, len(ended.records), job_exit_code(ended)) == (None, 8, 5)


async def test_a_broken_grader_stop_never_cancels_the_finding_that_made_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The limit is reached when the finding is made, before its session's record is written; if
    another session ending meanwhile stopped the job, it cancelled the finding's own session: the
    stop named a finding no record, table or ``--regrade`` had. Forced here: the finding waits
    until another session has ended, while a third one is still running."""
    from rollout.jobs.attempt import Attempts

    make_env(tmp_path / "envs", "answers", ["right", "right"], EVALUATOR)
    make_env(tmp_path / "envs", "badgrader", ["right"], BROKEN_EVALUATOR)
    made, other_ended = asyncio.Event(), asyncio.Event()
    answers: list[int] = []
    evaluate = Attempts._evaluate

    async def ordered(self: Attempts, cfg: Any, *args: Any, **kw: Any) -> Any:
        if cfg.name == "badgrader":
            done = await evaluate(self, cfg, *args, **kw)
            made.set()
            await asyncio.wait_for(other_ended.wait(), 60)
            return done
        answers.append(len(answers))
        mine = answers[-1]
        await asyncio.wait_for(made.wait(), 60)
        if mine == 1:
            with contextlib.suppress(
                TimeoutError
            ):  # still running when the finding is written: the stop ends it
                await asyncio.wait_for(asyncio.Event().wait(), 30)
        return await evaluate(self, cfg, *args, **kw)

    monkeypatch.setattr(Attempts, "_evaluate", ordered)

    def ended(record: SessionRecord) -> None:
        if record.env_name == "answers":
            other_ended.set()

    async with FakeUpstream() as up:
        job = run_job(options(tmp_path, up, job_id="attr9", pool_size=3), on_done=ended)
        result = await asyncio.wait_for(job, 90)  # (before: a finding cancelled, the job never ended)
    broken = [r for r in result.records if r.env_name == "badgrader"]
    assert [(r.eval_status, r.score) for r in broken] == [("grader_broken", None)], result.records
    assert (result.stop_kind, job_exit_code(result)) == ("broken_graders", 5)
    assert result.totals.grader_broken == {"badgrader": 1}


async def test_two_findings_at_once_are_both_kept_when_the_first_stops_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two sessions graded broken together: the first one's record stops the job while the second
    is writing its end. That end (graded, its rollout paid for) is written whole and kept, never
    cancelled and run again by ``--resume``. Forced: the second waits in its write for the stop."""
    from rollout.jobs import attempt

    make_env(tmp_path / "envs", "badgrader", ["right", "right"], BROKEN_EVALUATOR)
    keep = attempt.keep_workspace
    first_out, both_graded, writing = asyncio.Event(), asyncio.Event(), []

    async def ordered(store: Any, row: Any, *args: Any, **kw: Any) -> Any:
        writing.append(row.session_id)
        if len(writing) == 1:  # both findings made before the first one's end is written
            await asyncio.wait_for(both_graded.wait(), 60)
        else:  # the second one's write: the first one's record stops the job meanwhile
            both_graded.set()
            await first_out.wait()  # (no wait_for: on 3.11 it may swallow the stop's cancellation)
            await asyncio.sleep(0.2)  # the stop (right after that record) reaches this session now
        return await keep(store, row, *args, **kw)

    monkeypatch.setattr(attempt, "keep_workspace", ordered)
    async with FakeUpstream() as up:
        job = run_job(options(tmp_path, up, job_id="attr10", pool_size=2), on_done=lambda r: first_out.set())
        result = await asyncio.wait_for(job, 90)
    assert len(writing) == 2
    assert result.stop_kind == "broken_graders"
    assert sorted((r.eval_status, r.score) for r in result.records) == [("grader_broken", None)] * 2
    assert result.totals.grader_broken == {"badgrader": 2}
    con = sqlite3.connect(tmp_path / "t.db")
    try:
        rows = con.execute("SELECT status, finished FROM job_environments WHERE job_id = 'attr10'").fetchall()
    finally:
        con.close()
    assert [finished for _, finished in rows] == [1, 1] and "cancelled" not in {st for st, _ in rows}, rows


async def test_a_stop_while_a_session_starts_leaves_it_cancelled_never_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job stops while another session's start is being written: that session ends
    ``cancelled`` with its attempt (resumable), never ``running`` with no attempt in the store.
    Forced: the finding is made once the second ``zz`` session's start is written, and that write
    is still awaited when the stop comes."""
    from rollout.jobs.attempt import Attempts
    from store import Store

    make_env(tmp_path / "envs", "badgrader", ["right"], BROKEN_EVALUATOR)
    make_env(tmp_path / "envs", "zz", ["right", "right"], EVALUATOR)
    env_of: dict[str, str] = {}
    zz_started: list[str] = []
    second_zz_written = asyncio.Event()
    run, update, evaluate = Attempts.run, Store.update_job_session, Attempts._evaluate

    async def named(self: Attempts, work: Any) -> Any:
        env_of[work.row.session_id] = work.row.env_name
        return await run(self, work)

    async def slow(self: Store, session_id: str, **values: Any) -> None:
        await update(self, session_id, **values)
        if values.get("status") == "running" and env_of.get(session_id) == "zz":
            zz_started.append(session_id)
            if len(zz_started) == 2:  # written; the stop reaches this session while it awaits
                second_zz_written.set()
                await asyncio.Event().wait()

    async def finding_then(self: Attempts, cfg: Any, *args: Any, **kw: Any) -> Any:
        if cfg.name == "badgrader":
            await asyncio.wait_for(second_zz_written.wait(), 60)
        return await evaluate(self, cfg, *args, **kw)

    monkeypatch.setattr(Attempts, "run", named)
    monkeypatch.setattr(Store, "update_job_session", slow)
    monkeypatch.setattr(Attempts, "_evaluate", finding_then)
    async with FakeUpstream() as up:
        result = await asyncio.wait_for(run_job(options(tmp_path, up, job_id="attr11", pool_size=2)), 90)
    assert result.stop_kind == "broken_graders"
    con = sqlite3.connect(tmp_path / "t.db")
    try:
        rows = dict(
            con.execute("SELECT env_id, status FROM job_environments WHERE job_id = 'attr11'").fetchall()
        )
        tried = dict(
            con.execute("SELECT env_id, outcome FROM session_attempts WHERE job_id = 'attr11'").fetchall()
        )
    finally:
        con.close()
    last = zz_started[1]
    assert (rows[last], tried.get(last)) == ("cancelled", "cancelled"), (rows, tried)
    assert "running" not in rows.values(), rows


STALL_RUNTIME = """
from pathlib import Path
from env.runtime_kit import run_runtime
from rollout.contract.protocol import SimulationStartResult

def main(req):
    if req.env_params["dataset"]["id"] == "stall":  # code under test that never returns: the checker stalls
        Path("prog.sh").write_text("sleep 3600\\n")
    return SimulationStartResult(session_id=req.session_id, status="succeeded")

run_runtime(main)
"""

CHECK = """#!/bin/bash
out=$(cd /workspace && bash prog.sh)
if [ "$out" = 42 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""


def make_harbor_env(tmp: Path, name: str, tasks: list[str], runtime: str, verifier_timeout_s: float) -> None:
    """A Harbor env ``name`` under ``tmp/envs`` run by ``runtime``: each task starts with a
    ``prog.sh`` that prints 0, and its tests (``CHECK``) reward a ``prog.sh`` that prints 42."""
    env_dir = tmp / "envs" / name
    for task in tasks:
        t = env_dir / "tasks" / task
        (t / "environment").mkdir(parents=True)
        (t / "tests").mkdir()
        (t / "instruction.md").write_text("print 42 from prog.sh\n")
        (t / "task.toml").write_text(f'version = "1.0"\n[verifier]\ntimeout_sec = {verifier_timeout_s}\n')
        (t / "environment" / "prog.sh").write_text("echo 0\n")
        (t / "tests" / "test.sh").write_text(CHECK)
    (env_dir / "runtime.py").write_text(runtime)
    (env_dir / "env.yaml").write_text(
        yaml.safe_dump(
            {
                "name": name,
                "dataset": {"format": "harbor", "path": "tasks"},
                "runtime": {"command": ["{python}", "{env_dir}/runtime.py"], "timeout_s": 60},
            }
        )
    )


async def test_code_under_test_that_stalls_the_verifier_is_the_agents_zero(tmp_path: Path) -> None:
    """A verifier timeout caused by the agent's code is its 0, counted: the same tests complete on
    the untouched starting workspace."""
    make_harbor_env(tmp_path, "stall", ["stall", "idle"], STALL_RUNTIME, verifier_timeout_s=3.0)
    async with FakeUpstream() as up:
        result = await run_job(options(tmp_path, up, job_id="attr4"))
    by_case = {r.case_id: r for r in result.records}
    stall, idle = by_case["stall"], by_case["idle"]
    assert (stall.eval_status, stall.score) == ("timeout", 0.0)
    assert (stall.reason or "").startswith(
        "timeout: verifier timed out after 3 s (killed); counted as the agent's 0"
    )
    assert (idle.eval_status, idle.score) == ("scored", 0.0)
    (row,) = result.totals.summary()
    assert (row.mean_score, row.eval_timeout, row.grader_broken) == (0.0, 1, 0)
    groups, _, _ = await read_job_samples(f"sqlite://{tmp_path / 't.db'}", "attr4")
    assert sorted((s.valid, s.score) for g in groups for s in g.samples) == [(True, 0.0), (True, 0.0)]


async def test_closing_cancels_a_control_still_being_graded(tmp_path: Path) -> None:
    started = asyncio.Event()

    async def grade(ws: Path) -> Evaluation:
        started.set()
        await asyncio.sleep(3600)
        raise AssertionError("not reached")

    controls = Controls(tmp_path)
    asker = asyncio.ensure_future(controls.control(Case(env_name="e", case_id="c", row={}), grade))
    await started.wait()
    asker.cancel()
    await controls.aclose()
    with pytest.raises(asyncio.CancelledError):
        await asker
    assert list(tmp_path.glob("rollout-control-*")) == []  # its folder removed on the way out


DEEP_RUNTIME = """
import os
from pathlib import Path
from env.runtime_kit import run_runtime
from rollout.contract.protocol import SimulationStartResult

DEEP = "import os\\\\nfor _ in range(3000):\\\\n    os.mkdir('d')\\\\n    os.chdir('d')\\\\n"

def main(req):
    # past Python's recursion limit: in its own workspace, and (prog.sh) in the verifier's copy
    Path("prog.sh").write_text(f'python3 -c "{DEEP}"\\\\necho 0\\\\n')
    here = os.getcwd()
    for _ in range(3000):
        os.mkdir("d")
        os.chdir("d")
    os.chdir(here)
    return SimulationStartResult(session_id=req.session_id, status="succeeded")

run_runtime(main)
"""


async def test_a_tree_too_deep_for_rmtree_is_the_agents_zero_not_a_launcher_error(tmp_path: Path) -> None:
    """Nested folders past Python's recursion limit, left in the workspace and by the code under
    test in the verifier's copy: the session is graded (the agent's 0, valid) and the job ends;
    ``shutil.rmtree`` raised RecursionError (a launcher error, excluded; then the job crashed)."""
    make_harbor_env(tmp_path, "deep", ["deep"], DEEP_RUNTIME, verifier_timeout_s=60.0)
    async with FakeUpstream() as up:
        result = await run_job(options(tmp_path, up, job_id="attr5"))
    (r,) = result.records
    assert (r.outcome, r.eval_status, r.score) == ("succeeded", "scored", 0.0), r.reason
    groups, _, _ = await read_job_samples(f"sqlite://{tmp_path / 't.db'}", "attr5")
    assert [(s.valid, s.score) for g in groups for s in g.samples] == [(True, 0.0)]


async def test_judge_leaves_a_grading_alone_and_attributes_a_failure(tmp_path: Path) -> None:
    calls: list[Path] = []

    async def grade(ws: Path) -> Evaluation:
        calls.append(ws)
        return Evaluation(status="scored", score=0.0)

    controls, case = Controls(tmp_path), Case(env_name="e", case_id="c", row={})
    scored = Evaluation(status="scored", score=7.0)
    assert await controls.judge(scored, case, grade) is scored and calls == []  # no control needed
    judged = await controls.judge(Evaluation(status="timeout", score=0.0, reason="t"), case, grade)
    assert (judged.status, judged.score, len(calls)) == ("timeout", 0.0, 1)
    assert (judged.control or {}).get("status") == "scored"
