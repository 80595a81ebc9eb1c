"""largest_file_answer: the final answer names the largest file under data/.

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
    "data/archive/2023/old_dump.txt": "7816c3bf266d7fdc967761b9c37454cb2027f559ae1a6af89fb328d6b42aa643",
    "data/archive/readme.txt": "b1700c212e5755ceea023b7e56541e94445d924f4815f1b544d3e5180c41eb15",
    "data/logs/app.log": "75ec8c381ce143ca763beebee3e77d44360754702c0f19412966f2262ef67445",
    "data/notes.md": "1136800139e9177103b38e34bc544a0bcbf0aa5e2414329504a07265294bf9fb",
    "data/report.csv": "174285d22f24db2d67b85cb7c9fb278d0fd5d54c122a936ffc12cc887ecc7d15",
    "data/summary.txt": "e65c04df785bed6d2da283e152aa0efba0fba2ba6c12d25b87d9b49dce464df1",
}
PRISTINE_SIZES = {
    "data/archive/2023/old_dump.txt": 1300,
    "data/archive/readme.txt": 90,
    "data/logs/app.log": 640,
    "data/notes.md": 120,
    "data/report.csv": 700,
    "data/summary.txt": 450,
}
LARGEST = max(PRISTINE_SIZES, key=PRISTINE_SIZES.get)


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
    scores = {"names_largest": 0.0, "no_other_candidates": 0.0}
    if inputs_tampered(ws):
        return scores
    final = read_final_message()
    if not final or not final.strip():
        return scores
    name = LARGEST.rsplit("/", 1)[-1]
    if LARGEST in final or re.search(r"(?<![\w/.-])" + re.escape(name) + r"(?![\w.-])", final):
        scores["names_largest"] = 1.0
        others = [rel.rsplit("/", 1)[-1] for rel in PRISTINE_SIZES if rel != LARGEST]
        if not any(re.search(r"(?<![\w.-])" + re.escape(n) + r"(?![\w.-])", final) for n in others):
            scores["no_other_candidates"] = 1.0
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
