"""Check for implement_function: the agent's code runs only in a guest sandbox (clawgym_guest), never in this process.

Sub-scores: tests_pass (the task's own tests, as shipped, all 4 ran and passed), tests_unchanged (the
agent left test_textkit.py as shipped), hidden_checks (values computed by the agent's code, compared here).
An exit status is never trusted: a run that reports nothing (an early exit, a crash) scores 0.
"""
import hashlib
import json
import math
import sys
from pathlib import Path

MODULE = 'textkit'
TEST_FILE = 'test_textkit.py'
TEST_SHA256 = '0c964f5927221abcd0ef1db3f47f19a7ec5f937752677271bbd0228bca5c87b7'
TEST_SOURCE = 'import unittest\n\nfrom textkit import slugify\n\n\nclass SlugifyTest(unittest.TestCase):\n    def test_basic(self):\n        self.assertEqual(slugify("Hello, World!"), "hello-world")\n\n    def test_numbers_and_dots(self):\n        self.assertEqual(slugify("Python 3.12 release notes"), "python-3-12-release-notes")\n\n    def test_strip_dashes(self):\n        self.assertEqual(slugify("--Already--slugged--"), "already-slugged")\n\n    def test_empty(self):\n        self.assertEqual(slugify(""), "")\n\n\nif __name__ == "__main__":\n    unittest.main()\n'
N_TESTS = 4
SETUP = 'from textkit import slugify'
HIDDEN = [("slugify('  Many   spaces\\tand\\ttabs ')", 'many-spaces-and-tabs'), ("slugify('C++ & Rust')", 'c-rust'), ("slugify('\\u00dcBER cool')", 'ber-cool'), ("slugify('a_b/c')", 'a-b-c')]
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
