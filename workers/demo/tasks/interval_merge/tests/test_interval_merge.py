import unittest

from intervals import insert, merge, total_length


class MergeTest(unittest.TestCase):
    def test_overlapping_intervals_merge(self):
        self.assertEqual(merge([(1, 3), (2, 6), (8, 10)]), [(1, 6), (8, 10)])

    def test_contained_interval_does_not_shrink_the_container(self):
        self.assertEqual(merge([(1, 10), (2, 3)]), [(1, 10)])
        self.assertEqual(merge([(5, 6), (1, 10), (2, 3), (11, 12)]), [(1, 10), (11, 12)])

    def test_unsorted_input(self):
        self.assertEqual(merge([(8, 9), (1, 4), (3, 5)]), [(1, 5), (8, 9)])

    def test_empty_and_bad_input(self):
        self.assertEqual(merge([]), [])
        with self.assertRaises(ValueError):
            merge([(3, 1)])


class DerivedTest(unittest.TestCase):
    def test_total_length_counts_covered_span_once(self):
        self.assertEqual(total_length([(0, 10), (2, 4), (20, 25)]), 15)

    def test_insert_keeps_existing_coverage(self):
        self.assertEqual(insert([(0, 100)], (10, 20)), [(0, 100)])
        self.assertEqual(insert([(1, 2), (6, 9)], (3, 5)), [(1, 2), (3, 5), (6, 9)])


if __name__ == "__main__":
    unittest.main()
