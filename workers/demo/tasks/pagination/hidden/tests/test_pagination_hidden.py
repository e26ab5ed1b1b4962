"""Hidden evaluation tests of pagination: copied into the workspace only for the evaluation."""

import unittest

from pager import paginate, total_pages


class PaginateTest(unittest.TestCase):
    def setUp(self):
        self.items = list(range(25))

    def test_last_page_holds_the_remainder(self):
        page = paginate(self.items, page=3, per_page=10)
        self.assertEqual(page.items, [20, 21, 22, 23, 24])
        self.assertFalse(page.has_next)

    def test_pages_cover_every_item_once(self):
        seen = []
        for number in range(1, total_pages(len(self.items), 7) + 1):
            seen.extend(paginate(self.items, page=number, per_page=7).items)
        self.assertEqual(seen, self.items)

if __name__ == "__main__":
    unittest.main()
