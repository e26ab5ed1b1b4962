"""Roman numerals for the integers 1..3999."""

from .numerals import from_roman, to_roman

__all__ = ["from_roman", "to_roman"]
