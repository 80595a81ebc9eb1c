"""log_level_counts: levels.json counts app.log's lines per level; errors.txt lists its ERROR messages.

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
    "app.log": "35427b4622087d49418c9be346c1bea614a52d03925ee1c7b125a9a649afab45",
}
LEVELS = {"INFO": 4, "DEBUG": 1, "WARNING": 2, "ERROR": 3}
ERRORS = ["payment gateway timeout", "could not write audit log", "payment gateway timeout"]


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
    scores = {"levels": 0.0, "errors": 0.0}
    if inputs_tampered(ws):
        return scores
    try:
        if json.loads((ws / "levels.json").read_text(encoding="utf-8")) == LEVELS:
            scores["levels"] = 1.0
    except Exception:
        pass
    try:
        got = [ln.rstrip() for ln in (ws / "errors.txt").read_text(encoding="utf-8").splitlines() if ln.strip()]
        if got == ERRORS:
            scores["errors"] = 1.0
    except Exception:
        pass
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
