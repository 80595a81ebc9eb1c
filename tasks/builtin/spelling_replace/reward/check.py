"""spelling_replace: notes_us.md is notes.md with colour/favourite/organis in American spelling; notes.md untouched.

The expected answer is a constant, computed once from the pristine task; the workspace is read only for the
agent's outputs. An input file that is still in the workspace but no longer holds its pristine bytes
(sha256 below) means the inputs were rewritten: every sub-score is then 0.
"""

import hashlib
import json
import os
import re
import sys
from pathlib import Path

PRISTINE_SHA256 = {
    "notes.md": "26c974da9ca1c19585ce27a056266af52f8ee649bbf6663f514430c5d53dc0f0",
}
US_TEXT = ("# Color notes\n\nMy favorite color is teal. Color choices matter when we organize a room.\n"
           "A colorful wall can be nice, but Favorite things change.\n"
           "We will organize the colors next week; the Organizer has a list.\nUnrelated words stay: honour, labour.\n")


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
    scores = {"no_british_left": 0.0, "exact_copy": 0.0}
    if inputs_tampered(ws):
        return scores
    try:
        got = (ws / "notes_us.md").read_text(encoding="utf-8")
    except Exception:
        return scores
    if not re.search(r"colour|favourite|organis", got, re.I):
        scores["no_british_left"] = 1.0
    if got.rstrip("\n") == US_TEXT.rstrip("\n"):
        scores["exact_copy"] = 1.0
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
