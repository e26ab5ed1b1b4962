import unittest

from textutil import slugify


class SlugifyTest(unittest.TestCase):
    def test_simple_words(self):
        self.assertEqual(slugify("Hello World"), "hello-world")

    def test_punctuation_runs_collapse_to_one_separator(self):
        self.assertEqual(slugify("Hello, World!"), "hello-world")
        self.assertEqual(slugify("Rock & Roll"), "rock-roll")
        self.assertEqual(slugify("a -- b ... c"), "a-b-c")

    def test_no_separator_at_the_ends(self):
        self.assertEqual(slugify("  --Trove!--  "), "trove")

    def test_accents_are_folded(self):
        self.assertEqual(slugify("Crème Brûlée"), "creme-brulee")

    def test_max_length_does_not_leave_a_trailing_separator(self):
        self.assertEqual(slugify("hello big world", max_length=10), "hello-big")


if __name__ == "__main__":
    unittest.main()
