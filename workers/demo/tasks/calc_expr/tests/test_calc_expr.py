import unittest

from calc import evaluate


class EvaluateTest(unittest.TestCase):
    def test_subtraction_is_left_associative(self):
        self.assertEqual(evaluate("10 - 3 - 2"), 5.0)
        self.assertEqual(evaluate("1 - 1 - 1 - 1"), -2.0)

    def test_mixed_addition_and_subtraction(self):
        self.assertEqual(evaluate("2 - 1 + 1"), 2.0)
        self.assertEqual(evaluate("1 + 2 - 3 + 4"), 4.0)

    def test_parentheses_and_unary_minus(self):
        self.assertEqual(evaluate("-(2 - 5) * 2"), 6.0)
        self.assertEqual(evaluate("10 - (3 - 2)"), 9.0)
        self.assertEqual(evaluate("-3 - -3"), 0.0)

    def test_syntax_errors(self):
        for text in ("1 +", "(1 + 2", "1 2", "2 $ 3", ""):
            with self.assertRaises(SyntaxError, msg=text):
                evaluate(text)


if __name__ == "__main__":
    unittest.main()
