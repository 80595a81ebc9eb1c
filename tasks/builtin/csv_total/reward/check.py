"""csv_total: total.txt holds the revenue of sales.csv (sum of qty * unit_price), two decimals.

The expected answer is a constant, computed once from the pristine task; the workspace is read only for the
agent's outputs. An input file that is still in the workspace but no longer holds its pristine bytes
(sha256 below) means the inputs were rewritten: every sub-score is then 0.
"""

import hashlib
import json
import os
import re
import sys
from decimal import Decimal
from pathlib import Path

PRISTINE_SHA256 = {
    "sales.csv": "38d24f8fd5d773c123e5e8ab0c31f9baaa0cb9ccb98ef60ef2c29736d2345ab1",
}
TOTAL = Decimal("100.14")  # sum of qty * unit_price over the pristine sales.csv, exactly


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
    scores = {"format": 0.0, "value": 0.0}
    if inputs_tampered(ws):
        return scores
    try:
        text = (ws / "total.txt").read_text(encoding="utf-8").strip()
    except Exception:
        return scores
    if re.fullmatch(r"\d+\.\d{2}", text):
        scores["format"] = 1.0
        if Decimal(text) == TOTAL:
            scores["value"] = 1.0
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
