"""Hidden evaluation tests of unit_convert: copied into the workspace only for the evaluation."""

import unittest

from units import celsius_to_fahrenheit, convert, fahrenheit_to_celsius


class TemperatureTest(unittest.TestCase):
    def test_round_trip(self):
        for c in (-40, 0, 21.5, 100):
            self.assertAlmostEqual(fahrenheit_to_celsius(celsius_to_fahrenheit(c)), c)

    def test_fractional_temperatures_are_not_rounded(self):
        self.assertAlmostEqual(fahrenheit_to_celsius(98.6), 37)
        self.assertAlmostEqual(fahrenheit_to_celsius(0), -160 / 9)
        self.assertAlmostEqual(convert(70.7, "F", "C"), 21.5)

if __name__ == "__main__":
    unittest.main()
