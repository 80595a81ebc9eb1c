"""expense_by_category: by_category.json gives each category's total of expenses.csv and the largest.

The expected answer is a constant, computed once from the pristine task; the workspace is read only for the
agent's outputs. An input file that is still in the workspace but no longer holds its pristine bytes
(sha256 below) means the inputs were rewritten: every sub-score is then 0.
"""

import hashlib
import json
import os
import sys
from decimal import Decimal
from pathlib import Path

PRISTINE_SHA256 = {
    "expenses.csv": "b4c8b41eab8fcd8edb61df1b7e2021d8521b4976c70d172878e35c7efa6bb335",
}
TOTALS = {"food": Decimal("54.14"), "transport": Decimal("37.05"), "rent": Decimal("950.00"), "fun": Decimal("45.00")}
LARGEST = "rent"


MAX_INPUT_BYTES = 1 << 20  # every pristine input is far smaller: a file this large there was rewritten


def _altered(path, digest):
    """True when ``path`` exists but is not a regular file holding the pristine bytes (sha256 ``digest``)."""
    if not os.path.lexists(path):
        return False
    try:
        if not path.is_file() or path.stat().st_size > MAX_INPUT_BYTES:
            return True
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest() != digest
    except OSError:
        return True


def inputs_tampered(ws):
    """True when an input file the task gave is still in the workspace with other bytes than the pristine task's."""
    return any(_altered(ws / rel, digest) for rel, digest in PRISTINE_SHA256.items())


def grade(transcript, workspace_path):
    ws = Path(workspace_path)
    scores = {"valid_json": 0.0, "totals": 0.0, "largest": 0.0}
    if inputs_tampered(ws):
        return scores
    try:
        data = json.loads((ws / "by_category.json").read_text(encoding="utf-8"))
    except Exception:
        return scores
    if not isinstance(data, dict):
        return scores
    scores["valid_json"] = 1.0
    got = data.get("totals")
    if isinstance(got, dict) and set(got) == set(TOTALS):
        try:
            if all(abs(Decimal(str(got[k])) - TOTALS[k]) < Decimal("0.005") for k in TOTALS):
                scores["totals"] = 1.0
        except Exception:
            pass
    if data.get("largest") == LARGEST:
        scores["largest"] = 1.0
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
