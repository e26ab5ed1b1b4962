import unittest

from lru import LRUCache


class LRUCacheTest(unittest.TestCase):
    def test_evicts_least_recently_put(self):
        cache = LRUCache(2)
        cache.put("a", 1)
        cache.put("b", 2)
        cache.put("c", 3)
        self.assertNotIn("a", cache)
        self.assertEqual(cache.keys(), ["c", "b"])

    def test_get_protects_a_key_from_eviction(self):
        cache = LRUCache(2)
        cache.put("a", 1)
        cache.put("b", 2)
        self.assertEqual(cache.get("a"), 1)
        cache.put("c", 3)
        self.assertIn("a", cache)
        self.assertNotIn("b", cache)
        self.assertEqual(cache.keys(), ["c", "a"])

    def test_capacity_one(self):
        cache = LRUCache(1)
        cache.put("a", 1)
        cache.get("a")
        cache.put("b", 2)
        self.assertEqual(cache.keys(), ["b"])
        self.assertEqual(len(cache), 1)

if __name__ == "__main__":
    unittest.main()
