"""Per-session limits in the real bubblewrap sandbox: a fork bomb, a 10 GB file, a memory hog and a
flood of output each end their session as ``error`` naming the limit (the launcher goes on), and a
sandbox that cannot be set up is ``setup_failed``."""

from __future__ import annotations

import dataclasses
import subprocess
import uuid
from pathlib import Path

import pytest

import rollout.sandbox.runner
from rollout.core.outcomes import classify
from rollout.sandbox.runner import run_runtime
from tests.rollout.sandbox_helpers import make_env, request, require_bwrap


async def _run(tmp_path: Path, runtime: str, limits: dict[str, int], sid: str = "s1", timeout_s: float = 120):
    cfg = make_env(tmp_path / "envs", "lim", runtime, runtime_cfg={"limits": limits, "timeout_s": timeout_s})
    ws = tmp_path / "ws"
    ws.mkdir()
    return await run_runtime(cfg, request(sid), ws, {}), ws


FORK_BOMB = """
import os, time
while True:
    try:
        os.fork()
    except OSError:
        time.sleep(0.001)
"""


async def test_fork_bomb_is_stopped_by_the_process_limit(tmp_path: Path) -> None:
    support = require_bwrap()
    sid = f"fork-{uuid.uuid4().hex[:8]}"
    out, _ = await _run(tmp_path, FORK_BOMB, {"processes": 32}, sid=sid)
    assert (out.status, out.limit_exceeded, out.sandbox, out.setup_failed) == (
        "error",
        "processes",
        "bwrap",
        False,
    )
    assert (
        out.error_text
        == "process limit exceeded: the session tried to run more than 32 processes/threads at once"
    )
    if support.pids is not None:  # its cgroup is gone, nothing left running in it
        assert not list(support.pids.parent.glob(f"rollout-{sid}-*"))


BIG_FILE = """
import time
chunk = b"x" * (1 << 20)
with open("big.bin", "wb") as f:
    for _ in range(10 * 1024):          # 10 GiB
        try:
            f.write(chunk)
            f.flush()
        except OSError as e:
            print("write refused:", e, flush=True)
            time.sleep(300)
"""


async def test_a_10_gb_file_is_stopped_early_by_the_disk_limit(tmp_path: Path) -> None:
    require_bwrap()
    out, ws = await _run(tmp_path, BIG_FILE, {"disk_mb": 8})
    assert (out.status, out.limit_exceeded) == ("error", "disk")
    assert out.error_text == "disk limit exceeded: the workspace holds more than 8 MiB"
    # the per-file cap stopped the writes at the limit (one byte past it: RLIMIT_FSIZE is the
    # limit + 1): nothing like 10 GB was written
    assert (ws / "big.bin").stat().st_size == 8 * (1 << 20) + 1
    assert "File too large" in out.stdout_tail


MANY_FILES = """
import time
for i in range(5):
    with open(f"part{i}.bin", "wb") as f:
        f.write(b"y" * (3 << 20))
time.sleep(300)
"""


async def test_many_files_under_the_per_file_cap_still_hit_the_disk_limit(tmp_path: Path) -> None:
    require_bwrap()
    out, ws = await _run(tmp_path, MANY_FILES, {"disk_mb": 8})
    assert (out.status, out.limit_exceeded) == ("error", "disk")
    assert sum(p.stat().st_size for p in ws.iterdir()) > 8 << 20


async def test_without_a_sandbox_the_disk_limit_stops_files_written_after_the_start(tmp_path: Path) -> None:
    """``sandbox: none``: the workspace is empty when the runtime starts (the check then needs no
    thread) and fills later: the disk limit still ends the session."""
    cfg = make_env(
        tmp_path / "envs", "lim", MANY_FILES, runtime_cfg={"limits": {"disk_mb": 8}, "timeout_s": 120}
    )
    ws = tmp_path / "ws"
    ws.mkdir()
    out = await run_runtime(cfg, request("s1"), ws, {}, job_mode="none")
    assert (out.status, out.limit_exceeded, out.sandbox) == ("error", "disk", "none")
    assert out.error_text == "disk limit exceeded: the workspace holds more than 8 MiB"
    assert sum(p.stat().st_size for p in ws.iterdir()) > 8 << 20


DEEP_TREE = """
import os, time
for _ in range(60):                     # 60 folders of 200 characters: paths of 12,000, past PATH_MAX
    os.mkdir("d" * 200)
    os.chdir("d" * 200)
for i in range(5):                      # 15 MiB down there, each file under the per-file cap
    with open(f"part{i}.bin", "wb") as f:
        f.write(b"y" * (3 << 20))
print("written", flush=True)
time.sleep(300)
"""


async def test_files_below_a_path_longer_than_path_max_count_against_the_disk_limit(tmp_path: Path) -> None:
    require_bwrap()
    out, _ = await _run(tmp_path, DEEP_TREE, {"disk_mb": 8})
    assert (out.status, out.limit_exceeded) == ("error", "disk"), out
    # the folders themselves are 60 entries (240 KiB): only the files below the deep path go past 8 MiB


EMPTY_FILES = """
import os, time
for i in range({n}):
    open(f"e{{i}}", "w").close()
print("made", flush=True)
time.sleep(300)
"""


async def test_empty_files_count_against_the_disk_limit(tmp_path: Path) -> None:
    require_bwrap()
    out, ws = await _run(tmp_path, EMPTY_FILES.format(n=4000), {"disk_mb": 8})  # 4000 blocks of 4 KiB > 8 MiB
    assert (out.status, out.limit_exceeded) == ("error", "disk"), out
    assert sum(p.stat().st_size for p in ws.iterdir()) == 0


async def test_a_flood_of_files_is_stopped_by_the_file_limit(tmp_path: Path) -> None:
    require_bwrap()
    out, ws = await _run(tmp_path, EMPTY_FILES.format(n=3000), {"max_files": 1000})
    assert (out.status, out.limit_exceeded) == ("error", "files"), out
    assert (
        out.error_text == "file limit exceeded: the workspace holds more than 1000 files, folders and links"
    )
    end = classify(
        out.status,
        setup_failed=out.setup_failed,
        limit_exceeded=out.limit_exceeded,
        error_text=out.error_text,
    )
    assert (end.outcome, end.infra) == ("limit_exceeded", False)  # a task outcome, graded, not retried
    assert len(list(ws.iterdir())) > 1000


MEMORY_HOG = """
import time
hog = bytearray(b"\\x01") * (1 << 30)   # 1 GiB, every page touched
time.sleep(300)
"""


async def test_memory_hog_is_stopped_by_the_memory_limit(tmp_path: Path) -> None:
    support = require_bwrap()
    out, _ = await _run(tmp_path, MEMORY_HOG, {"memory_mb": 128})
    if support.memory is None:  # RLIMIT_AS: the allocation fails inside, the runtime crashes
        assert out.status == "error" and "MemoryError" in out.stderr_tail
        return
    assert (out.status, out.limit_exceeded) == ("error", "memory")
    assert (
        out.error_text
        == "memory limit exceeded: the session used more than 128 MiB (the kernel killed a process)"
    )


LOUD = """
import sys, time
for _ in range(3 * 1024):
    sys.stderr.write("z" * 1024)
sys.stderr.flush()
time.sleep(300)
"""


async def test_output_flood_is_stopped_by_the_output_limit(tmp_path: Path) -> None:
    require_bwrap()
    out, _ = await _run(tmp_path, LOUD, {"output_mb": 1})
    assert (out.status, out.limit_exceeded) == ("error", "output")
    assert out.error_text == f"output limit exceeded: more than {1 << 20} bytes of stdout + stderr"


HANG_WITH_ESCAPED_CHILD = """
import subprocess, sys, time
subprocess.Popen(["sleep", "300", "MARKER"], start_new_session=True)   # leaves the process group
print("child started", file=sys.stderr, flush=True)
time.sleep(300)
"""


async def test_timeout_kills_the_whole_sandbox_even_children_that_left_the_group(tmp_path: Path) -> None:
    require_bwrap()
    marker = f"sbx-{uuid.uuid4().hex}"
    out, _ = await _run(tmp_path, HANG_WITH_ESCAPED_CHILD.replace("MARKER", marker), {}, timeout_s=3)
    assert out.status == "timeout" and out.error_text == "runtime timed out after 3 s (killed)"
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    assert left == []


KILL_OWN_GROUP = """
import os, signal
signal.signal(signal.SIGNAL, signal.SIG_IGN)  # survive its own signal: only the others get it
open("RAN", "w").write("ran")
os.kill(0, signal.SIGNAL)
print("still here", flush=True)
"""


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
async def test_a_runtime_signalling_its_process_group_reaches_nothing_outside_the_sandbox(
    tmp_path: Path, sig: str
) -> None:
    """``kill(0, ...)`` hits the caller's process group whatever its pid namespace: bwrap's monitor
    (which reports that the runtime started) and the network helper's process must not be in it,
    or a runtime that ran would end as a ``setup_failed``, excluded instead of the agent's 0."""
    require_bwrap()
    cfg = make_env(tmp_path / "envs", "killgroup", KILL_OWN_GROUP.replace("SIGNAL", sig))
    ws = tmp_path / "ws"
    ws.mkdir()
    out = await run_runtime(cfg, request(), ws, {})
    assert (ws / "RAN").read_text() == "ran"
    assert (out.setup_failed, out.status, out.stdout_tail) == (False, "error", "still here\n"), out.error_text
    assert classify(out.status, setup_failed=out.setup_failed).infra is False


async def test_a_runtime_that_cannot_start_is_a_setup_failure(tmp_path: Path) -> None:
    require_bwrap()
    cfg = make_env(tmp_path / "envs", "nostart", "", runtime_cfg={"command": ["/no/such/runtime", "x"]})
    ws = tmp_path / "ws"
    ws.mkdir()
    out = await run_runtime(cfg, request(), ws, {})
    assert (out.status, out.setup_failed, out.sandbox) == ("error", True, "bwrap")
    assert out.error_text is not None
    assert out.error_text.startswith("sandbox setup failed: cannot start runtime ['/no/such/runtime', 'x']")


async def test_a_gateway_that_cannot_be_bridged_is_a_setup_failure(tmp_path: Path) -> None:
    require_bwrap()
    cfg = make_env(tmp_path / "envs", "nobridge", "print('never runs')")
    ws = tmp_path / "ws"
    ws.mkdir()
    out = await run_runtime(cfg, request(gateway="ftp://127.0.0.1/v1/sessions"), ws, {})
    assert (out.status, out.setup_failed) == ("error", True)
    assert out.error_text == (
        "sandbox setup failed: BridgeError: cannot bridge to gateway URL "
        "'ftp://127.0.0.1/v1/sessions/s1': need http(s)://HOST[:PORT]/..."
    )


AS_PROBE = """
import resource, sys, time
print("as-limit", resource.getrlimit(resource.RLIMIT_AS)[0], file=sys.stderr, flush=True)
hog = bytearray(b"\\x01") * (1 << 30)
"""


async def test_without_a_memory_cgroup_the_memory_limit_is_a_per_process_rlimit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    support = require_bwrap()
    monkeypatch.setattr(
        rollout.sandbox.runner, "sandbox_support", lambda: dataclasses.replace(support, memory=None)
    )
    out, _ = await _run(tmp_path, AS_PROBE, {"memory_mb": 256})
    assert f"as-limit {256 << 20}" in out.stderr_tail
    assert out.status == "error" and "MemoryError" in out.stderr_tail
    assert (
        dataclasses.replace(support, memory=None).mechanisms()["memory"]
        == "RLIMIT_AS of each process (no cgroup available)"
    )
