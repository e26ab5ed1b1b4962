"""Hidden evaluation tests of semver_compare: copied into the workspace only for the evaluation."""

import unittest

from semver import Version


class OrderingTest(unittest.TestCase):
    def test_numeric_prerelease_identifiers_compare_as_numbers(self):
        self.assertLess(Version("1.0.0-rc.2"), Version("1.0.0-rc.10"))

    def test_spec_example_order(self):
        ordered = [
            "1.0.0-alpha",
            "1.0.0-alpha.1",
            "1.0.0-alpha.beta",
            "1.0.0-beta",
            "1.0.0-beta.2",
            "1.0.0-beta.11",
            "1.0.0-rc.1",
            "1.0.0",
        ]
        shuffled = ordered[::2] + ordered[1::2]
        self.assertEqual(sorted(shuffled, key=Version), ordered)

if __name__ == "__main__":
    unittest.main()
