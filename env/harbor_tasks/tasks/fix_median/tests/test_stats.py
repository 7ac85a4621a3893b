"""Unit tests of stats.median. The agent's /workspace/stats.py runs in a child process per call
(its own session, a timeout, its output captured): only what it prints is compared here."""

import json
import subprocess
import sys
import unittest

CALL = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("stats_under_test", "/workspace/stats.py")
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
values = json.loads(sys.argv[1])
result = module.median(values)
print(json.dumps({"median": result, "values": values}))
"""


def median_of(values):
    """(median, the list after the call) as the agent's median computed them."""
    p = subprocess.run(
        [sys.executable, "-I", "-c", CALL, json.dumps(values)],
        capture_output=True,
        text=True,
        timeout=10,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        cwd="/workspace",
    )
    if p.returncode != 0:
        raise AssertionError(f"stats.median failed (exit {p.returncode}): {p.stderr[-500:]}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    return out["median"], out["values"]


class MedianTest(unittest.TestCase):
    def test_odd_unsorted(self):
        self.assertEqual(median_of([5, 1, 3])[0], 3)

    def test_even(self):
        self.assertEqual(median_of([4, 1, 3, 2])[0], 2.5)

    def test_single(self):
        self.assertEqual(median_of([7])[0], 7)

    def test_input_unchanged(self):
        self.assertEqual(median_of([3, 1, 2])[1], [3, 1, 2])
