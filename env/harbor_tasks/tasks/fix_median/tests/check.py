"""Runs the unit tests of test_stats.py and writes /logs/verifier/reward.txt: 1 when they all pass.

The agent's code runs only in child processes (test_stats.median_of). This process makes itself
non-dumpable first (its children cannot trace or rewrite it), writes 0 before any of the agent's
code runs, and after the tests kills every process it did not start from (what the agent's code
left behind) before it writes the verdict.
"""

import ctypes
import os
import signal
import sys
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


def sweep() -> None:
    keep = ancestors()
    for _ in range(100):
        others = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in keep]
        if not others:
            return
        for pid in others:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def main() -> int:
    ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    write_reward("0")
    sys.path.insert(0, "/tests")
    suite = unittest.defaultTestLoader.discover("/tests", pattern="test_*.py")
    result = unittest.TextTestRunner(stream=sys.stdout, verbosity=2).run(suite)
    sweep()
    passed = result.wasSuccessful() and result.testsRun == suite.countTestCases() > 0
    write_reward("1" if passed else "0")
    return 0


if __name__ == "__main__":
    sys.exit(main())
