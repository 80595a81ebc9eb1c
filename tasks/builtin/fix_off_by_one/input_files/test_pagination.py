import unittest

from pagination import page_count, paginate


class PaginationTest(unittest.TestCase):
    def test_first_page(self):
        self.assertEqual(paginate(list(range(25)), 1, 10), list(range(10)))

    def test_last_partial_page(self):
        self.assertEqual(paginate(list(range(25)), 3, 10), [20, 21, 22, 23, 24])

    def test_past_the_end(self):
        self.assertEqual(paginate(list(range(25)), 4, 10), [])

    def test_page_count(self):
        self.assertEqual(page_count(25, 10), 3)
        self.assertEqual(page_count(20, 10), 2)
        self.assertEqual(page_count(0, 10), 0)

    def test_bad_page(self):
        with self.assertRaises(ValueError):
            paginate([1, 2], 0)


if __name__ == "__main__":
    unittest.main()
