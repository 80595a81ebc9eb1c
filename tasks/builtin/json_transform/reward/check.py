"""json_transform: active_users.json lists the active users of users.json as {id, full_name}, by id.

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
    "users.json": "7db37dd493c835b3a561b547173e8e633f8fe43d0d89c5c77b98f0fea8ef52f0",
}
ACTIVE = [{"id": 1, "full_name": "Ada Byron"}, {"id": 4, "full_name": "Omar Haddad"},
          {"id": 7, "full_name": "Mara Quinn"}, {"id": 11, "full_name": "Ines Duarte"}]


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
    scores = {"valid_json_array": 0.0, "right_users": 0.0, "shape": 0.0, "sorted": 0.0}
    if inputs_tampered(ws):
        return scores
    try:
        data = json.loads((ws / "active_users.json").read_text(encoding="utf-8"))
    except Exception:
        return scores
    if not isinstance(data, list) or not all(isinstance(o, dict) for o in data):
        return scores
    scores["valid_json_array"] = 1.0
    if sorted(data, key=lambda o: str(o.get("id"))) == sorted(ACTIVE, key=lambda o: str(o["id"])):
        scores["right_users"] = 1.0
    if data and all(set(o) == {"id", "full_name"} for o in data):
        scores["shape"] = 1.0
    if data == ACTIVE:
        scores["sorted"] = 1.0
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
