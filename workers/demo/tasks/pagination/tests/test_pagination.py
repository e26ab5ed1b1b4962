import unittest

from pager import paginate


class PaginateTest(unittest.TestCase):
    def setUp(self):
        self.items = list(range(25))

    def test_first_page_starts_at_the_first_item(self):
        page = paginate(self.items, page=1, per_page=10)
        self.assertEqual(page.items, list(range(10)))
        self.assertFalse(page.has_previous)
        self.assertTrue(page.has_next)

    def test_page_out_of_range(self):
        with self.assertRaises(ValueError):
            paginate(self.items, page=4, per_page=10)
        with self.assertRaises(ValueError):
            paginate(self.items, page=0, per_page=10)

    def test_empty_list_has_one_empty_page(self):
        page = paginate([], page=1, per_page=10)
        self.assertEqual(page.items, [])
        self.assertEqual(page.total_pages, 1)


if __name__ == "__main__":
    unittest.main()
