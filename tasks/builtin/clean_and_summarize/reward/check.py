"""clean_and_summarize: clean.csv keeps the numeric readings; summary.json summarises them.

The expected answer is a constant, computed once from the pristine task; the workspace is read only for the
agent's outputs. An input file that is still in the workspace but no longer holds its pristine bytes
(sha256 below) means the inputs were rewritten: every sub-score is then 0.
"""

import csv
import hashlib
import json
import math
import os
import sys
from pathlib import Path

PRISTINE_SHA256 = {
    "readings.csv": "72e72c1bb815df55128fa8f058b41c5030f14950771ca62c429605d2549eacce",
}
# The rows of readings.csv whose value is a finite number, in file order, and their summary.
CLEAN_ROWS = [("s1", 20.5), ("s1", 21.0), ("s2", 19.75), ("s1", 20.0), ("s2", 18.25), ("s3", 23.5), ("s1", -1.5),
              ("s2", 19.0)]
SUMMARY = {"count": 8, "mean": 17.562, "min": -1.5, "max": 23.5, "by_sensor": {"s1": 4, "s2": 3, "s3": 1}}


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


def _num(s):
    try:
        v = float(s)
        return v if math.isfinite(v) else None
    except Exception:
        return None


def grade(transcript, workspace_path):
    ws = Path(workspace_path)
    keys = ["count", "mean", "min", "max", "by_sensor"]
    scores = {"clean_csv": 0.0}
    scores.update({"summary_" + k: 0.0 for k in keys})
    if inputs_tampered(ws):
        return scores
    try:
        with (ws / "clean.csv").open(newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            header = next(reader)
            got = [(r[0], _num(r[1])) for r in reader if r]
        if header == ["sensor", "value"] and got == CLEAN_ROWS:
            scores["clean_csv"] = 1.0
    except Exception:
        pass
    try:
        summary = json.loads((ws / "summary.json").read_text(encoding="utf-8"))
    except Exception:
        return scores
    if not isinstance(summary, dict):
        return scores
    for k in keys:
        got_v = summary.get(k)
        if k in ("mean", "min", "max"):
            ok = isinstance(got_v, (int, float)) and not isinstance(got_v, bool) and abs(got_v - SUMMARY[k]) < 1e-6
        else:
            ok = got_v == SUMMARY[k]
        if ok:
            scores["summary_" + k] = 1.0
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
