"""Hidden evaluation tests of date_add_months: copied into the workspace only for the evaluation."""

import unittest
from datetime import date, timedelta

from dates import add_months, days_in_month, is_leap_year


class LeapYearTest(unittest.TestCase):
    def test_gregorian_rules(self):
        self.assertTrue(is_leap_year(2024))
        self.assertFalse(is_leap_year(2023))
        self.assertFalse(is_leap_year(1900))
        self.assertFalse(is_leap_year(2100))
        self.assertTrue(is_leap_year(2000))
        self.assertTrue(is_leap_year(1600))

    def test_agrees_with_the_calendar_module(self):
        import calendar

        for year in range(1500, 2501):
            self.assertEqual(is_leap_year(year), calendar.isleap(year), msg=year)

class AddMonthsTest(unittest.TestCase):
    def test_agrees_with_the_stdlib_for_every_month_end(self):
        for year in (1600, 1900, 2000, 2023, 2024):
            for month in range(1, 13):
                last = add_months(date(year, month, 1), 1) - timedelta(days=1)
                self.assertEqual(days_in_month(year, month), last.day)


if __name__ == "__main__":
    unittest.main()
