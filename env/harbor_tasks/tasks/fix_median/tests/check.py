"""Runs the unit tests of test_stats.py and writes /logs/verifier/reward.txt: 1 when they all pass.

The agent's code runs only in child processes (test_stats.median_of). This process makes itself
non-dumpable first (its children cannot trace or rewrite it), writes 0 before any of the agent's
code runs, and after the tests stops, then kills, every process it did not start from (what the
agent's code left behind) before it writes the verdict; when it cannot, the verdict is 0.
"""

import ctypes
import os
import signal
import sys
import time
import unittest

PR_SET_DUMPABLE = 4
REWARD = "/logs/verifier/reward.txt"


def write_reward(value: str) -> None:
    with open(REWARD, "w") as f:
        f.write(value + "\n")


def ancestors() -> set:
    keep, pid = {1}, os.getpid()
    while pid > 1:
        keep.add(pid)
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    return keep


def pids() -> list:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "X"  # gone


def sweep(deadline_s: float = 20.0) -> bool:
    """Stop, then kill, every process but this one and its ancestors; True when none is left.

    Stopped first: a stopped process cannot fork or write, so even a fork storm ends once every
    member is stopped (the sandbox's process cap bounds how many there are). Only when a whole pass
    finds nothing running is everything killed."""
    keep = ancestors()
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        others = [p for p in pids() if p not in keep and state(p) not in ("Z", "X")]
        if not others:
            return True
        running = [p for p in others if state(p) not in ("T", "t")]
        for pid in others:
            try:
                os.kill(pid, signal.SIGSTOP if running else signal.SIGKILL)
            except OSError:
                pass
        if not running:
            time.sleep(0.01)  # let the kills land
    return False


def main() -> int:
    ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    write_reward("0")
    sys.path.insert(0, "/tests")
    suite = unittest.defaultTestLoader.discover("/tests", pattern="test_*.py")
    result = unittest.TextTestRunner(stream=sys.stdout, verbosity=2).run(suite)
    clean = sweep()  # what the agent's code left running can no longer write anything
    passed = clean and result.wasSuccessful() and result.testsRun == suite.countTestCases() > 0
    write_reward("1" if passed else "0")
    return 0


if __name__ == "__main__":
    sys.exit(main())
