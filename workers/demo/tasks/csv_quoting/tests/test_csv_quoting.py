import csv
import io
import unittest

from csvlite import format_row, format_rows, quote_field


def read_back(text, delimiter=","):
    return list(csv.reader(io.StringIO(text, newline=""), delimiter=delimiter))


class QuoteFieldTest(unittest.TestCase):
    def test_plain_fields_are_not_quoted(self):
        self.assertEqual(format_row(["a", 1, None, 2.5]), "a,1,,2.5")

    def test_delimiter_and_newline_force_quotes(self):
        self.assertEqual(quote_field("a,b"), '"a,b"')
        self.assertEqual(quote_field("two\nlines"), '"two\nlines"')
        self.assertEqual(quote_field("a;b", delimiter=";"), '"a;b"')

    def test_quotes_are_doubled_inside_quoted_fields(self):
        self.assertEqual(format_row(['say "hi"', "x"]), '"say ""hi""",x')
        self.assertEqual(quote_field('"'), '""""')

class RoundTripTest(unittest.TestCase):
    def test_stdlib_reader_reads_back_what_we_write(self):
        rows = [
            ["id", "comment"],
            ["1", 'she said "no"'],
            ["2", '"quoted" at the start'],
            ["3", "comma, and\r\nnewline"],
            ["4", ""],
        ]
        self.assertEqual(read_back(format_rows(rows)), rows)

    def test_round_trip_with_another_delimiter(self):
        rows = [["a;b", 'c"d', "e"]]
        self.assertEqual(read_back(format_rows(rows, delimiter=";"), delimiter=";"), rows)


if __name__ == "__main__":
    unittest.main()
