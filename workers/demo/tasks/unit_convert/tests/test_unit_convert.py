import unittest

from units import celsius_to_fahrenheit, convert, fahrenheit_to_celsius


class TemperatureTest(unittest.TestCase):
    def test_fahrenheit_to_celsius(self):
        self.assertAlmostEqual(fahrenheit_to_celsius(212), 100)
        self.assertAlmostEqual(fahrenheit_to_celsius(32), 0)
        self.assertAlmostEqual(fahrenheit_to_celsius(-40), -40)

    def test_celsius_to_fahrenheit(self):
        self.assertAlmostEqual(celsius_to_fahrenheit(100), 212)
        self.assertAlmostEqual(celsius_to_fahrenheit(37), 98.6)

    def test_convert_between_any_two_units(self):
        self.assertAlmostEqual(convert(32, "F", "K"), 273.15)
        self.assertAlmostEqual(convert(0, "K", "F"), -459.67)
        self.assertAlmostEqual(convert(25, "c", "c"), 25)

    def test_convert_rejects_unknown_units_and_impossible_values(self):
        with self.assertRaises(ValueError):
            convert(1, "X", "C")
        with self.assertRaises(ValueError):
            convert(-500, "F", "C")


if __name__ == "__main__":
    unittest.main()
