"""run_script_save_output: primes_output.txt holds the exact standard output of tools/primes.py.

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
    "tools/primes.py": "488bac913d89947859c811771b22057e6988ebe6b2bafca3ad7f7d2ef0d8c592",
}


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


def _expected(limit=120):
    """What the pristine tools/primes.py prints with no arguments: the primes below 120, ten a line, then a count."""
    ps = [n for n in range(2, limit) if all(n % d for d in range(2, int(n ** 0.5) + 1))]
    lines = [" ".join(str(p) for p in ps[k:k + 10]) for k in range(0, len(ps), 10)]
    return "\n".join(lines + ["count: %d" % len(ps)]) + "\n"


def grade(transcript, workspace_path):
    ws = Path(workspace_path)
    scores = {"file_exists": 0.0, "exact_output": 0.0}
    if inputs_tampered(ws):
        return scores
    p = ws / "primes_output.txt"
    if not p.is_file():
        return scores
    scores["file_exists"] = 1.0
    try:
        if p.read_text(encoding="utf-8").rstrip("\n") == _expected().rstrip("\n"):
            scores["exact_output"] = 1.0
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
