"""log_first_error_answer: the final answer gives the time and component of server.log's first ERROR entry.

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
    "server.log": "3e7fd34332fc30a5c41ded8721f26d3ecde3c00a32e0de075542dab21f70e6be",
}
WHEN = "09:17:05"  # the first [ERROR] entry of the pristine server.log ...
COMPONENT = "db"   # ... and the component that logged it


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


def read_final_message():
    """The agent's final answer from the verifier payload; None when missing or unreadable."""
    path = os.environ.get("OPENCLAW_REWARD_PAYLOAD")
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except Exception:
        return None
    msg = data.get("final_message") if isinstance(data, dict) else None
    return msg if isinstance(msg, str) else None


def grade(transcript, workspace_path):
    ws = Path(workspace_path)
    scores = {"time_correct": 0.0, "component_correct": 0.0}
    if inputs_tampered(ws):
        return scores
    final = read_final_message()
    if not final or not final.strip():
        return scores
    times = set(re.findall(r"\b\d\d:\d\d:\d\d\b", final))
    if times == {WHEN}:
        scores["time_correct"] = 1.0
    if re.search(r"\b" + re.escape(COMPONENT) + r"\b", final, re.I):
        scores["component_correct"] = 1.0
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
