"""The local runtime backend: result parsing, the session timeout killing the whole process group."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from rollout.contract.protocol import SimulationStartRequest, SimulationStartResult
from rollout.sandbox.runtime_local import parse_result, run_local


def _request(sid: str = "s1") -> SimulationStartRequest:
    return SimulationStartRequest(
        job_id="j",
        session_id=sid,
        agent_name="toy",
        agent_id="toy-0",
        group_id="g",
        gateway_base_url="http://127.0.0.1:9/v1/sessions/s1",
        model="m",
    )


def _script(tmp_path: Path, body: str) -> list[str]:
    p = tmp_path / "rt.py"
    p.write_text(body)
    return [sys.executable, str(p)]


def test_parse_result_takes_the_last_json_line() -> None:
    out = 'log line\n{"not": "it"}\n{"session_id": "s1", "status": "succeeded", "metrics": {"x": 1}}\n\n'
    r = parse_result(out)
    assert (r.session_id, r.status, r.metrics) == ("s1", "succeeded", {"x": 1})
    # a model's text with U+2028, U+2029 or U+0085 in it, as pydantic writes it (unescaped), is one line
    text = "a\u2028b\u2029c\x85d"
    emitted = SimulationStartResult(session_id="s2", status="succeeded", metrics={"completion_text": text})
    assert "\u2028" in emitted.model_dump_json()
    r = parse_result("log\r\n" + emitted.model_dump_json() + "\r\n")
    assert (r.session_id, r.metrics) == ("s2", {"completion_text": text})


@pytest.mark.parametrize(
    ("stdout", "message"),
    [
        ("", "printed nothing"),
        ("hello\n", "not JSON"),
        ("[1, 2]\n", "not a JSON object"),
        ('{"session_id": "s1"}\n', "status"),
        ('{"session_id": "s1", "status": "great"}\n', "status"),
    ],
)
def test_output_without_a_valid_result_is_rejected(stdout: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_result(stdout)


async def test_runtime_reads_the_request_and_runs_in_its_workspace(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    cmd = _script(
        tmp_path,
        (
            "import json, os, sys\n"
            "req = json.load(sys.stdin)\n"
            "print('noise on stdout')\n"
            "print(json.dumps({'session_id': req['session_id'], 'status': 'succeeded',"
            " 'metrics': {'cwd': os.getcwd(), 'model': req['model']}}))\n"
        ),
    )
    out = await run_local(cmd, _request(), ws, timeout_s=30)
    assert out.status == "succeeded" and out.result is not None
    assert out.result.metrics == {"cwd": str(ws), "model": "m"}
    assert out.returncode == 0


async def test_the_gateway_admin_key_is_not_inherited(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unsandboxed runtime inherits the launcher's environment, but never its admin key."""
    monkeypatch.setenv("GATEWAY_ADMIN_KEY", "sk-admin-SECRET")
    monkeypatch.setenv("GATEWAY_API_KEY", "sk-client")
    cmd = _script(
        tmp_path,
        (
            "import json, os, sys\n"
            "req = json.load(sys.stdin)\n"
            "print(json.dumps({'session_id': req['session_id'], 'status': 'succeeded', 'metrics': {"
            "'admin': os.environ.get('GATEWAY_ADMIN_KEY'), 'client': os.environ.get('GATEWAY_API_KEY')}}))\n"
        ),
    )
    out = await run_local(cmd, _request(), tmp_path, timeout_s=30)
    assert out.result is not None and out.result.metrics == {"admin": None, "client": "sk-client"}


async def test_crash_without_result_is_an_error_with_stderr(tmp_path: Path) -> None:
    cmd = _script(tmp_path, "import sys\nsys.stderr.write('boom: bad config\\n')\nsys.exit(3)\n")
    out = await run_local(cmd, _request(), tmp_path, timeout_s=30)
    assert out.status == "error" and out.result is None
    assert out.error_text is not None and "boom" in out.error_text
    assert out.error_text.startswith("the runtime exited with code 3: its output is not a result")


@pytest.mark.parametrize(
    ("ending", "said"),
    [
        ("sys.exit(1)", "the runtime exited with code 1"),
        ("os.kill(os.getpid(), signal.SIGKILL)", "the runtime was killed by signal 9 (not by the launcher)"),
        ("os._exit(137)", "the runtime exited with code 137 (killed by signal 9, not by the launcher)"),
    ],
)
async def test_a_result_line_counts_only_when_the_runtime_exits_0(
    tmp_path: Path, ending: str, said: str
) -> None:
    """A valid last line followed by a crash, a kill or an exit code is no result: a model's tool
    call can write a forged line to its runtime's stdout and kill it."""
    line = json.dumps({"session_id": "s1", "status": "failed", "error_class": "upstream_unavailable"})
    cmd = _script(tmp_path, f"import os, signal, sys\nprint({line!r}, flush=True)\n{ending}\n")
    out = await run_local(cmd, _request(), tmp_path, timeout_s=30)
    assert (out.status, out.result) == ("error", None)
    assert out.error_text == f"{said}: its output is not a result"
    assert line in out.stdout_tail  # kept to read, not to trust


async def test_result_for_another_session_is_an_error(tmp_path: Path) -> None:
    cmd = _script(tmp_path, 'print(\'{"session_id": "other", "status": "succeeded"}\')\n')
    out = await run_local(cmd, _request("s1"), tmp_path, timeout_s=30)
    assert out.status == "error" and "not s1" in out.error_text


async def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    cmd = _script(
        tmp_path,
        (
            "import subprocess, sys, time\n"
            f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
            f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
            "time.sleep(120)\n"
        ),
    )
    t0 = time.monotonic()
    out = await run_local(cmd, _request(), tmp_path, timeout_s=1.5)
    assert out.status == "timeout" and "timed out after 1.5 s" in out.error_text
    assert time.monotonic() - t0 < 10
    child = int(pid_file.read_text())
    for _ in range(50):  # the grandchild got SIGKILL with its group
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"grandchild {child} survived the session timeout")


async def test_truncated_result_keeps_its_status(tmp_path: Path) -> None:
    res = {"session_id": "s1", "status": "truncated", "truncated": True, "error_text": "budget used"}
    cmd = _script(tmp_path, f"print({json.dumps(json.dumps(res))})\n")
    out = await run_local(cmd, _request(), tmp_path, timeout_s=30)
    assert (out.status, out.error_text, out.result.truncated) == ("truncated", "budget used", True)


async def test_background_child_holding_stdout_does_not_hold_the_session(tmp_path: Path) -> None:
    """A runtime that exits with a valid result but leaves `sleep 30 &` behind (holding the
    stdout pipe) ends when it exits: its result counts, the child is killed."""
    cmd = _script(
        tmp_path,
        (
            "import json, subprocess, sys\n"
            "req = json.load(sys.stdin)\n"
            "subprocess.Popen(['sleep', '30'])\n"
            "print(json.dumps({'session_id': req['session_id'], 'status': 'succeeded'}))\n"
        ),
    )
    t0 = time.monotonic()
    out = await run_local(cmd, _request(), tmp_path, timeout_s=20)
    assert (out.status, out.error_text) == ("succeeded", None)
    assert time.monotonic() - t0 < 10


async def test_huge_output_keeps_only_the_tail(tmp_path: Path) -> None:
    cmd = _script(
        tmp_path,
        (
            "import json, sys\n"
            "req = json.load(sys.stdin)\n"
            "sys.stdout.write('x' * 30_000_000 + '\\n')\n"
            "print(json.dumps({'session_id': req['session_id'], 'status': 'failed', 'error_text': 'no answer'}))\n"
        ),
    )
    out = await run_local(cmd, _request(), tmp_path, timeout_s=60)
    assert (out.status, out.error_text) == ("failed", "no answer")
    assert len(out.stdout_tail) == 4000


async def test_runtime_that_ignores_its_request_still_ends(tmp_path: Path) -> None:
    cmd = _script(tmp_path, 'print(\'{"session_id": "s1", "status": "failed"}\')\n')
    big = _request().model_copy(update={"env_params": {"dataset": {"blob": "y" * 1_000_000}}})
    out = await run_local(cmd, big, tmp_path, timeout_s=20)
    assert out.status == "failed"


async def test_stderr_log_keeps_all_of_stderr_and_appends(tmp_path: Path) -> None:
    body = (
        "import sys\nsys.stdin.read()\nsys.stderr.write('x' * 100_000 + 'END\\n')\n"
        'print(\'{"session_id": "s1", "status": "succeeded"}\')\n'
    )
    log = tmp_path / "logs" / "harness" / "s1-a1.log"
    for _ in range(2):
        out = await run_local(_script(tmp_path, body), _request(), tmp_path, 60, stderr_log=log)
        assert out.status == "succeeded" and len(out.stderr_tail) == 4000
    assert log.read_text() == ("x" * 100_000 + "END\n") * 2  # beyond the kept tail; a second attempt appends


async def test_a_slow_limit_check_is_made_less_often() -> None:
    """A check that takes 0.2 s (a workspace of many files to add up) is made again no sooner
    than 1.8 s later, not every 0.25 s: at most a tenth of the time goes to it."""
    import asyncio
    from types import SimpleNamespace

    from rollout.sandbox.runtime_local import _exited

    proc = SimpleNamespace(returncode=None)
    wake = asyncio.Event()
    checks: list[float] = []

    async def slow_check() -> None:
        checks.append(time.monotonic())
        await asyncio.sleep(0.2)

    async def end_later() -> None:
        await asyncio.sleep(2.5)
        proc.returncode = 0
        wake.set()

    ender = asyncio.create_task(end_later())
    assert await _exited(proc, wake, [0], None, slow_check) is None  # type: ignore[arg-type]
    await ender
    # the first check at 0.25 s, the next at >= 0.25 + 0.2 + 1.8 (a slower check: later still):
    # at most two in 2.5 s (every 0.25 s: five)
    assert 1 <= len(checks) <= 2, checks
    assert all(b - a >= 1.9 for a, b in zip(checks, checks[1:], strict=False)), checks
