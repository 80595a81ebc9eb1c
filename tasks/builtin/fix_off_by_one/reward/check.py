"""Check for fix_off_by_one: the agent's code runs only in a guest sandbox (clawgym_guest), never in this process.

Sub-scores: tests_pass (the task's own tests, as shipped, all 5 ran and passed), tests_unchanged (the
agent left test_pagination.py as shipped), hidden_checks (values computed by the agent's code, compared here).
An exit status is never trusted: a run that reports nothing (an early exit, a crash) scores 0.
"""
import hashlib
import json
import math
import sys
from pathlib import Path

MODULE = 'pagination'
TEST_FILE = 'test_pagination.py'
TEST_SHA256 = 'ff1ef79f79e3221b43b43306cf7a87a5be264894c41ececb07ff9c4a536b91c5'
TEST_SOURCE = 'import unittest\n\nfrom pagination import page_count, paginate\n\n\nclass PaginationTest(unittest.TestCase):\n    def test_first_page(self):\n        self.assertEqual(paginate(list(range(25)), 1, 10), list(range(10)))\n\n    def test_last_partial_page(self):\n        self.assertEqual(paginate(list(range(25)), 3, 10), [20, 21, 22, 23, 24])\n\n    def test_past_the_end(self):\n        self.assertEqual(paginate(list(range(25)), 4, 10), [])\n\n    def test_page_count(self):\n        self.assertEqual(page_count(25, 10), 3)\n        self.assertEqual(page_count(20, 10), 2)\n        self.assertEqual(page_count(0, 10), 0)\n\n    def test_bad_page(self):\n        with self.assertRaises(ValueError):\n            paginate([1, 2], 0)\n\n\nif __name__ == "__main__":\n    unittest.main()\n'
N_TESTS = 5
SETUP = 'from pagination import paginate, page_count'
HIDDEN = [("paginate('abcdefg', 2, 3)", ['d', 'e', 'f']), ("paginate('abcdefg', 3, 3)", ['g']), ('page_count(7, 3)', 3), ('page_count(1, 5)', 1), ('page_count(6, 3)', 2)]
"""(expression, expected value) pairs evaluated by the agent's code in the guest; compared here."""


def _sha(path):
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except Exception:
        return None


def _same(got, want):
    if isinstance(want, float):
        return isinstance(got, (int, float)) and not isinstance(got, bool) and math.isclose(got, want, abs_tol=1e-9)
    return type(got) is type(want) and got == want


def grade(transcript, workspace_path):
    import clawgym_guest

    ws = Path(workspace_path)
    scores = {"tests_pass": 0.0, "tests_unchanged": 0.0, "hidden_checks": 0.0}
    if not (ws / (MODULE + ".py")).is_file():
        return scores
    if _sha(ws / TEST_FILE) == TEST_SHA256:
        scores["tests_unchanged"] = 1.0
    counts = clawgym_guest.unittest_result([TEST_FILE[:-3]], files={TEST_FILE: TEST_SOURCE}, timeout=30)
    if counts and counts["ran"] == N_TESTS and counts["failures"] == 0 and counts["errors"] == 0 \
            and counts["skipped"] == 0 and counts["expected_failures"] == 0:
        scores["tests_pass"] = 1.0
    values = clawgym_guest.evaluate(SETUP, [expr for expr, _ in HIDDEN], files={TEST_FILE: TEST_SOURCE}, timeout=30)
    if values and all("value" in got and _same(got["value"], want) for got, (_, want) in zip(values, HIDDEN)):
        scores["hidden_checks"] = 1.0
    return scores


def main():
    workspace = sys.argv[1] if len(sys.argv) > 1 else "."
    try:
        result = grade([], workspace)
    except Exception:
        result = {}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
