import unittest
from datetime import date

from dates import add_months, days_in_month, parse_date


class LeapYearTest(unittest.TestCase):
    def test_february_length(self):
        self.assertEqual(days_in_month(2000, 2), 29)
        self.assertEqual(days_in_month(1900, 2), 28)


class AddMonthsTest(unittest.TestCase):
    def test_clamps_to_end_of_february(self):
        self.assertEqual(add_months(date(2000, 1, 31), 1), date(2000, 2, 29))
        self.assertEqual(add_months(date(2023, 1, 31), 1), date(2023, 2, 28))
        self.assertEqual(add_months(date(1900, 1, 31), 1), date(1900, 2, 28))

    def test_crosses_years_both_ways(self):
        self.assertEqual(add_months(date(2023, 11, 15), 3), date(2024, 2, 15))
        self.assertEqual(add_months(date(2024, 1, 15), -2), date(2023, 11, 15))

class ParseDateTest(unittest.TestCase):
    def test_both_formats(self):
        self.assertEqual(parse_date("2024-03-05"), date(2024, 3, 5))
        self.assertEqual(parse_date("05/03/2024"), date(2024, 3, 5))

    def test_leap_day(self):
        self.assertEqual(parse_date("29/02/2000"), date(2000, 2, 29))
        with self.assertRaises(ValueError):
            parse_date("1900-02-29")

    def test_garbage(self):
        with self.assertRaises(ValueError):
            parse_date("2024/03/05")


if __name__ == "__main__":
    unittest.main()
