"""sort_unique_lines: sorted_names.txt lists the distinct trimmed names of names.txt, case-insensitively sorted.

The expected answer is a constant, computed once from the pristine task; the workspace is read only for the
agent's outputs. An input file that is still in the workspace but no longer holds its pristine bytes
(sha256 below) means the inputs were rewritten: every sub-score is then 0.
"""

import hashlib
import json
import os
import sys
from pathlib import Path

PRISTINE_SHA256 = {
    "names.txt": "3b272aacb2d3c3cb038871213ee1354f1e1a4606adacfd4782cc00f8471d634c",
}
NAMES = ["alice", "Bob", "bob", "Carol", "carol", "Dave", "Eve", "Frank", "zoe"]  # in the expected order


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
    scores = {"right_names": 0.0, "no_duplicates": 0.0, "order": 0.0}
    if inputs_tampered(ws):
        return scores
    try:
        got = (ws / "sorted_names.txt").read_text(encoding="utf-8").splitlines()
    except Exception:
        return scores
    got = [g for g in got if g.strip()]
    if set(got) == set(NAMES):
        scores["right_names"] = 1.0
    if got and len(got) == len(set(got)):
        scores["no_duplicates"] = 1.0
    if got == NAMES:
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
