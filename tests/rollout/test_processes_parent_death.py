"""A child the launcher starts (gateway, model server) must not outlive it, even when the
launcher is killed with SIGKILL and cannot stop it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

PARENT = r"""
import sys, time
from pathlib import Path
from rollout.jobs.processes import _spawn
child = _spawn("sleeper", [sys.executable, "-c", "import time; time.sleep(600)"], Path(sys.argv[1]), "")
print(child.proc.pid, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text() if Path(f"/proc/{pid}/stat").exists() else ""
    return " Z " not in stat  # a zombie waiting for init's reaping counts as gone


def test_a_started_child_dies_when_the_launcher_is_killed(tmp_path: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path)],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert parent.stdout is not None
    child_pid = int(parent.stdout.readline())
    try:
        assert _alive(child_pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 60
        while _alive(child_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(child_pid)
    finally:
        parent.stdout.close()
        if _alive(child_pid):
            os.kill(child_pid, signal.SIGKILL)
