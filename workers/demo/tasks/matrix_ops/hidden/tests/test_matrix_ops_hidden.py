"""Hidden evaluation tests of matrix_ops: copied into the workspace only for the evaluation."""

import unittest

from matrix import matmul, shape, transpose


class MatmulTest(unittest.TestCase):
    def test_tall_times_wide(self):
        a = [[1, 2], [3, 4], [5, 6]]
        b = [[1, 0, 2], [0, 1, 3]]
        self.assertEqual(matmul(a, b), [[1, 2, 8], [3, 4, 18], [5, 6, 28]])
        self.assertEqual(shape(matmul(a, b)), (3, 3))

    def test_transpose_identity(self):
        a = [[1, 2, 3], [4, 5, 6]]
        self.assertEqual(matmul(transpose(a), a), transpose(matmul(transpose(a), a)))


if __name__ == "__main__":
    unittest.main()
