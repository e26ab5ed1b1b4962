"""Hidden evaluation tests of slugify: copied into the workspace only for the evaluation."""

import unittest

from textutil import slugify


class SlugifyTest(unittest.TestCase):
    def test_custom_separator(self):
        self.assertEqual(slugify("Rock & Roll", separator="_"), "rock_roll")

    def test_every_separator_is_honoured(self):
        for separator in ("_", ".", "+"):
            self.assertEqual(slugify("  a, b & c  ", separator=separator), separator.join("abc"))

if __name__ == "__main__":
    unittest.main()
