import unittest

from matrix import add, identity, matmul, power, shape, transpose


class MatmulTest(unittest.TestCase):
    def test_square(self):
        self.assertEqual(matmul([[1, 2], [3, 4]], [[5, 6], [7, 8]]), [[19, 22], [43, 50]])

    def test_wide_times_tall(self):
        a = [[1, 2, 3], [4, 5, 6]]
        b = [[7, 8], [9, 10], [11, 12]]
        self.assertEqual(matmul(a, b), [[58, 64], [139, 154]])

    def test_tall_times_wide(self):
        a = [[1, 2], [3, 4], [5, 6]]
        b = [[1, 0, 2], [0, 1, 3]]
        self.assertEqual(matmul(a, b), [[1, 2, 8], [3, 4, 18], [5, 6, 28]])
        self.assertEqual(shape(matmul(a, b)), (3, 3))

    def test_row_times_column(self):
        self.assertEqual(matmul([[1, 2, 3]], [[4], [5], [6]]), [[32]])

    def test_shape_mismatch(self):
        with self.assertRaises(ValueError):
            matmul([[1, 2]], [[1, 2]])

    def test_transpose_identity(self):
        a = [[1, 2, 3], [4, 5, 6]]
        self.assertEqual(matmul(transpose(a), a), transpose(matmul(transpose(a), a)))


class OtherOpsTest(unittest.TestCase):
    def test_power_of_fibonacci_matrix(self):
        self.assertEqual(power([[1, 1], [1, 0]], 10), [[89, 55], [55, 34]])
        self.assertEqual(power([[2, 0], [0, 2]], 0), identity(2))

    def test_add(self):
        self.assertEqual(add([[1, 2]], [[3, 4]]), [[4, 6]])


if __name__ == "__main__":
    unittest.main()
