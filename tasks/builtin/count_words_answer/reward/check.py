"""count_words_answer: the final answer gives the word count of essay.txt (as `wc -w` counts).

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
    "essay.txt": "2c8ce8115ef931dde30c490f509847d6d998bca933b5bfdf0af03e31824a8b90",
}
WORDS = 57  # maximal runs of non-whitespace in the pristine essay.txt


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


def numbers_in(text):
    """Integers written in text (thousands separators allowed), in order."""
    out = []
    for m in re.finditer(r"(?<![\w.])-?\d{1,3}(?:,\d{3})+(?![\d])|(?<![\w.])-?\d+(?:\.\d+)?(?![\w])", text):
        s = m.group(0).replace(",", "")
        try:
            out.append(float(s))
        except ValueError:
            pass
    return out


def grade(transcript, workspace_path):
    ws = Path(workspace_path)
    scores = {"count_correct": 0.0}
    if inputs_tampered(ws):
        return scores
    final = read_final_message()
    if not final or not final.strip():
        return scores
    nums = numbers_in(final)
    near_misses = [n for n in nums if n != WORDS and 0.5 * WORDS <= n <= 1.5 * WORDS]
    if WORDS in nums and not near_misses:
        scores["count_correct"] = 1.0
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
