"""Hidden evaluation tests of json_path: copied into the workspace only for the evaluation."""

import unittest

from jsonpath import exists, get

DOC = {
    "service": {"name": "api", "ports": [80, 443, 8080]},
    "users": [{"name": "ada", "roles": ["admin"]}, {"name": "bob", "roles": []}],
    "a.b": {"c": True},
    'say "hi"': 1,
}


class GetTest(unittest.TestCase):
    def test_negative_indices_count_from_the_end(self):
        self.assertEqual(get(DOC, "service.ports[-1]"), 8080)
        self.assertEqual(get(DOC, "service.ports[-3]"), 80)
        self.assertEqual(get(DOC, "users[-2].roles[0]"), "admin")

    def test_negative_indices_past_the_start_are_missing(self):
        for path in ("service.ports[-4]", "service.ports[-100]", "users[-3]"):
            self.assertEqual(get(DOC, path, "fallback"), "fallback", msg=path)
            self.assertFalse(exists(DOC, path), msg=path)
        self.assertEqual(get([[1, 2]], "[-1][-2]"), 1)

if __name__ == "__main__":
    unittest.main()
