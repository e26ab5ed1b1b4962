import unittest

from roman import from_roman, to_roman


class FromRomanTest(unittest.TestCase):
    def test_repeated_letters_add_up(self):
        self.assertEqual(from_roman("III"), 3)
        self.assertEqual(from_roman("XX"), 20)
        self.assertEqual(from_roman("MMM"), 3000)

    def test_subtractive_forms(self):
        self.assertEqual(from_roman("IV"), 4)
        self.assertEqual(from_roman("XC"), 90)
        self.assertEqual(from_roman("CM"), 900)

    def test_mixed_numerals(self):
        self.assertEqual(from_roman("MMXXIV"), 2024)
        self.assertEqual(from_roman("MCMXCIV"), 1994)
        self.assertEqual(from_roman("xlii"), 42)

    def test_round_trip_for_every_supported_number(self):
        for n in range(1, 4000):
            self.assertEqual(from_roman(to_roman(n)), n)

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
