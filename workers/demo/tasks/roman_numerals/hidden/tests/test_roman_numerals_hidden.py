"""Hidden evaluation tests of roman_numerals: copied into the workspace only for the evaluation."""

import unittest

from roman import from_roman, to_roman


class FromRomanTest(unittest.TestCase):
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

if __name__ == "__main__":
    unittest.main()
