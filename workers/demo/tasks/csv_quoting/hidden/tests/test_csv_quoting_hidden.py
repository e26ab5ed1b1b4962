"""Hidden evaluation tests of csv_quoting: copied into the workspace only for the evaluation."""

import csv
import io
import unittest

from csvlite import format_rows, quote_field


def read_back(text, delimiter=","):
    return list(csv.reader(io.StringIO(text, newline=""), delimiter=delimiter))


class QuoteFieldTest(unittest.TestCase):
    def test_carriage_return_forces_quotes(self):
        self.assertEqual(quote_field("a\rb"), '"a\rb"')

    def test_a_lone_carriage_return_survives_a_round_trip(self):
        rows = [["a\rb", "c"], ["\r", ""]]
        self.assertEqual(read_back(format_rows(rows)), rows)


if __name__ == "__main__":
    unittest.main()
