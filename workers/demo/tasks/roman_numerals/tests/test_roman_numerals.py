import unittest

from roman import from_roman, to_roman


class FromRomanTest(unittest.TestCase):
    def test_repeated_letters_add_up(self):
        self.assertEqual(from_roman("III"), 3)
        self.assertEqual(from_roman("XX"), 20)
        self.assertEqual(from_roman("MMM"), 3000)

    def test_rejects_garbage(self):
        with self.assertRaises(ValueError):
            from_roman("ABC")
        with self.assertRaises(ValueError):
            from_roman("")


class ToRomanTest(unittest.TestCase):
    def test_known_values(self):
        self.assertEqual(to_roman(1994), "MCMXCIV")
        self.assertEqual(to_roman(4), "IV")

    def test_out_of_range(self):
        with self.assertRaises(ValueError):
            to_roman(0)


if __name__ == "__main__":
    unittest.main()
