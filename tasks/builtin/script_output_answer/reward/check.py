import json
import os
import re
import sys
import zlib
from pathlib import Path


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
    final = read_final_message()
    if not final or not final.strip():
        return scores
    try:
        expected = "%08x" % (zlib.adler32((ws / "data" / "payload.txt").read_bytes()) & 0xFFFFFFFF)
    except Exception:
        return scores
    tokens = {t.lower() for t in re.findall(r"(?<![0-9A-Za-z])[0-9A-Fa-f]{8}(?![0-9A-Za-z])", final)}
    if tokens == {expected}:
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
