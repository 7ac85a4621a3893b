"""Runner output in the forms Safactory accepts, and hostile output: the result is the runner's
words, read no more generously than that (NaN and Infinity are never a result)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from rollout.contract.protocol import SimulationStartRequest
from rollout.sandbox.runner import safactory_env
from rollout.sandbox.runtime_local import parse_result, run_local

RESULT = {
    "session_id": "s-1",
    "status": "succeeded",
    "total_reward": 0.0,
    "step_count": 8,
    "terminated": True,
    "truncated": False,
    "error_text": None,
    "metrics": {
        "bench_case_id": "case-001",
        "bench_score": 0.73,
        "bench_passed": True,
        "bench_reason": "all required checks passed",
    },
}


@pytest.mark.parametrize(
    "stdout",
    [
        json.dumps(RESULT) + "\n",
        json.dumps(RESULT, indent=2) + "\n",  # pretty-printed, as the docs show it
        "starting\n" + json.dumps(RESULT, indent=2) + "\nrunner: done\n",  # a log line after it
        "SAFACTORY_RESULT_JSON " + json.dumps(RESULT) + "\nrunner: done\n",
        "SAFACTORY_RESULT_JSON "
        + json.dumps(RESULT)
        + "\n"
        + json.dumps({"level": "info", "msg": "bye"})
        + "\n",
        json.dumps({"level": "info"})
        + "\n"
        + json.dumps(RESULT)
        + "\n"
        + json.dumps({"level": "info"})
        + "\n",
        json.dumps({**RESULT, "total_reward": None}) + "\n",
        json.dumps({**RESULT, "metrics": {"items": [{"status": "failed"}], **RESULT["metrics"]}}, indent=2)
        + "\n",
    ],
    ids=[
        "one line",
        "pretty",
        "log after",
        "prefix",
        "prefix then json log",
        "json logs around",
        "null reward",
        "nested objects with status",
    ],
)
def test_the_forms_safactory_accepts(stdout: str) -> None:
    result = parse_result(stdout)
    assert (result.session_id, result.status, result.total_reward, result.step_count) == (
        "s-1",
        "succeeded",
        0.0,
        8,
    )
    assert result.metrics["bench_score"] == 0.73


@pytest.mark.parametrize(
    "stdout, message",
    [
        (json.dumps(RESULT).replace("0.73", "NaN") + "\n", "not JSON"),
        (json.dumps({**RESULT, "total_reward": 1}).replace("1,", "Infinity,", 1) + "\n", "not JSON"),
        ("SAFACTORY_RESULT_JSON " + json.dumps(RESULT).replace("0.0", "-Infinity", 1) + "\n", "not JSON"),
        (
            "SAFACTORY_RESULT_JSON {not json\n" + json.dumps(RESULT) + "\n",
            "SAFACTORY_RESULT_JSON line is not JSON",
        ),
        (json.dumps(RESULT).replace("0.73", "1e999") + "\n", "not a finite number"),
        (
            json.dumps(RESULT, indent=2).replace("0.73", "-1e999") + "\nlog\n",
            "last stdout line is not JSON: 'log'",
        ),
        ("SAFACTORY_RESULT_JSON " + "[" * 100_000 + "\n", "not JSON"),
        ("SAFACTORY_RESULT_JSON [1]\n", "not a JSON object"),
        ('{"session_id": "s-1", "status": "great"}\n', "status"),
        ("\x00\xff garbage \udcff\n", "not JSON"),
        ("", "printed nothing"),
        ('{"session_id": "s-1",\n "status": "succeeded"\n', "not JSON"),  # cut off mid-object
    ],
)
def test_output_that_is_not_a_result_is_refused(stdout: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_result(stdout)


def test_huge_and_deep_output_is_read_in_bounded_time() -> None:
    deep = "[" * 100_000 + "\n"
    lines = '{"a": [\n' * 200_000  # every line opens an object that never closes
    for stdout in (
        lines + json.dumps(RESULT) + "\n",
        deep + json.dumps(RESULT) + "\n",
        "x" * 8_000_000 + "\n",
    ):
        t0 = time.process_time()
        try:
            parse_result(stdout)
        except ValueError:
            pass
        assert time.process_time() - t0 < 30  # CPU time, not wall clock: bounded by the scan's caps
    assert parse_result(lines + json.dumps(RESULT) + "\n").status == "succeeded"


def test_the_safactory_variables_come_from_the_sessions_own_request() -> None:
    request = SimulationStartRequest(
        job_id="j",
        session_id="s-1",
        agent_name="mybench",
        agent_id="row-7",
        group_id="g",
        gateway_base_url="http://127.0.0.1:9/v1/sessions/s-1",
        model="route-a",
        env_params={"dataset": {"task_id": "case-001", "category": 3, "task_path": "bad\x00path"}},
    )
    env = safactory_env(request, "/workspace")
    assert {k: v for k, v in env.items() if k != "SAFACTORY_START_REQUEST_JSON"} == {
        "SAFACTORY_JOB_ID": "j",
        "SAFACTORY_SESSION_ID": "s-1",
        "SAFACTORY_AGENT_NAME": "mybench",
        "SAFACTORY_AGENT_ID": "row-7",
        "SAFACTORY_GATEWAY_BASE_URL": "http://127.0.0.1:9/v1/sessions",
        "SAFACTORY_GATEWAY_SESSION_URL": "http://127.0.0.1:9/v1/sessions/s-1",
        "SAFACTORY_GATEWAY_SESSION_URL_CONTAINER": "http://127.0.0.1:9/v1/sessions/s-1",
        "OPENROUTER_BASE_URL": "http://127.0.0.1:9/v1/sessions/s-1",
        "SAFACTORY_ROUTE_MODEL": "route-a",
        "SAFACTORY_MODEL_REF": "safactory/route-a",
        "SAFACTORY_RESULT_PATH": "/workspace/safactory_result.json",
        "SAFACTORY_TASK_ID": "case-001",
        "SAFACTORY_CATEGORY": "3",
    }
    assert json.loads(env["SAFACTORY_START_REQUEST_JSON"])["session_id"] == "s-1"
    big = request.model_copy(update={"env_params": {"dataset": {"blob": "x" * 200_000}}})
    assert "SAFACTORY_START_REQUEST_JSON" not in safactory_env(big, "/workspace")  # over one variable's limit


RESULT_FILE_RUNNER = """
import json, os, sys
mode = sys.argv[1]
path = "safactory_result.json"
result = {"session_id": "s-1", "status": "succeeded", "metrics": {"from": "file"}}
if mode == "link":
    os.symlink("/etc/hostname", path)
elif mode == "fifo":
    os.mkfifo(path)
else:
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
if mode == "both":
    print(json.dumps({**result, "metrics": {"from": "stdout"}}))
else:
    print("no result on stdout")
sys.exit(3 if mode == "crash" else 0)
"""


@pytest.mark.parametrize(
    "mode, status, source",
    [
        ("file", "succeeded", "file"),  # stdout holds none: the file is read, as Safactory does
        ("both", "succeeded", "stdout"),  # stdout first
        ("crash", "error", None),  # a runtime that exits otherwise printed no result, whatever its file says
        ("link", "error", None),  # a link is never followed
        ("fifo", "error", None),
    ],
)
async def test_the_result_file_when_stdout_holds_none(
    tmp_path: Path, mode: str, status: str, source: str | None
) -> None:
    script = tmp_path / "runner.py"
    script.write_text(RESULT_FILE_RUNNER)
    ws = tmp_path / "ws"
    ws.mkdir()
    request = SimulationStartRequest(
        job_id="j",
        session_id="s-1",
        agent_name="a",
        agent_id="a-0",
        group_id="g",
        gateway_base_url="http://127.0.0.1:9/v1/sessions/s-1",
        model="m",
    )
    out = await run_local(
        [sys.executable, str(script), mode], request, ws, timeout_s=60, result_file="safactory_result.json"
    )
    assert out.status == status, out.error_text
    assert (out.result.metrics["from"] if out.result is not None else None) == source
    (tmp_path / "ws2").mkdir()
    plain = await run_local([sys.executable, str(script), "file"], request, tmp_path / "ws2", timeout_s=60)
    assert plain.status == "error"  # without result_file (a native env): stdout only
