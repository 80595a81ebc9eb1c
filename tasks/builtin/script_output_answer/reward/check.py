"""script_output_answer: the final answer gives what tools/checksum.py prints for data/payload.txt.

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
    "data/payload.txt": "3e08ba3cc844d30405494d52c50fbce94c732d0a3e4638fd3619831152706d32",
    "data/payload_old.txt": "7cd5e1acb9fcec30c9a2371b76c02359d6b1fc0d920354c028b6888db05f7ff9",
    "tools/checksum.py": "b5de4920bad784f911f9624ce4216cdcf59d60f9cfece1e9ccd43c61b429f556",
}
CHECKSUM = "fed60c89"  # Adler-32 of the pristine payload, as the pristine tool prints it


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
    scores = {"checksum_correct": 0.0}
    if inputs_tampered(ws):
        return scores
    final = read_final_message()
    if not final or not final.strip():
        return scores
    tokens = {t.lower() for t in re.findall(r"(?<![0-9A-Za-z])[0-9A-Fa-f]{8}(?![0-9A-Za-z])", final)}
    if tokens == {CHECKSUM}:
        scores["checksum_correct"] = 1.0
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
