"""Hidden evaluation tests of interval_merge: copied into the workspace only for the evaluation."""

import unittest

from intervals import merge


class MergeTest(unittest.TestCase):
    def test_touching_intervals_merge(self):
        self.assertEqual(merge([(1, 2), (2, 5)]), [(1, 5)])

    def test_a_long_interval_swallows_a_chain_of_short_ones(self):
        self.assertEqual(merge([(1, 20), (5, 6), (7, 8), (19, 21)]), [(1, 21)])
        self.assertEqual(merge([(0, 0), (0, 0)]), [(0, 0)])
        self.assertEqual(merge([(4, 5), (1, 4)]), [(1, 5)])

if __name__ == "__main__":
    unittest.main()
