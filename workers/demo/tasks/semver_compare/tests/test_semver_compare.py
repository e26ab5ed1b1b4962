import unittest

from semver import Version, compare, max_version


class OrderingTest(unittest.TestCase):
    def test_numeric_fields_compare_as_numbers(self):
        self.assertEqual(compare("1.10.0", "1.9.0"), 1)
        self.assertEqual(compare("2.0.0", "10.0.0"), -1)

    def test_release_sorts_after_its_prereleases(self):
        self.assertEqual(max_version(["1.0.0", "1.0.0-rc.1"]), "1.0.0")
        self.assertLess(Version("1.0.0-alpha"), Version("1.0.0"))

    def test_build_metadata_is_ignored(self):
        self.assertEqual(compare("1.2.3+build.5", "1.2.3"), 0)
        self.assertEqual(Version("1.2.3+a"), Version("1.2.3+b"))

    def test_invalid_versions_are_rejected(self):
        for text in ("1.2", "1.2.3-", "v1.2.3", "1.2.3-rc..1"):
            with self.assertRaises(ValueError):
                Version(text)


if __name__ == "__main__":
    unittest.main()
