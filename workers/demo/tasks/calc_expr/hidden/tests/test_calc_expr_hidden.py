"""Hidden evaluation tests of calc_expr: copied into the workspace only for the evaluation."""

import unittest

from calc import evaluate


class EvaluateTest(unittest.TestCase):
    def test_precedence(self):
        self.assertEqual(evaluate("2 + 3 * 4"), 14.0)
        self.assertEqual(evaluate("8 / 2 * 2"), 8.0)
        self.assertEqual(evaluate("10 - 4 / 2 - 1"), 7.0)

    def test_agrees_with_python(self):
        for text in ("1-2-3-4", "100/10/5", "2*3-4*5+6", "0.5-.25-.125", "7-(1-2)-(3-4)"):
            self.assertAlmostEqual(evaluate(text), eval(text), msg=text)

if __name__ == "__main__":
    unittest.main()
