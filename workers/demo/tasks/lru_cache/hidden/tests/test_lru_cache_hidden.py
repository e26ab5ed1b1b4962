"""Hidden evaluation tests of lru_cache: copied into the workspace only for the evaluation."""

import random
import unittest
from collections import OrderedDict

from lru import LRUCache


class LRUCacheTest(unittest.TestCase):
    def test_put_on_existing_key_updates_and_refreshes(self):
        cache = LRUCache(2)
        cache.put("a", 1)
        cache.put("b", 2)
        cache.put("a", 10)
        cache.put("c", 3)
        self.assertEqual(cache.get("a"), 10)
        self.assertIsNone(cache.get("b"))
        self.assertEqual((cache.hits, cache.misses), (1, 1))

    def test_matches_a_reference_model_under_random_use(self):
        rng = random.Random(7)
        cache, model = LRUCache(4), OrderedDict()
        for _ in range(2000):
            key = rng.randrange(8)
            if rng.random() < 0.5:
                cache.put(key, key * 10)
                model[key] = key * 10
                model.move_to_end(key)
                if len(model) > 4:
                    model.popitem(last=False)
            else:
                expected = model.get(key)
                if key in model:
                    model.move_to_end(key)
                self.assertEqual(cache.get(key), expected)
            self.assertEqual(cache.keys(), list(reversed(model)))
            self.assertEqual(len(cache), len(model))


if __name__ == "__main__":
    unittest.main()
