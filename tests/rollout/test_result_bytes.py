"""The runtime's bytes never fail the launcher: a result line that cannot be kept (nested too
deep, too large, an integer beyond 64 bits), printed by the runtime or by a
process it left behind, makes the attempt the agent's ``runtime_error``, graded on its workspace,
never a ``launcher_error`` (docs/outcomes.md). Real jobs: the launcher, its gateway and runtime
subprocesses."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import yaml

from rollout.jobs.options import JobOptions
from rollout.jobs.run import run_job
from rollout.sandbox.runtime_local import RESULT_MAX_BYTES, RESULT_MAX_DEPTH, check_storable, parse_result
from tests.fake_upstream import FakeUpstream

RUNTIME = r"""
import json, os, subprocess, sys, time
from pathlib import Path

req = json.loads(sys.stdin.readline())
row = req["env_params"]["dataset"]
metrics = {
    "deep_array": '{"x": ' + "[" * 300 + "]" * 300 + "}",
    "deep_object": '{"x": ' + '{"a": ' * 100_000 + "1" + "}" * 100_000 + "}",
    "just_deep_enough": '{"x": ' + "[" * 300 + "]" * 300 + "}",
    "huge_int": '{"answer": ' + "9" * 30 + "}",
    "huge": '{"answer": "' + "x" * (2 * 1024 * 1024) + '"}',
    "ok": '{"answer": "42"}',
}[row["metrics"]]
line = '{"session_id": "%s", "status": "succeeded", "metrics": %s}\n' % (req["session_id"], metrics)
Path("answer.txt").write_text("42")  # what the grader reads: the workspace
if row.get("background"):  # a process the runtime leaves behind prints the line; the runtime prints none
    Path("line.json").write_text(line)
    subprocess.Popen([sys.executable, "-c", "import sys; sys.stdout.write(open('line.json').read()); "
                      "sys.stdout.flush(); open('written', 'w').close()"],
                     start_new_session=True)
    while not Path("written").exists():
        time.sleep(0.01)
    os._exit(0)
sys.stdout.write(line)
sys.stdout.flush()
"""

DEEP_REQUEST = r"""
import json, sys, urllib.error, urllib.request
req = json.loads(sys.stdin.readline())
deep = json.loads("[" * 300 + "]" * 300)
body = {"model": req["model"], "messages": [{"role": "user", "content": "hi"}], "metadata": deep}
call = urllib.request.Request(req["gateway_base_url"] + "/chat/completions", data=json.dumps(body).encode(),
                              headers={"content-type": "application/json"})
try:
    urllib.request.urlopen(call)
    answer = "answered"
except urllib.error.HTTPError as e:
    answer = f"HTTP {e.code}"
print(json.dumps({"session_id": req["session_id"], "status": "succeeded", "metrics": {"answer": answer}}))
"""

EVALUATOR = """
def evaluate(request, spec, trajectory):
    return 7
"""


def make_env(root: Path, cases: list[dict[str, Any]], runtime: str = RUNTIME) -> None:
    env_dir = root / "bytes"
    (env_dir / "data").mkdir(parents=True)
    (env_dir / "runtime.py").write_text(runtime)
    (env_dir / "rule_evaluator.py").write_text(EVALUATOR)
    (env_dir / "data" / "cases.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cases))
    (env_dir / "env.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "bytes",
                "dataset": {"format": "jsonl", "path": "data/cases.jsonl", "id_field": "id"},
                "runtime": {"command": ["{python}", "{env_dir}/runtime.py"], "timeout_s": 60},
                "max_steps": 2,
            }
        )
    )


def job_options(tmp: Path, up: FakeUpstream, db: Path, **kw: Any) -> JobOptions:
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
            "sandbox": "none",
            "retry_backoff_s": 0.01,
            "job_id": "jb",
            **kw,
        }
    )


def q(db: Path, sql: str) -> list[tuple[Any, ...]]:
    con = sqlite3.connect(db)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


async def test_a_result_that_cannot_be_kept_is_the_agents_runtime_error(tmp_path: Path) -> None:
    cases = [
        {"id": "deep_array", "metrics": "deep_array"},
        {"id": "deep_object", "metrics": "deep_object"},
        {"id": "background", "metrics": "just_deep_enough", "background": True},
        {"id": "huge_int", "metrics": "huge_int"},
        {"id": "huge", "metrics": "huge"},
        {"id": "ok", "metrics": "ok"},
    ]
    make_env(tmp_path / "envs", cases)
    db = tmp_path / "t.db"
    async with FakeUpstream() as up:
        result = await run_job(job_options(tmp_path, up, db, pool_size=2))
    by_case = {r.case_id: r for r in result.records}
    assert result.stopped is None and len(by_case) == len(cases)
    ok = by_case.pop("ok")
    assert (ok.status, ok.outcome, ok.score, ok.answer) == ("succeeded", "succeeded", 7.0, None)
    why = {
        "deep_array": f"nested deeper than {RESULT_MAX_DEPTH} levels",
        "background": f"nested deeper than {RESULT_MAX_DEPTH} levels",
        "huge_int": "an integer beyond 64 bits",
        "huge": f"larger than {RESULT_MAX_BYTES} bytes as JSON",
    }
    for cid, r in by_case.items():
        # the agent's outcome: graded once on its workspace, never retried, never an outage
        assert (r.status, r.outcome, r.score, r.eval_status) == ("error", "runtime_error", 7.0, "scored"), cid
        assert [(a.outcome, a.infra) for a in r.attempts] == [("runtime_error", False)], cid
        if cid == "deep_object":  # too deep for the JSON reader itself
            assert (r.error or "").startswith("last stdout line is not JSON: "), r.error
        else:
            assert (r.error or "").startswith(
                f"the result object cannot be kept: {why[cid]} (exit code 0)"
            ), (cid, r.error)
    # nothing of it was stored as the result; every session has its reward
    assert (
        q(db, "SELECT case_id, result FROM job_environments WHERE case_id != 'ok' AND result != 'null'") == []
    )
    assert q(db, "SELECT count(*) FROM job_environments WHERE reward = 7.0") == [(len(cases),)]
    lines = [json.loads(x) for x in result.out.read_text().splitlines()]
    assert sorted((x["case_id"], x["outcome"]) for x in lines) == sorted(
        [("ok", "succeeded")] + [(c, "runtime_error") for c in by_case]
    )


async def test_a_request_nested_too_deep_for_the_launchers_readers_is_refused_by_the_gateway(
    tmp_path: Path,
) -> None:
    """The agent's request is its bytes too: one nested deeper than the store's readers take is
    refused (400) before it is recorded, so the job reads back every step it recorded."""
    make_env(tmp_path / "envs", [{"id": "deep_request"}], DEEP_REQUEST)
    db = tmp_path / "t.db"
    async with FakeUpstream() as up:
        result = await run_job(job_options(tmp_path, up, db))
        assert up.requests == []
    [r] = result.records
    assert (r.status, r.outcome, r.score, r.eval_status, r.step_count) == (
        "succeeded",
        "succeeded",
        7.0,
        "scored",
        0,
    )
    assert q(db, "SELECT result FROM job_environments") == [
        (
            json.dumps(
                {
                    "session_id": r.session_id,
                    "status": "succeeded",
                    "total_reward": 0.0,
                    "step_count": 0,
                    "terminated": True,
                    "truncated": False,
                    "error_text": None,
                    "error_class": None,
                    "metrics": {"answer": "HTTP 400"},
                }
            ),
        )
    ]


DEEP_ANSWER = r"""
import json, sys
from pathlib import Path
req = json.loads(sys.stdin.readline())
Path("answer.json").write_text("[" * 300 + "]" * 300)
print(json.dumps({"session_id": req["session_id"], "status": "succeeded"}))
"""

ECHOING_EVALUATOR = """
import json
from pathlib import Path

def evaluate(request, spec, trajectory):
    answer = json.loads(Path(request.workspace, "answer.json").read_text())
    return {"score": 7, "reason": "checked", "artifacts": {"answer": answer}}
"""


async def test_artifacts_an_evaluator_echoes_from_the_workspace_are_left_out_when_they_cannot_be_kept(
    tmp_path: Path,
) -> None:
    """An evaluator may hand back the agent's bytes (its answer file, parsed) as artifacts: what
    cannot be kept is left out, the score stands, the launcher does not fail."""
    make_env(tmp_path / "envs", [{"id": "deep_answer"}], DEEP_ANSWER)
    (tmp_path / "envs" / "bytes" / "rule_evaluator.py").write_text(ECHOING_EVALUATOR)
    db = tmp_path / "t.db"
    async with FakeUpstream() as up:
        result = await run_job(job_options(tmp_path, up, db))
    [r] = result.records
    assert (r.status, r.outcome, r.score, r.eval_status) == ("succeeded", "succeeded", 7.0, "scored")
    assert (
        r.reason
        == f"checked; artifacts left out: they cannot be kept (nested deeper than {RESULT_MAX_DEPTH} levels)"
    )
    [(detail,)] = q(db, "SELECT eval_detail FROM job_environments")
    assert json.loads(detail)["artifacts"] is None


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ({"a": [[[]]]}, None),
        ({"a": json.loads("[" * (RESULT_MAX_DEPTH - 1) + "]" * (RESULT_MAX_DEPTH - 1))}, None),
        (
            {"a": json.loads("[" * RESULT_MAX_DEPTH + "]" * RESULT_MAX_DEPTH)},
            f"nested deeper than {RESULT_MAX_DEPTH} levels",
        ),
        ({"a": 2**63 - 1, "b": -(2**63)}, None),
        ({"a": 2**63}, "an integer beyond 64 bits"),
        ({"a": float("nan")}, "a number that is not finite"),
        ({"\udc80": "\ud800\x00"}, None),  # kept as escapes (docs/storage.md)
        ({"a": "é" * (RESULT_MAX_BYTES // 2)}, f"larger than {RESULT_MAX_BYTES} bytes as JSON"),
    ],
)
def test_check_storable(value: dict[str, Any], why: str | None) -> None:
    if why is None:
        check_storable(value)
    else:
        with pytest.raises(ValueError) as e:
            check_storable(value)
        assert str(e.value) == why


def test_a_result_file_that_cannot_be_kept_is_no_result() -> None:
    line = '{"session_id": "s", "status": "succeeded", "metrics": {"x": ' + "[" * 200 + "]" * 200 + "}}"
    with pytest.raises(ValueError) as e:
        parse_result(f"SAFACTORY_RESULT_JSON {line}\n")
    assert (
        str(e.value)
        == f"the last SAFACTORY_RESULT_JSON line cannot be kept: nested deeper than {RESULT_MAX_DEPTH} levels"
    )
