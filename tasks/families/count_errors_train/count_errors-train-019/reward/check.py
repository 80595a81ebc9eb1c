"""count_errors: errors.txt holds the number of app.log lines containing ERROR.

The expected count is a constant written by the generator; the workspace is read only for errors.txt and to
compare app.log with its pristine sha256 (an app.log rewritten in place scores 0 on both halves).
"""

import hashlib
import json
import os
import sys
from pathlib import Path

EXPECTED = 1
PRISTINE_SHA256 = {"app.log": "b0ed4d86f7269805a83f35322eb4225e30b792b325ea99df0b320873c64deaba"}
MAX_INPUT_BYTES = 1 << 20


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


def grade(workspace):
    path = Path(workspace) / "errors.txt"
    scores = {"file_exists": 0.0, "count_exact": 0.0}
    if any(_altered(Path(workspace) / rel, digest) for rel, digest in PRISTINE_SHA256.items()):
        return scores
    if path.is_file():
        scores["file_exists"] = 1.0
        try:
            text = path.read_text(encoding="utf-8").strip()
        except Exception:
            text = None
        if text == str(EXPECTED):
            scores["count_exact"] = 1.0
    return scores


if __name__ == "__main__":
    print(json.dumps(grade(sys.argv[1] if len(sys.argv) > 1 else ".")))
