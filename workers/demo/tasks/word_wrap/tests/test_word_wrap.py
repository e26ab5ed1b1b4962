import unittest

from linewrap import fill, justify, wrap

TEXT = "the quick brown fox jumps over the lazy dog"


class WrapTest(unittest.TestCase):
    def test_a_line_may_be_exactly_width_long(self):
        self.assertEqual(wrap("aaa bbb", 7), ["aaa bbb"])

    def test_greedy_lines(self):
        self.assertEqual(wrap(TEXT, 10), ["the quick", "brown fox", "jumps over", "the lazy", "dog"])

    def test_long_word_gets_its_own_line(self):
        self.assertEqual(wrap("a extraordinarily b", 5), ["a", "extraordinarily", "b"])

    def test_whitespace_is_normalised(self):
        self.assertEqual(fill("  one\n two   three ", 9), "one two\nthree")


class JustifyTest(unittest.TestCase):
    def test_lines_are_padded_to_width_except_the_last(self):
        self.assertEqual(justify(TEXT, 16), ["the  quick brown", "fox  jumps  over", "the lazy dog"])


if __name__ == "__main__":
    unittest.main()
