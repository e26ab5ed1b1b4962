from .calendar_math import add_months, days_in_month, is_leap_year, parse_date

__all__ = ["add_months", "days_in_month", "is_leap_year", "parse_date"]
