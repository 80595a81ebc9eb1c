"""extract_emails: emails.txt lists the distinct addresses of contacts.txt, lowercased and sorted.

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
    "contacts.txt": "16e2dd55f56a25cebc760c933e452c987231899cfc08b574201bfccd4eacb8de",
}
EMAILS = ["j.doe@example.org", "priya.raman@example.com", "sales@example.com", "support+tickets@help.example.net",
          "zed_99@mail.example.io"]


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
    scores = {"all_found": 0.0, "exact_list": 0.0}
    if inputs_tampered(ws):
        return scores
    try:
        got = [ln.strip() for ln in (ws / "emails.txt").read_text(encoding="utf-8").splitlines() if ln.strip()]
    except Exception:
        return scores
    if {g.lower() for g in got} == set(EMAILS):
        scores["all_found"] = 1.0
    if got == EMAILS:
        scores["exact_list"] = 1.0
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
