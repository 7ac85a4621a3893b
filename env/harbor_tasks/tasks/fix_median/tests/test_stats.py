"""Unit tests of stats.median, loaded from the agent's workspace by its path."""

import importlib.util
import unittest


def load_median():
    spec = importlib.util.spec_from_file_location("stats_under_test", "/workspace/stats.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.median


class MedianTest(unittest.TestCase):
    def setUp(self):
        self.median = load_median()

    def test_odd_unsorted(self):
        self.assertEqual(self.median([5, 1, 3]), 3)

    def test_even(self):
        self.assertEqual(self.median([4, 1, 3, 2]), 2.5)

    def test_single(self):
        self.assertEqual(self.median([7]), 7)

    def test_input_unchanged(self):
        values = [3, 1, 2]
        self.median(values)
        self.assertEqual(values, [3, 1, 2])
