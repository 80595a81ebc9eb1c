"""csv_filter_sort: output/engineering.csv holds the Engineering rows of employees.csv, by salary desc, name asc.

The expected answer is a constant, computed once from the pristine task; the workspace is read only for the
agent's outputs. An input file that is still in the workspace but no longer holds its pristine bytes
(sha256 below) means the inputs were rewritten: every sub-score is then 0.
"""

import csv
import hashlib
import json
import os
import sys
from pathlib import Path

PRISTINE_SHA256 = {
    "employees.csv": "c925eeffbf28f822d8647e08625b9c945c1e39988ecd2e7d832a56fcb23b31b8",
}
HEADER = ["name", "dept", "salary"]
ROWS = [["Ivan Petrov", "Engineering", "112000"], ["Chloe Park", "Engineering", "105000"],
        ["Ana Lima", "Engineering", "98000"], ["Eli Novak", "Engineering", "98000"],
        ["Gus Moreau", "Engineering", "87000"]]


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


def _read(p):
    try:
        with p.open(newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
        return rows if rows else None
    except Exception:
        return None


def grade(transcript, workspace_path):
    ws = Path(workspace_path)
    scores = {"header": 0.0, "right_rows": 0.0, "order": 0.0}
    if inputs_tampered(ws):
        return scores
    out = _read(ws / "output" / "engineering.csv")
    if out is None:
        return scores
    if out[0] == HEADER:
        scores["header"] = 1.0
    got = [r for r in out[1:] if r]
    if sorted(got) == sorted(ROWS):
        scores["right_rows"] = 1.0
        if got == ROWS:
            scores["order"] = 1.0
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
