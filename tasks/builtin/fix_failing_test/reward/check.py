"""Check for fix_failing_test: the agent's code runs only in a guest sandbox (clawgym_guest), never in this process.

Sub-scores: tests_pass (the task's own tests, as shipped, all 4 ran and passed), tests_unchanged (the
agent left test_mathutils.py as shipped), hidden_checks (values computed by the agent's code, compared here).
An exit status is never trusted: a run that reports nothing (an early exit, a crash) scores 0.
"""
import hashlib
import json
import math
import sys
from pathlib import Path

MODULE = 'mathutils'
TEST_FILE = 'test_mathutils.py'
TEST_SHA256 = '011650c19cbd08ba89ccfda129ec8b466e0088b022015b7175d9737a15aa03f1'
TEST_SOURCE = 'import unittest\n\nfrom mathutils import mean, median, variance\n\n\nclass MathUtilsTest(unittest.TestCase):\n    def test_mean(self):\n        self.assertEqual(mean([1, 2, 3, 4]), 2.5)\n\n    def test_median(self):\n        self.assertEqual(median([3, 1, 2]), 2)\n        self.assertEqual(median([4, 1, 3, 2]), 2.5)\n\n    def test_variance(self):\n        self.assertAlmostEqual(variance([2, 4, 4, 4, 5, 5, 7, 9]), 4.0)\n\n    def test_empty(self):\n        with self.assertRaises(ValueError):\n            mean([])\n\n\nif __name__ == "__main__":\n    unittest.main()\n'
N_TESTS = 4
SETUP = 'from mathutils import mean, variance'
HIDDEN = [('mean([2, 4, 9])', 5.0), ('mean([7])', 7.0), ('variance([1, 2, 3, 4])', 1.25)]
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
