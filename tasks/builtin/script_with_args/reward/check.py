"""script_with_args: report.json is tools/report.py's JSON report of the top 3 entries of data/metrics.csv.

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
    "data/metrics.csv": "03bec1b332051584e0b9d18d5b663c40ac678c2e4d75930ef479f8aa96b1af63",
    "tools/report.py": "3b7ed4cdf1a326e5a6b4dab33f03497fc11a3f17f311282ecefb170a9a2286d4",
}
TOP3 = [{"name": "throughput", "value": 1520.0}, {"name": "latency_p99", "value": 380.2},
        {"name": "memory", "value": 71.9}]
COUNT = 7  # rows of the pristine metrics CSV


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
    scores = {"valid_json": 0.0, "top3": 0.0, "count": 0.0}
    if inputs_tampered(ws):
        return scores
    try:
        got = json.loads((ws / "report.json").read_text(encoding="utf-8"))
    except Exception:
        return scores
    if not isinstance(got, dict):
        return scores
    scores["valid_json"] = 1.0
    if got.get("top") == TOP3:
        scores["top3"] = 1.0
    if got.get("count") == COUNT:
        scores["count"] = 1.0
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
