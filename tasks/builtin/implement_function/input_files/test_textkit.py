import unittest

from textkit import slugify


class SlugifyTest(unittest.TestCase):
    def test_basic(self):
        self.assertEqual(slugify("Hello, World!"), "hello-world")

    def test_numbers_and_dots(self):
        self.assertEqual(slugify("Python 3.12 release notes"), "python-3-12-release-notes")

    def test_strip_dashes(self):
        self.assertEqual(slugify("--Already--slugged--"), "already-slugged")

    def test_empty(self):
        self.assertEqual(slugify(""), "")


if __name__ == "__main__":
    unittest.main()
