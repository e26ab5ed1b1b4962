"""Month arithmetic and lenient date parsing without third-party libraries."""

import datetime as dt
import re

_ISO = re.compile(r"^(\d{4})-(\d{1,2})-(\d{1,2})$")
_EUROPEAN = re.compile(r"^(\d{1,2})/(\d{1,2})/(\d{4})$")


def is_leap_year(year: int) -> bool:
    return year % 4 == 0 and year % 100 != 0


def days_in_month(year: int, month: int) -> int:
    if month == 2:
        return 29 if is_leap_year(year) else 28
    return 30 if month in (4, 6, 9, 11) else 31


def add_months(day: dt.date, months: int) -> dt.date:
    """The same day of the month `months` later (or earlier), clamped to the last day of a shorter
    month: Jan 31 + 1 month is the last day of February."""
    index = day.year * 12 + (day.month - 1) + months
    year, month0 = divmod(index, 12)
    month = month0 + 1
    return dt.date(year, month, min(day.day, days_in_month(year, month)))


def parse_date(text: str) -> dt.date:
    """Accept YYYY-MM-DD or DD/MM/YYYY."""
    text = text.strip()
    if match := _ISO.match(text):
        year, month, day = (int(g) for g in match.groups())
    elif match := _EUROPEAN.match(text):
        day, month, year = (int(g) for g in match.groups())
    else:
        raise ValueError(f"unrecognised date: {text!r}")
    if not 1 <= month <= 12:
        raise ValueError("month out of range")
    if not 1 <= day <= days_in_month(year, month):
        raise ValueError("day out of range")
    return dt.date(year, month, day)
