import unittest

from matrix import add, identity, matmul, power


class MatmulTest(unittest.TestCase):
    def test_square(self):
        self.assertEqual(matmul([[1, 2], [3, 4]], [[5, 6], [7, 8]]), [[19, 22], [43, 50]])

    def test_wide_times_tall(self):
        a = [[1, 2, 3], [4, 5, 6]]
        b = [[7, 8], [9, 10], [11, 12]]
        self.assertEqual(matmul(a, b), [[58, 64], [139, 154]])

    def test_row_times_column(self):
        self.assertEqual(matmul([[1, 2, 3]], [[4], [5], [6]]), [[32]])

    def test_shape_mismatch(self):
        with self.assertRaises(ValueError):
            matmul([[1, 2]], [[1, 2]])

class OtherOpsTest(unittest.TestCase):
    def test_power_of_fibonacci_matrix(self):
        self.assertEqual(power([[1, 1], [1, 0]], 10), [[89, 55], [55, 34]])
        self.assertEqual(power([[2, 0], [0, 2]], 0), identity(2))

    def test_add(self):
        self.assertEqual(add([[1, 2]], [[3, 4]]), [[4, 6]])


if __name__ == "__main__":
    unittest.main()
