"""csv_to_json: inventory.json is inventory.csv as a typed JSON array, in order.

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
    "inventory.csv": "58baf5ea18bd58229161898cf3b7a93cbd307bf64138c88d406d65bb269e1579",
}
# (sku, name, qty, price) of each row of the pristine inventory.csv, in order.
ROWS = [("A-100", "USB cable", 25, 4.99), ("A-101", "Charger, 20W", 8, 17.5), ("B-200", "Laptop stand", 3, 39.0),
        ("B-201", "Mouse pad", 40, 6.25), ("C-300", "HDMI adapter", 0, 12.75)]


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


def _typed(o):
    return (set(o) == {"sku", "name", "qty", "price"} and isinstance(o["sku"], str)
            and isinstance(o["name"], str) and type(o["qty"]) is int
            and type(o["price"]) in (int, float))


def grade(transcript, workspace_path):
    ws = Path(workspace_path)
    scores = {"valid_json_array": 0.0, "row_count": 0.0, "types": 0.0, "values": 0.0}
    if inputs_tampered(ws):
        return scores
    try:
        data = json.loads((ws / "inventory.json").read_text(encoding="utf-8"))
    except Exception:
        return scores
    if not isinstance(data, list) or not all(isinstance(o, dict) for o in data):
        return scores
    scores["valid_json_array"] = 1.0
    if len(data) == len(ROWS):
        scores["row_count"] = 1.0
    if data and all(_typed(o) for o in data):
        scores["types"] = 1.0
    try:
        got = [(o.get("sku"), o.get("name"), o.get("qty"), float(o.get("price"))) for o in data]
        if got == ROWS:
            scores["values"] = 1.0
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
