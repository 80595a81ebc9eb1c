"""jsonl_event_stats: stats.json summarises events.jsonl (totals, users, types, first and last ts).

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
    "events.jsonl": "e6c4cde8bdd73d1a87e71652052d0ea9ca5498b2218a6bcb5f6e162ebcf6c4fd",
}
EXPECTED = {"total_events": 10, "unique_users": 4, "events_by_type": {"login": 3, "view": 4, "purchase": 2, "logout": 1},
            "first_ts": "2024-05-31T23:59:59Z", "last_ts": "2024-06-03T07:50:00Z"}


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
    keys = ["total_events", "unique_users", "events_by_type", "first_ts", "last_ts"]
    scores = {k: 0.0 for k in keys}
    if inputs_tampered(ws):
        return scores
    try:
        got = json.loads((ws / "stats.json").read_text(encoding="utf-8"))
    except Exception:
        return scores
    if not isinstance(got, dict):
        return scores
    for k in keys:
        if k in got and got[k] == EXPECTED[k] and type(got[k]) is type(EXPECTED[k]):
            scores[k] = 1.0
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
