"""Hidden evaluation tests of word_wrap: copied into the workspace only for the evaluation."""

import unittest

from linewrap import wrap

TEXT = "the quick brown fox jumps over the lazy dog"


class WrapTest(unittest.TestCase):
    def test_no_line_exceeds_width(self):
        for width in range(5, 30):
            for line in wrap(TEXT, width):
                self.assertLessEqual(len(line), width)

    def test_every_width_packs_lines_greedily(self):
        self.assertEqual(wrap("ab cd", 5), ["ab cd"])
        self.assertEqual(wrap("ab cd ef", 5), ["ab cd", "ef"])
        for width in range(3, 30):
            lines = wrap(TEXT, width)
            for line, following in zip(lines, lines[1:], strict=False):
                self.assertGreater(len(line) + 1 + len(following.split()[0]), width)

if __name__ == "__main__":
    unittest.main()
