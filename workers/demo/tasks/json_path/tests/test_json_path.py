import unittest

from jsonpath import exists, get, parse_path

DOC = {
    "service": {"name": "api", "ports": [80, 443, 8080]},
    "users": [{"name": "ada", "roles": ["admin"]}, {"name": "bob", "roles": []}],
    "a.b": {"c": True},
    'say "hi"': 1,
}


class ParsePathTest(unittest.TestCase):
    def test_parts(self):
        self.assertEqual(parse_path('a.b[0]["x.y"][-1]'), ["a", "b", 0, "x.y", -1])

    def test_escaped_quote(self):
        self.assertEqual(parse_path(r'["say \"hi\""]'), ['say "hi"'])

    def test_malformed(self):
        for path in ("", ".a", "a.", "a..b", "a[x]", "a[1"):
            with self.assertRaises(ValueError, msg=path):
                parse_path(path)


class GetTest(unittest.TestCase):
    def test_found(self):
        self.assertEqual(get(DOC, "service.name"), "api")
        self.assertEqual(get(DOC, "users[1].name"), "bob")
        self.assertEqual(get(DOC, '["a.b"].c'), True)
        self.assertEqual(get(DOC, r'["say \"hi\""]'), 1)

    def test_missing_paths_return_the_default(self):
        for path in (
            "service.version",
            "service.ports[3]",
            "service.ports[-4]",
            "users[-3].name",
            "users[1].roles[0]",
            "users[1].roles[-1]",
            "service.name.first",
            "service[0]",
        ):
            self.assertEqual(get(DOC, path, "fallback"), "fallback", msg=path)

    def test_exists_agrees_with_get(self):
        self.assertTrue(exists(DOC, "users[-1]"))
        self.assertFalse(exists(DOC, "users[-10]"))
        self.assertFalse(exists(DOC, "service.port"))
        self.assertTrue(exists({"k": None}, "k"))


if __name__ == "__main__":
    unittest.main()
