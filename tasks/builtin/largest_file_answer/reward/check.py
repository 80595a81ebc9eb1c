import json
import os
import re
import sys
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
    scores = {"names_largest": 0.0, "no_other_candidates": 0.0}
    final = read_final_message()
    if not final or not final.strip():
        return scores
    try:
        files = [p for p in (ws / "data").rglob("*") if p.is_file()]
        largest = max(files, key=lambda p: p.stat().st_size)
    except Exception:
        return scores
    rel = largest.relative_to(ws).as_posix()
    if rel in final or re.search(r"(?<![\w/.-])" + re.escape(largest.name) + r"(?![\w.-])", final):
        scores["names_largest"] = 1.0
        others = [p.name for p in files if p != largest]
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
